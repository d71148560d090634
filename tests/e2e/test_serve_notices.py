"""What the engine says about a request's input (core.events.Notice: an audio clip cut to what the model
hears, an image sent to the demo) reaches the client: `serve` puts it in the gemma_chat object (streamed and
whole), and `--connect` (core.engine.remote) turns it back into the Notice the chat and `generate` show.
Both used to drop it. In-process on the scripted fake; the real clip, as processes, in test_serve_audio.py."""

from __future__ import annotations

import contextlib
import json

import httpx2 as httpx
from support.fake_engine import FakeEngine
from support.fake_engine import PairingSpec as FakeSpec

from core.engine.remote import RemoteEngine
from core.events import Notice, PrefillDone, TokenEvent
from core.frontends.server import BackgroundServer, ServerConfig, create_app
from core.settings import GenerationSettings

CUT = "Audio file 'clip.wav' is 45.0 s long; the model hears only its first 30 s"


@contextlib.contextmanager
def served(*notices: str):
    engine = FakeEngine(replies=["a tone"], notices=notices)
    engine.load(FakeSpec("fake", "t", "d"), lambda e: None).result(timeout=5)
    try:
        with BackgroundServer(create_app(engine, ServerConfig(model_id="m"))) as url:
            yield url
    finally:
        engine.close()


def request(stream: bool) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "hear this"}], "stream": stream}


def test_a_notice_rides_in_the_gemma_chat_object_before_the_reply():
    with served(CUT) as url:
        objects = []
        with httpx.stream("POST", url + "/v1/chat/completions", json=request(True), timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    objects.append(json.loads(line[6:]).get("gemma_chat") or {})
        with_notice = [i for i, o in enumerate(objects) if "notices" in o]
        first_token = min(i for i, o in enumerate(objects) if o.get("tokens"))
        assert [objects[i]["notices"] for i in with_notice] == [[CUT]] and with_notice[0] <= first_token
        whole = httpx.post(url + "/v1/chat/completions", json=request(False), timeout=30).json()
        assert whole["gemma_chat"]["notices"] == [CUT] and whole["choices"][0]["message"]["content"] == "a tone"
    with served() as url:  # none said, none sent
        whole = httpx.post(url + "/v1/chat/completions", json=request(False), timeout=30).json()
        assert "notices" not in whole["gemma_chat"]


def test_a_turn_refused_after_its_notices_is_still_a_400():
    # the status waits for the prefill or the refusal: a notice alone must not make it a 200 with an error inside
    engine = FakeEngine(notices=(CUT,), refuse_after_notices="the image cannot be encoded")
    engine.load(FakeSpec("fake", "t", "d"), lambda e: None).result(timeout=5)
    try:
        with BackgroundServer(create_app(engine, ServerConfig(model_id="m"))) as url:
            for stream in (True, False):
                r = httpx.post(url + "/v1/chat/completions", json=request(stream), timeout=30)
                assert r.status_code == 400 and r.json()["error"]["message"] == "the image cannot be encoded"
    finally:
        engine.close()


def test_connect_turns_it_back_into_a_notice_with_no_terminal_escapes():
    with served(CUT, "\x1b[2Jcleared\x07 screen") as url:
        engine = RemoteEngine(url)
        try:
            engine.load(None, None).result(timeout=30)
            events: list = []
            done = engine.chat([{"role": "user", "content": "hear this"}], GenerationSettings(), events.append)
            assert done.result(timeout=30).error is None
        finally:
            engine.close()
    notices = [e.text for e in events if isinstance(e, Notice)]
    assert notices == [CUT, "[2Jcleared  screen"]
    kinds = [type(e) for e in events if isinstance(e, (Notice, PrefillDone, TokenEvent))]
    assert kinds.index(PrefillDone) > max(i for i, k in enumerate(kinds) if k is Notice)  # said before the reply
