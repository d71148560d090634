"""`gemma-chat generate --audio` end to end: a real process on the pack's audio target (transformers'
greedy ids, the 30 s note on stderr, JSON on stdout), two clips, --messages audio items, and the refusals
(pairings without audio, bad files, --connect) before any model loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import main

PACK = Path("tests/data/pack")
MODELS = PACK / "models"
INPUTS = PACK / "references" / "audio" / "inputs"
REF = json.loads((PACK / "references" / "audio" / "e-style-audio.json").read_text())["prompts"]
AUDIO_PAIR = ["--model", str(MODELS / "e-style-audio-target"), "--drafter", str(MODELS / "e-style-assistant")]
GREEDY = ["--dtype", "float32", "--ignore-eos", "--max-tokens", "32", "--json"]


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_a_31s_clip_in_a_real_process():
    out = subprocess.run(
        [sys.executable, "-m", "app", "generate", *AUDIO_PAIR, *GREEDY, "--block-size", "3"]
        + ["--audio", str(INPUTS / "long_31s.pcm16.flac"), "--prompt", "What is this sound?"],
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ,
    )
    assert out.returncode == 0, out.stderr
    lines = _json_lines(out.stdout)  # every stdout line is JSON: the note went to stderr
    assert [t["id"] for t in lines[:-1]] == REF["long_31s"]["hf"]["greedy_ids"]
    stats = lines[-1]["stats"]
    assert stats["prompt_tokens"] == REF["long_31s"]["prompt_len"] and stats["drafted"] > 0
    assert "note: Audio file 'long_31s.pcm16.flac' is 31.0 s long; the model hears only its first 30 s" in out.stderr


def test_two_clips_and_a_messages_file(tmp_path, capsys):
    ref = REF["two_clips"]
    clips = ["--audio", str(INPUTS / "noise_0p25s.pcm16.wav"), "--audio", str(INPUTS / "sine_1s.pcm16.wav")]
    assert main(["generate", *AUDIO_PAIR, *GREEDY, *clips, "--prompt", "What are these two sounds?"]) == 0
    assert [t["id"] for t in _json_lines(capsys.readouterr().out)[:-1]] == ref["hf"]["greedy_ids"]
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "audio", "path": str(INPUTS / "noise_0p25s.pcm16.wav")},
                {"type": "audio", "path": str(INPUTS / "sine_1s.f32.wav")},  # the same samples as float WAV
                {"type": "text", "text": "What are these two sounds?"},
            ],
        }
    ]
    path = tmp_path / "messages.json"
    path.write_text(json.dumps(messages))
    assert main(["generate", *AUDIO_PAIR, *GREEDY, "--no-draft", "--messages", str(path)]) == 0
    assert [t["id"] for t in _json_lines(capsys.readouterr().out)[:-1]] == ref["hf"]["greedy_ids"]


@pytest.mark.parametrize(
    "pairing,name",
    [
        (["--model", str(MODELS / "moe-style-target")], "moe-style-target"),  # 26B-A4B-like
        (["--model", str(MODELS / "dense-style-target")], "dense-style-target"),  # 31B-like
        (["--demo"], "demo (tiny trained model)"),
    ],
)
def test_pairings_without_audio_are_refused_before_loading(pairing, name, capsys, monkeypatch):
    import core.engine.local

    loads = []
    monkeypatch.setattr(core.engine.local.Engine, "load", lambda *a, **k: loads.append(a))
    rc = main(["generate", *pairing, "--audio", str(INPUTS / "sine_1s.pcm16.wav"), "--prompt", "hi"])
    assert rc == 1 and loads == []
    err = capsys.readouterr().err
    assert err == f"error: {name} does not take audio: Gemma 4 E2B, E4B and 12B do (26B-A4B and 31B do not)\n"


def test_bad_clips_are_refused_before_loading(tmp_path, capsys, monkeypatch):
    import core.engine.local

    monkeypatch.setattr(core.engine.local.Engine, "load", lambda *a, **k: pytest.fail("loaded a model for a bad clip"))
    notes = tmp_path / "notes.mp3"
    notes.write_text("not a recording\n" * 40)
    cases = [
        (str(notes), "Audio file 'notes.mp3' is not an audio file gemma-chat can read (WAV, FLAC, OGG/Vorbis, MP3)."),
        (str(tmp_path / "gone.wav"), f"Audio file not found: {tmp_path / 'gone.wav'}"),
        (str(tmp_path), f"{tmp_path} is a folder, not an audio file."),
    ]
    for path, message in cases:
        assert main(["generate", *AUDIO_PAIR, "--audio", path, "--prompt", "hi", "--json"]) == 1
        assert _json_lines(capsys.readouterr().out) == [{"error": message}]
    assert main(["generate", *AUDIO_PAIR, "--audio", str(notes), "--no-template", "--prompt", "hi"]) == 1
    assert "--no-template takes --prompt text only (no --messages, --image or --audio)" in capsys.readouterr().err
    # over --connect too: the clip is checked here before any server is asked
    assert main(["generate", "--connect", "http://127.0.0.1:9", "--audio", str(notes), "--prompt", "hi"]) == 1
    assert "Audio file 'notes.mp3' is not an audio file gemma-chat can read" in capsys.readouterr().err
