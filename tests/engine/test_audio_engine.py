"""Audio prompts through the engine (float32): greedy ids equal transformers' on every pack audio prompt,
drafter off and on; the last logits; several clips in one prompt; chunked prefill through audio spans;
cache reuse across audio turns (encode once, a changed clip re-prefilled); the causal audio mask; the
12B embedder's prompts; refusals on pairings without audio."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from safetensors.numpy import load_file

import core.decode.spec as spec_mod
from core.decode import prompt as prompt_mod
from core.engine.contract import PairingSpec
from core.engine.local import Engine
from core.events import Notice, PrefillDone, TurnDone
from core.model.audio import load_audio
from core.model.audio_input import AudioSpec, prepare_audio
from core.model.target import load_target
from core.settings import GenerationSettings

PACK = Path(__file__).parents[1] / "data" / "pack"
MODELS = PACK / "models"
AUDIO = PACK / "references" / "audio"
INPUTS = AUDIO / "inputs"
E_TARGET, E_DRAFTER = MODELS / "e-style-audio-target", MODELS / "e-style-assistant"
U_TARGET, U_DRAFTER = MODELS / "unified-style-target", MODELS / "unified-style-assistant"
E_REF = json.loads((AUDIO / "e-style-audio.json").read_text())["prompts"]
U_REF = json.loads((AUDIO / "unified-style-audio.json").read_text())["prompts"]
# the pack's files, as tests/data keeps them (the chirp's float WAV holds the same samples as its PCM16 one)
LOCAL = {"chirp_3p7s.f32.wav": "chirp_3p7s.pcm16.wav", "long_31s.pcm16.wav": "long_31s.pcm16.flac"}
N_NEW = 32


def _messages(ref: dict) -> list[dict]:
    """The reference messages with each audio item pointing at its file."""
    files = iter(INPUTS / LOCAL.get(Path(f).name, Path(f).name) for f in ref["audio_files"])
    content = [
        {"type": "audio", "path": str(next(files))} if item["type"] == "audio" else item
        for item in ref["messages"][0]["content"]
    ]
    return [{"role": "user", "content": content}]


def _greedy(**kw) -> GenerationSettings:
    return GenerationSettings(**{"temperature": 0.0, "max_tokens": N_NEW, "ignore_eos": True, **kw})


def _chat(eng: Engine, messages, settings) -> tuple[TurnDone, list]:
    events: list = []
    done = eng.chat(messages, settings, events.append).result(timeout=300)
    assert done.error is None, done.error
    return done, events


@pytest.fixture(scope="module")
def e_engine():
    eng = Engine()
    info = eng.load(PairingSpec("e-style-audio", str(E_TARGET), str(E_DRAFTER), dtype="float32"), None).result()
    assert info.has_audio and info.has_vision
    yield eng
    eng.close()


@pytest.mark.parametrize("name", list(E_REF))
def test_greedy_ids_equal_transformers_drafter_off_and_on(e_engine, name):
    """Every clip (1 s tone, 3.7 s chirp, 0.25 s noise, 2 s silence, 31 s, 0.05 s, 8 kHz and 44.1 kHz
    stereo resampled here, two clips): 32 greedy ids, plain and at block sizes 3 and auto."""
    ref = E_REF[name]
    want = ref["hf"]["greedy_ids"]
    for kw in ({"drafter_enabled": False}, {"block_size": 3}, {"block_size": "auto"}):
        e_engine.reset().result()
        done, events = _chat(e_engine, _messages(ref), _greedy(**kw))
        assert list(done.token_ids) == want, (name, kw)
        prefill = next(e for e in events if isinstance(e, PrefillDone))
        assert prefill.prompt_tokens == ref["prompt_len"]
        if kw.get("block_size") == 3:
            assert done.stats.drafted > 0
        if name == "long_31s":
            (notice,) = [e for e in events if isinstance(e, Notice)]
            assert notice.text == "Audio file 'long_31s.pcm16.flac' is 31.0 s long; the model hears only its first 30 s"
            assert events.index(notice) < events.index(prefill)
        else:
            assert not any(isinstance(e, Notice) for e in events)


def _assemble(target_dir: Path, ref: dict):
    """ids, embedding rows and mask of a reference prompt, built from the files by our own path."""
    target = load_target(target_dir, "float32")
    enc, spec = load_audio(target_dir, mx.float32), AudioSpec.from_model_dir(target_dir)
    ids = ref["prompt_ids"]
    soft = mx.concatenate([enc.encode_clip(prepare_audio(m["path"], spec)) for m in _messages(ref)[0]["content"][:-1]])
    audio_id = prompt_mod.audio_token_ids(target_dir).audio
    where = np.flatnonzero(np.array(ids) == audio_id)
    rows = mx.zeros((len(ids), target.hidden_size))
    rows[mx.array(where)] = soft
    mask = mx.array(np.array(ids) == audio_id)
    return target, ids, rows, mask


@pytest.mark.parametrize(
    "target_dir,name,tol",
    [(E_TARGET, n, 1e-4) for n in E_REF if n not in ("tone8k_1p5s", "stereo44k_1s")]
    + [(E_TARGET, n, 3e-2) for n in ("tone8k_1p5s", "stereo44k_1s")]  # another resampler than the pack's
    + [(U_TARGET, n, 1e-4) for n in U_REF],
)
def test_last_logits_match_transformers(target_dir, name, tol):
    ref = (E_REF if target_dir == E_TARGET else U_REF)[name]
    refs = load_file(
        AUDIO / ("e-style-audio.safetensors" if target_dir == E_TARGET else "unified-style-audio.safetensors")
    )
    target, ids, rows, mask = _assemble(target_dir, ref)
    logits, _ = target.forward(ids, target.make_cache(), embeddings=rows, embedding_mask=mask, logits="last")
    assert np.abs(np.array(logits[0]) - refs[f"{name}.last_logits_hf"]).max() <= tol


@pytest.mark.parametrize("target_dir,name", [(E_TARGET, "two_clips"), (U_TARGET, "two_clips")])
def test_audio_tokens_are_causal(target_dir, name):
    """transformers keeps audio tokens causal on both architectures (only image tokens see both ways):
    a bidirectional audio span, as the image rule would make it, moves the logits off the reference."""
    ref = (E_REF if target_dir == E_TARGET else U_REF)[name]
    refs = load_file(
        AUDIO / ("e-style-audio.safetensors" if target_dir == E_TARGET else "unified-style-audio.safetensors")
    )
    target, ids, rows, mask = _assemble(target_dir, ref)
    target.bidirectional_vision = True  # as a "vision" checkpoint would be
    spans = [(s, e) for s, e in ref.get("audio_token_spans") or _spans(ids, prompt_mod.audio_token_ids(target_dir))]
    logits, _ = target.forward(
        ids, target.make_cache(), embeddings=rows, embedding_mask=mask, bidirectional=spans, logits="last"
    )
    assert np.abs(np.array(logits[0]) - refs[f"{name}.last_logits_hf"]).max() > 1e-3


def _spans(ids, audio_ids) -> list[tuple[int, int]]:
    out, start = [], None
    for i, t in enumerate(ids):
        if t == audio_ids.audio and start is None:
            start = i
        if t != audio_ids.audio and start is not None:
            out.append((start, i))
            start = None
    return out


def test_two_clips_fill_their_own_slots(e_engine):
    """The case mlx-vlm 0.7.10 gets wrong: each clip's valid rows, in order, in its own span."""
    ref = E_REF["two_clips"]
    e_engine.reset().result()
    _chat(e_engine, _messages(ref), _greedy(max_tokens=1))
    st = e_engine._state
    spec = st.audio_spec
    (a, b) = [s for s in st.token_log.images]
    assert (a.start, a.end, b.start, b.end) == (6, 12, 14, 39)
    for span, f in ((a, "noise_0p25s.pcm16.wav"), (b, "sine_1s.pcm16.wav")):
        want = np.array(st.audio.encode_clip(prepare_audio(INPUTS / f, spec)))
        np.testing.assert_array_equal(np.array(st.soft_tokens[span.key]), want)


def test_prefill_chunks_through_audio_spans_change_nothing(e_engine, monkeypatch):
    """Audio is causal, so a chunk may end anywhere in a clip: 7-token chunks cut every span."""
    ref = E_REF["chirp_3p7s"]
    monkeypatch.setattr(spec_mod, "PREFILL_CHUNK", 7)
    e_engine.reset().result()
    done, _ = _chat(e_engine, _messages(ref), _greedy(block_size=3))
    assert list(done.token_ids) == ref["hf"]["greedy_ids"]


def test_cache_reuse_across_audio_turns(e_engine):
    """Turn 2 keeps turn 1's audio prefix (the clip is not encoded again) and equals a fresh prefill of the
    same conversation; a turn with another clip in that place re-prefills from its boa token."""
    st = e_engine._state
    calls: list[int] = []
    real = st.audio.encode_clip
    st.audio.encode_clip = lambda clip: (calls.append(clip.num_soft_tokens), real(clip))[1]
    try:
        turn1 = _messages(E_REF["sine_1s"])
        e_engine.reset().result()
        done1, _ = _chat(e_engine, turn1, _greedy(max_tokens=8, ignore_eos=False))
        convo = turn1 + [
            {"role": "assistant", "content": done1.text},
            {
                "role": "user",
                "content": [
                    {"type": "audio", "path": str(INPUTS / "noise_0p25s.pcm16.wav")},
                    {"type": "text", "text": "And this one?"},
                ],
            },
        ]
        done2, events2 = _chat(e_engine, convo, _greedy(max_tokens=12, block_size=3))
        prefill = next(e for e in events2 if isinstance(e, PrefillDone))
        assert prefill.reused_tokens > 40 and calls == [25, 6]  # sine encoded once, noise once
        e_engine.reset().result()
        fresh, _ = _chat(e_engine, convo, _greedy(max_tokens=12, drafter_enabled=False))
        assert fresh.token_ids == done2.token_ids
        # the first clip swapped for another of the same length: same ids, other key, re-prefilled from boa
        swapped = [
            {
                "role": "user",
                "content": [{"type": "audio", "path": str(INPUTS / "sine_1s.f32.wav")}, turn1[0]["content"][1]],
            }
        ]
        _chat(e_engine, swapped, _greedy(max_tokens=1))  # the same samples: fully reused
        other = [
            {
                "role": "user",
                "content": [{"type": "audio", "path": str(INPUTS / "stereo44k_1s.pcm16.wav")}, turn1[0]["content"][1]],
            }
        ]
        _, events3 = _chat(e_engine, other, _greedy(max_tokens=1))
        assert next(e for e in events3 if isinstance(e, PrefillDone)).reused_tokens == 5  # up to boa
    finally:
        st.audio.encode_clip = real


def test_pairings_without_audio_refuse_before_any_work(tmp_path):
    """The demo-like e-style target (no audio_config), a 26B-like and a 31B-like one: one line, nothing run."""
    eng = Engine()
    try:
        for family in ("e-style", "moe-style", "dense-style"):
            eng.load(PairingSpec(family, str(MODELS / f"{family}-target"), None), None).result()
            assert not eng.info.has_audio
            events: list = []
            missing = [{"role": "user", "content": [{"type": "audio", "path": str(tmp_path / "none.wav")}]}]
            done = eng.chat(missing, _greedy(), events.append).result(timeout=60)
            assert done.error == f"{family} does not take audio: Gemma 4 E2B, E4B and 12B do (26B-A4B and 31B do not)"
            assert not any(isinstance(e, PrefillDone) for e in events)  # refused before decoding the (missing) file
    finally:
        eng.close()


def test_bad_audio_fails_the_turn_with_its_message(e_engine, tmp_path):
    bad = tmp_path / "notes.wav"
    bad.write_text("not audio\n" * 50)
    done = e_engine.chat(
        [{"role": "user", "content": [{"type": "audio", "path": str(bad)}]}], _greedy(), lambda e: None
    ).result()
    assert done.error == "Audio file 'notes.wav' is not an audio file gemma-chat can read (WAV, FLAC, OGG/Vorbis, MP3)."
    # the engine goes on: the next turn works
    done, _ = _chat(e_engine, _messages(E_REF["noise_0p25s"]), _greedy(max_tokens=4))
    assert list(done.token_ids) == E_REF["noise_0p25s"]["hf"]["greedy_ids"][:4]


@pytest.mark.parametrize("name", list(U_REF))
def test_unified_audio_prompts_greedy_drafter_off_and_on(name):
    ref = U_REF[name]
    eng = Engine()
    try:
        info = eng.load(PairingSpec("unified-style", str(U_TARGET), str(U_DRAFTER), dtype="float32"), None).result()
        assert info.has_audio
        for kw in ({"drafter_enabled": False}, {"block_size": 3}):
            eng.reset().result()
            done, _ = _chat(eng, _messages(ref), _greedy(**kw))
            assert list(done.token_ids) == ref["hf"]["greedy_ids"], kw
    finally:
        eng.close()


# -- factory checkpoints: the real on-disk layouts ------------------------------------------------------


def test_factory_audio_checkpoints_in_both_layouts(factory_checkpoints):
    """The factory's audio tower (HF names and conv layout, and mlx-community's channels-last convolutions
    with a 4-bit embed_audio): the same soft tokens from both float layouts, drafted == plain greedy."""
    hf, drafter = factory_checkpoints.pairing("e-style-audio")
    mlx_dir = factory_checkpoints.target("e-style-audio", layout="mlx")
    clip = str(INPUTS / "chirp_3p7s.pcm16.wav")
    soft = {}
    for d in (hf, mlx_dir):
        enc = load_audio(d)
        soft[d] = np.array(enc.encode_clip(prepare_audio(clip, AudioSpec.from_model_dir(d))))
    assert soft[hf].shape == (93, 128)
    np.testing.assert_array_equal(soft[hf], soft[mlx_dir])
    messages = [{"role": "user", "content": [{"type": "audio", "path": clip}, {"type": "text", "text": "Hear this?"}]}]
    eng = Engine()
    try:
        for target in (hf, mlx_dir):
            eng.load(PairingSpec("factory", str(target), str(drafter)), None).result()
            plain, _ = _chat(eng, messages, _greedy(max_tokens=16, drafter_enabled=False))
            eng.reset().result()
            drafted, _ = _chat(eng, messages, _greedy(max_tokens=16, block_size=4))
            assert drafted.token_ids == plain.token_ids and drafted.stats.drafted > 0
        q4 = factory_checkpoints.target("e-style-audio", layout="mlx", dtype="q4")
        info = eng.load(PairingSpec("factory-q4", str(q4), None), None).result()
        assert info.has_audio
        assert type(eng._state.audio.embed_audio.embedding_projection).__name__ == "QuantizedLinear"
        done, _ = _chat(eng, messages, _greedy(max_tokens=4))
        assert len(done.token_ids) == 4
    finally:
        eng.close()
