"""Audio through `gemma-chat serve`: OpenAI `input_audio` parts (and vLLM's `audio_url`, `file:` on
loopback only), driven by the official `openai` client against a real `serve` process on the pack's
audio target (the greedy ids transformers computed for the same clip), `generate --connect` sending
the clip as input_audio to it, and the request rules checked in-process on the scripted fake (a
clip for a pairing without audio, bad base64, an unknown format, too many clips, file: URLs).
The demo's refusal, as a process, is in test_serve_process.py."""

from __future__ import annotations

import base64
import contextlib
import json
import subprocess
from pathlib import Path

import httpx2 as httpx
import pytest
from serve_process import GEMMA_CHAT, ServeProcess
from support.fake_engine import FakeEngine
from support.fake_engine import PairingSpec as FakeSpec

from core.frontends.server import BackgroundServer, ServerConfig, create_app
from core.limits import MAX_AUDIO_PER_PROMPT

openai = pytest.importorskip("openai")

PACK = Path(__file__).resolve().parents[1] / "data" / "pack"
MODELS = PACK / "models"
INPUTS = PACK / "references" / "audio" / "inputs"
SINE = INPUTS / "sine_1s.pcm16.wav"
REF = json.loads((PACK / "references" / "audio" / "e-style-audio.json").read_text())["prompts"]["sine_1s"]
QUESTION = REF["prompt_text"]  # "What is this sound?", after the clip
N_NEW = 32


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def input_audio(data: str, fmt: object = "wav") -> dict:
    return {"type": "input_audio", "input_audio": {"data": data, "format": fmt}}


def user(*parts: dict, text: str = QUESTION) -> list[dict]:
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


@pytest.fixture(scope="module")
def audio_server():
    args = ["--model", str(MODELS / "e-style-audio-target"), "--drafter", str(MODELS / "e-style-assistant")]
    with ServeProcess([*args, "--dtype", "float32"]) as s:
        yield s


def client(server: ServeProcess):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=300, max_retries=0)


def greedy(**kw: object) -> dict:
    return {"temperature": 0, "max_tokens": N_NEW, "extra_body": {"ignore_eos": True}, **kw}


# -- a real serve process on an audio checkpoint ---------------------------------------------------


def test_openai_client_input_audio_gives_transformers_greedy_ids(audio_server):
    reply = client(audio_server).chat.completions.create(model="x", messages=user(input_audio(b64(SINE))), **greedy())
    extension = reply.model_extra["gemma_chat"]
    assert [t["id"] for t in extension["tokens"]] == REF["hf"]["greedy_ids"]
    assert extension["stats"]["prompt_tokens"] == REF["prompt_len"]  # 25 soft tokens between boa and eoa
    assert extension["stats"]["drafted"] > 0  # the drafter ran on the reply
    assert reply.usage is not None and reply.usage.prompt_tokens == REF["prompt_len"]


def test_streamed_audio_url_file_on_loopback_gives_the_same_ids(audio_server):
    stream = client(audio_server).chat.completions.create(
        model="x",
        messages=user({"type": "audio_url", "audio_url": {"url": SINE.as_uri()}}),
        stream=True,
        **greedy(),
    )
    ids = [t["id"] for chunk in stream for t in (chunk.model_extra.get("gemma_chat") or {}).get("tokens", [])]
    assert ids == REF["hf"]["greedy_ids"]


def test_the_model_card_says_it_takes_audio(audio_server):
    [card] = httpx.get(audio_server.url + "/v1/models", timeout=30).json()["data"]
    assert card["gemma_chat"]["has_audio"] is True


def test_data_that_is_not_audio_is_an_openai_400(audio_server):
    with pytest.raises(openai.BadRequestError) as caught:
        client(audio_server).chat.completions.create(
            model="x", messages=user(input_audio(base64.b64encode(b"RIFF not really a wave" * 20).decode())), **greedy()
        )
    error = caught.value.body
    assert caught.value.status_code == 400 and error["type"] == "invalid_request_error"
    assert error["message"] == "The audio data is not an audio file gemma-chat can read (WAV, FLAC, OGG/Vorbis, MP3)."


def test_generate_connect_sends_the_clip_as_input_audio(audio_server):
    run = subprocess.run(
        [str(GEMMA_CHAT), "generate", "--connect", audio_server.url, "--audio", str(SINE)]
        + ["--prompt", QUESTION, "--ignore-eos", "--max-tokens", str(N_NEW), "--temp", "0", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.strip()]
    assert [t["id"] for t in lines if "id" in t] == REF["hf"]["greedy_ids"]


def test_a_clip_longer_than_the_model_hears_is_cut_and_generate_connect_says_so(audio_server, tmp_path):
    # the server's engine cuts it to its first 30 s and says so; that sentence was dropped on the way to
    # the client, so `generate --connect` (and the chat over --connect) never told the user
    import wave

    long_clip = tmp_path / "long.wav"
    with wave.open(str(long_clip), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\x00\x01" * (16000 * 31))
    run = subprocess.run(
        [str(GEMMA_CHAT), "generate", "--connect", audio_server.url, "--audio", str(long_clip)]
        + ["--prompt", QUESTION, "--max-tokens", "2", "--temp", "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert "note: The audio data is 31.0 s long; the model hears only its first 30 s" in run.stderr  # bytes: no name


# -- the request rules, in-process on the scripted fake -----------------------------------------------


@contextlib.contextmanager
def fake_server(**engine_kwargs: object):
    engine = FakeEngine(**engine_kwargs)
    name = "31B" if engine_kwargs.get("has_audio") is False else "fake"
    engine.load(FakeSpec(name, "t", "d"), lambda e: None).result(timeout=5)
    app = create_app(engine, ServerConfig(model_id="test-model"))
    try:
        with BackgroundServer(app) as url:
            yield engine, url
    finally:
        engine.close()


def post(url: str, messages: list[dict]) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", json={"model": "m", "messages": messages}, timeout=60)


def test_a_pairing_without_audio_refuses_before_the_engine_sees_it():
    with fake_server(has_audio=False) as (engine, url):
        r = post(url, user(input_audio(b64(SINE))))
        assert r.status_code == 400
        assert r.json()["error"] == {
            "message": "31B does not take audio: Gemma 4 E2B, E4B and 12B do (26B-A4B and 31B do not)",
            "type": "invalid_request_error",
            "param": "messages",
            "code": 400,
        }
        assert engine.chats == []
        assert post(url, [{"role": "user", "content": "text still works"}]).status_code == 200


def test_input_audio_reaches_the_engine_as_its_bytes():
    with fake_server() as (engine, url):
        assert post(url, user(input_audio(b64(SINE), "WAV"))).status_code == 200
        [messages, _] = engine.chats[-1]
        [clip, text] = messages[-1]["content"]
        assert clip == {"type": "audio", "audio": SINE.read_bytes()} and text["text"] == QUESTION


@pytest.mark.parametrize(
    ("part", "message"),
    [
        (input_audio("not base64!"), "input_audio.data is not valid base64"),
        (input_audio(""), "an input_audio part needs input_audio.data (the file, base64)"),
        ({"type": "input_audio", "input_audio": "abc"}, "an input_audio part needs input_audio.data"),
        (input_audio("UklGRg==", "aac"), "input_audio.format must be one of wav, mp3, flac, ogg, opus, aiff, got"),
        (input_audio("UklGRg==", 3), "input_audio.format must be one of"),
        ({"type": "audio_url", "audio_url": {"url": "https://example.com/a.wav"}}, "audio URLs must be data: or file:"),
        ({"type": "audio_url", "audio_url": {"url": "data:audio/wav,abc"}}, "audio data URLs must be base64"),
        ({"type": "audio_url", "audio_url": {}}, "an audio_url part needs audio_url.url"),
    ],
)
def test_bad_audio_parts_are_400s_that_say_why(part, message):
    with fake_server() as (engine, url):
        r = post(url, user(part))
        assert r.status_code == 400 and message in r.json()["error"]["message"], r.text
        assert engine.chats == []


def test_too_many_clips_and_file_urls_off_loopback_are_refused():
    with fake_server() as (engine, url):
        clip = input_audio("UklGRg==")
        r = post(url, user(*[clip] * (MAX_AUDIO_PER_PROMPT + 1)))
        assert r.status_code == 400
        assert r.json()["error"]["message"] == (
            f"the messages hold {MAX_AUDIO_PER_PROMPT + 1} audio clips; at most {MAX_AUDIO_PER_PROMPT} are taken"
            " in one request"
        )
        assert engine.chats == []
    engine = FakeEngine()
    engine.load(FakeSpec("fake", "t", "d"), lambda e: None).result(timeout=5)
    app = create_app(engine, ServerConfig(model_id="m", allow_file_urls=False))
    try:
        with BackgroundServer(app) as url:
            r = post(url, user({"type": "audio_url", "audio_url": {"url": SINE.as_uri()}}))
            assert r.status_code == 400
            assert r.json()["error"]["message"] == "file: audio URLs are refused on a server reachable from the network"
    finally:
        engine.close()


def test_the_client_side_input_audio_part(tmp_path):
    from core.engine.remote import RemoteError, input_audio_part, openai_messages

    flac = tmp_path / "a.FLAC"
    flac.write_bytes(b"fLaC....")
    assert input_audio_part({"type": "audio", "path": str(flac)}) == {
        "type": "input_audio",
        "input_audio": {"data": base64.b64encode(b"fLaC....").decode(), "format": "flac"},
    }
    assert input_audio_part({"type": "audio", "audio": b"ID3"})["input_audio"]["format"] == "wav"
    with pytest.raises(RemoteError, match="cannot read audio file"):
        input_audio_part({"type": "audio", "path": str(tmp_path / "gone.mp3")})
    with pytest.raises(RemoteError, match="not raw samples"):
        import numpy as np

        input_audio_part({"type": "audio", "audio": np.zeros(160), "sample_rate": 16000})
    [message] = openai_messages([{"role": "user", "content": [{"type": "audio", "path": str(flac)}]}], None)
    assert message["content"][0]["type"] == "input_audio"
