"""Image prompts through the engine: assembly against the HF references, drafter identity with
images across cache-reusing turns, encode-once, chunking, errors, quantized and real-shape vision
towers, the CLI with two images, and the drafter conventions reaching the drafter."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten
from safetensors.numpy import load_file

import core.decode.spec as spec_mod
from core.decode import prompt as prompt_mod
from core.decode.spec import prefill_chunks
from core.engine.contract import EngineError, PairingSpec
from core.engine.local import Engine
from core.events import PrefillDone, TurnDone
from core.model.encoders import load_vision
from core.model.image import ImageProcessorConfig, preprocess_image
from core.model.loader import load_tokenizer
from core.model.target import load_target
from core.model.vision import VisionConfig, VisionEncoder
from core.settings import GenerationSettings

PACK = "tests/data/pack/models"
IMAGES = "tests/data/pack/references/images"
TEST_IMAGE = f"{IMAGES}/test_image.png"
SECOND_IMAGE = f"{IMAGES}/inputs/rgb_640x480.png"
THIRD_IMAGE = f"{IMAGES}/inputs/gray_77x143.png"
DESCRIBE = "Describe this picture in one sentence."


def _image_msg(*paths, text=DESCRIBE):
    return {"role": "user", "content": [*({"type": "image", "path": p} for p in paths), {"type": "text", "text": text}]}


def _spec(family, drafter=True, **kw):
    return PairingSpec(family, f"{PACK}/{family}-target", f"{PACK}/{family}-assistant" if drafter else None, **kw)


def _chat(eng, messages, **kw):
    events = []
    done = eng.chat(messages, GenerationSettings(**kw), events.append).result(timeout=120)
    assert isinstance(done, TurnDone) and events[-1] is done
    return done, events


def _count_encodes(eng):
    """Spy on the loaded vision tower: the list grows by one per image encoded."""
    vision = eng._state.vision
    calls = []
    real = vision.encode_image

    def spy(image):
        calls.append(image.num_soft_tokens)
        return real(image)

    vision.encode_image = spy
    return calls


# --- assembly against the reference ------------------------------------------------------


def _assemble(family):
    d = f"{PACK}/{family}-target"
    tok = load_tokenizer(d)
    ids = prompt_mod.encode_messages(
        tok, [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": DESCRIBE}]}]
    )
    im = preprocess_image(TEST_IMAGE, ImageProcessorConfig.from_model_dir(d))
    ids, spans = prompt_mod.expand_images(ids, [im.num_soft_tokens], prompt_mod.image_token_ids(d))
    soft = load_vision(d).encode_image(im)
    return ids, spans, soft


def _prefill_last_logits(tg, ids, spans, soft, *, chunk=16, bidirectional=True):
    H = tg.hidden_size
    emb = mx.zeros((len(ids), H), tg.dtype)
    mask = np.zeros(len(ids), bool)
    for a, b in spans:
        emb[a:b] = soft
        mask[a:b] = True
    mask = mx.array(mask)
    cache = tg.make_cache()
    chunks = prefill_chunks(len(ids), spans, size=chunk)
    for a, b in spans:  # each image sits whole inside one chunk
        assert sum(1 for s, e in chunks if s < b and e > a) == 1
    logits = None
    for s, e in chunks:
        bi = [(a, b) for a, b in spans if a < e and b > s] if bidirectional else None
        logits, _ = tg.forward(
            ids[s:e],
            cache,
            embeddings=emb[s:e],
            embedding_mask=mask[s:e],
            bidirectional=bi or None,
            logits="last" if e == len(ids) else None,
        )
    return np.array(logits[0])


@pytest.mark.parametrize("family", ["e-style", "moe-style", "dense-style", "unified-style"])
def test_full_image_prompt_last_logits_match_hf(family):
    ref = load_file(f"{IMAGES}/{family}.safetensors")
    ids, spans, soft = _assemble(family)
    # boi + 130 soft tokens + eoi, ids from the config; the template's <bos> only once
    assert ids == ref["prompt_ids"].tolist() and spans == [(6, 136)]
    assert ids[5] == 4 and ids[136] == 5 and set(ids[6:136]) == {6} and ids[:2] != [2, 2]
    tg = load_target(f"{PACK}/{family}-target")
    logits = _prefill_last_logits(tg, ids, spans, soft)  # chunks of 16 around a 130-token image
    assert np.abs(logits - ref["last_logits_hf"]).max() <= 1e-4
    if tg.bidirectional_vision:
        # the HF mask matters here: a purely causal prefill is far off
        causal = _prefill_last_logits(tg, ids, spans, soft, bidirectional=False)
        assert np.abs(causal - ref["last_logits_hf"]).max() > 0.1
    else:
        # e-style: soft tokens go in unscaled, and per-layer inputs use the pad id at image positions
        scaled = _prefill_last_logits(tg, ids, spans, soft * tg.embed_scale)
        assert np.abs(scaled - ref["last_logits_hf"]).max() > 1e-2
        tg.pad_id = 6  # PLE looked up with the image token id instead
        wrong_ple = _prefill_last_logits(tg, ids, spans, soft)
        assert np.abs(wrong_ple - ref["last_logits_hf"]).max() > 1e-3


# --- engine: drafter identity, cache reuse, encode once ----------------------------------


@pytest.mark.parametrize("family", ["e-style", "moe-style", "dense-style", "unified-style"])
def test_drafter_identity_with_images_across_reused_turns(family):
    eng = Engine()
    try:
        eng.load(_spec(family), None).result(timeout=120)
        encodes = _count_encodes(eng)
        kw = dict(max_tokens=10, ignore_eos=True, image_budget=70)
        first = [_image_msg(TEST_IMAGE)]

        def conversation(reply1, reply2):
            two = first + [{"role": "assistant", "content": reply1}, _image_msg(SECOND_IMAGE, text="And this one?")]
            three = two + [{"role": "assistant", "content": reply2}, {"role": "user", "content": "Compare them."}]
            return two, three

        # drafter on, three turns, each reusing the cache
        a1, _ = _chat(eng, first, block_size=4, **kw)
        two, three = conversation(a1.text, "")
        a2, ev2 = _chat(eng, two, block_size=4, **kw)
        two, three = conversation(a1.text, a2.text)
        a3, ev3 = _chat(eng, three, block_size="auto", **kw)
        assert a1.error is None and a2.error is None and a3.error is None
        assert a1.stats.drafted > 0 and a2.stats.drafted > 0
        assert ev2[0].reused_tokens > 70 and ev3[0].reused_tokens > ev2[0].prompt_tokens - 5
        assert len(encodes) == 2  # each image encoded once, never again on a later turn

        # drafter off, same turns: identical tokens
        eng.reset().result()
        b1, _ = _chat(eng, first, drafter_enabled=False, **kw)
        b2, _ = _chat(eng, two, drafter_enabled=False, **kw)
        b3, _ = _chat(eng, three, drafter_enabled=False, **kw)
        assert (b1.token_ids, b2.token_ids, b3.token_ids) == (a1.token_ids, a2.token_ids, a3.token_ids)

        # the turns that reused the cache equal a full prefill of the same conversation
        for msgs, want in ((two, a2), (three, a3)):
            eng.reset().result()
            c, ev = _chat(eng, msgs, block_size=3, **kw)
            assert ev[0].reused_tokens == 0 and c.token_ids == want.token_ids
    finally:
        eng.close()


def test_small_prefill_chunks_keep_each_image_whole(monkeypatch):
    meta = json.load(open(f"{IMAGES}/moe-style.json"))
    monkeypatch.setattr(spec_mod, "PREFILL_CHUNK", 16)
    eng = Engine()
    try:
        eng.load(_spec("moe-style"), None).result(timeout=120)
        tg = eng._state.target
        calls = []
        real = tg.forward

        def spy(tokens, cache, **kw):
            calls.append((cache.offset, len(tokens), kw.get("bidirectional")))
            return real(tokens, cache, **kw)

        tg.forward = spy
        done, events = _chat(eng, [_image_msg(TEST_IMAGE)], max_tokens=30, ignore_eos=True, block_size=3)
        prefill, n = [], 0
        while n < 158:  # the prefill calls come first, then one call per round
            prefill.append(calls[len(prefill)])
            n += prefill[-1][1]
        assert list(done.token_ids) == meta["hf"]["greedy_ids"]
        assert isinstance(events[0], PrefillDone) and events[0].prefill_tokens == 158
        with_image = [call for call in calls if call[2]]
        assert with_image == [(6, 130, [(6, 136)])]  # one chunk, the whole image, its span as the overlay
        # 16-token chunks around the image, then the last position as its own step
        assert n == 158 and [p for p, _, _ in prefill] == [0, 6, 136, 152, 157]
    finally:
        eng.close()


def test_reprefill_keeps_encoded_images(monkeypatch):
    # a turn whose cache cannot roll back re-prefills from scratch, with the images it already encoded
    eng = Engine()
    try:
        eng.load(_spec("e-style", drafter=False), None).result(timeout=120)
        encodes = _count_encodes(eng)
        msgs = [_image_msg(TEST_IMAGE)]
        a, _ = _chat(eng, msgs, max_tokens=6, image_budget=70)
        st = eng._state
        monkeypatch.setattr(type(st.cache), "can_trim_to", lambda self, n: False)
        b, ev = _chat(
            eng,
            msgs + [{"role": "assistant", "content": a.text}, {"role": "user", "content": "More."}],
            max_tokens=6,
            image_budget=70,
        )
        assert b.error is None and ev[0].reused_tokens == 0
        assert len(encodes) == 1
        # a new budget is a new image: encoded again, and the old soft tokens are let go
        c, _ = _chat(eng, msgs, max_tokens=2, image_budget=140)
        assert c.error is None and encodes[1] == 130 and len(encodes) == 2
        assert len(st.soft_tokens) == 1
    finally:
        eng.close()


# --- errors --------------------------------------------------------------------------------


def _strip_vision(src, dst):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    del cfg["vision_config"]
    (dst / "config.json").write_text(json.dumps(cfg))
    w = mx.load(str(dst / "model.safetensors"))
    mx.save_safetensors(
        str(dst / "model.safetensors"),
        {k: v for k, v in w.items() if "vision_tower" not in k and "embed_vision" not in k},
    )
    return dst


def test_image_errors_end_the_turn_with_a_message(tmp_path):
    bad = tmp_path / "broken.png"
    bad.write_bytes(open(TEST_IMAGE, "rb").read()[:300])
    eng = Engine()
    try:
        eng.load(_spec("dense-style"), None).result(timeout=120)
        cases = [
            (_image_msg(str(tmp_path / "missing.png")), {}, "not found"),
            (_image_msg(str(bad)), {}, "damaged or truncated"),
            (_image_msg(TEST_IMAGE), {"image_budget": 300}, "image budget must be one of"),
        ]
        for msg, kw, message in cases:
            done, events = _chat(eng, [msg], max_tokens=3, **kw)
            assert done.stats.stop_reason == "error" and message in done.error and len(events) == 1
        st = eng._state
        saved, st.target.context_length = st.target.context_length, 100
        try:
            done, _ = _chat(eng, [_image_msg(TEST_IMAGE)], max_tokens=3)  # 158 tokens > 100
        finally:
            st.target.context_length = saved
        assert done.stats.stop_reason == "error" and "context is 100" in done.error
        ok, _ = _chat(eng, [_image_msg(TEST_IMAGE)], max_tokens=3)  # the engine carries on
        assert ok.error is None and len(ok.token_ids) == 3

        no_vision = _strip_vision(Path(f"{PACK}/e-style-target"), tmp_path / "nv")
        info = eng.load(PairingSpec("no vision", str(no_vision), f"{PACK}/e-style-assistant"), None).result(timeout=120)
        assert not info.has_vision
        done, _ = _chat(eng, [_image_msg(TEST_IMAGE)], max_tokens=3)
        assert done.stats.stop_reason == "error" and "does not take images" in done.error
        text, _ = _chat(eng, [{"role": "user", "content": "hi"}], max_tokens=3)
        assert text.error is None
    finally:
        eng.close()


# --- quantized and real-shape vision towers ------------------------------------------------


def _quantize_vision_in_place(target_dir):
    """Quantize the mlx-layout checkpoint's vision linears (4-bit, group 32) as a converter without
    skip_vision would, and write them back under the same names."""
    enc = load_vision(target_dir)
    nn.quantize(
        enc,
        group_size=32,
        bits=4,
        class_predicate=lambda p, m: isinstance(m, nn.Linear) and m.weight.shape[1] % 32 == 0,
    )
    files = sorted(target_dir.glob("*.safetensors"))
    weights = {}
    for f in files:
        weights.update(mx.load(str(f)))
    weights = {k: v for k, v in weights.items() if not k.startswith(("vision_tower.", "embed_vision."))}
    weights.update(dict(tree_flatten(enc.parameters())))
    for f in files:
        f.unlink()
    (target_dir / "model.safetensors.index.json").unlink(missing_ok=True)
    mx.save_safetensors(str(target_dir / "model.safetensors"), weights)


def test_quantized_vision_tower_in_a_q4_pairing(factory_checkpoints, tmp_path):
    # e-style: the quantized linears sit inside clippable wrappers whose bounds still apply
    target, drafter = factory_checkpoints.pairing("e-style", layout="mlx", dtype="q4")
    assert not any(".scales" in k and "vision" in k for k in mx.load(str(next(target.glob("*.safetensors")))))
    q = tmp_path / "q4-vision"
    shutil.copytree(target, q)
    _quantize_vision_in_place(q)
    im = preprocess_image(SECOND_IMAGE, max_soft_tokens=70)
    ref, quant = (np.array(load_vision(d).encode_image(im).astype(mx.float32)) for d in (target, q))
    assert np.corrcoef(ref.ravel(), quant.ravel())[0, 1] > 0.8  # 4-bit: close to the bf16 tower, not equal
    eng = Engine()
    try:
        info = eng.load(PairingSpec("q4", str(q), str(drafter)), None).result(timeout=120)
        assert info.has_vision
        lin = eng._state.vision.vision_tower.encoder.layers[0].self_attn.q_proj.linear
        assert isinstance(lin, nn.QuantizedLinear) and lin.bits == 4
        kw = dict(max_tokens=5, ignore_eos=True, image_budget=70)
        on, _ = _chat(eng, [_image_msg(SECOND_IMAGE)], block_size=3, **kw)
        eng.reset().result()
        off, _ = _chat(eng, [_image_msg(SECOND_IMAGE)], drafter_enabled=False, **kw)
        assert on.error is None and on.token_ids == off.token_ids
    finally:
        eng.close()


REAL_VISION = {
    # (vision_config, text hidden): E2B/E4B and 26B/31B towers at their real widths, one layer deep
    "E-series": (
        {
            "hidden_size": 768,
            "intermediate_size": 3072,
            "num_attention_heads": 12,
            "head_dim": 64,
            "position_embedding_size": 10240,
            "use_clipped_linears": True,
            "standardize": False,
        },
        1536,
    ),
    "26B/31B": (
        {
            "hidden_size": 1152,
            "intermediate_size": 4304,
            "num_attention_heads": 16,
            "head_dim": 72,
            "position_embedding_size": 10240,
            "use_clipped_linears": False,
            "standardize": True,
        },
        2816,
    ),
}


@pytest.mark.parametrize("name", list(REAL_VISION))
def test_real_shape_vision_towers_run_float_and_quantized(name):
    v, text_hidden = REAL_VISION[name]
    config = {
        "text_config": {"hidden_size": text_hidden},
        "vision_config": {
            **v,
            "num_hidden_layers": 1,
            "num_key_value_heads": v["num_attention_heads"],
            "patch_size": 16,
            "pooling_kernel_size": 3,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_theta": 100.0},
        },
    }
    cfg = VisionConfig.from_model_config(config)
    enc = VisionEncoder(cfg)
    # a 6 x 6 patch crop of a real image (4 soft tokens): the widths are real, the CPU time small
    im = preprocess_image(SECOND_IMAGE, max_soft_tokens=70)
    pos = im.position_ids[: im.num_patches]
    keep = (pos[:, 0] < 6) & (pos[:, 1] < 6)
    pixels, pos = im.pixel_values[: im.num_patches][keep], pos[keep]
    float_out = enc.encode(pixels, pos)
    assert float_out.shape == (4, text_hidden) and bool(mx.isfinite(float_out).all())
    # the same weights 4-bit in the mlx-community layout, loaded through the .scales predicate
    nn.quantize(
        enc,
        group_size=64,
        bits=4,
        class_predicate=lambda p, m: isinstance(m, nn.Linear) and m.weight.shape[1] % 64 == 0,
    )
    loaded = VisionEncoder.from_weights(
        {**config, "quantization": {"bits": 4, "group_size": 64}}, dict(tree_flatten(enc.parameters()))
    )
    mlp = loaded.vision_tower.encoder.layers[0].mlp
    assert isinstance(loaded.vision_tower.encoder.layers[0].self_attn.q_proj.linear, nn.QuantizedLinear)
    # 4304 is not a multiple of 64: the 26B/31B down projection stays float, as converters leave it
    assert isinstance(mlp.down_proj.linear, nn.QuantizedLinear) == (v["intermediate_size"] % 64 == 0)
    q_out = np.array(loaded.encode(pixels, pos))
    assert np.corrcoef(q_out.ravel(), np.array(float_out).ravel())[0, 1] > 0.9


# --- CLI -------------------------------------------------------------------------------------


def _json_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_generate_with_two_images(capsys):
    from app.cli import main

    d = f"{PACK}/e-style-target"
    pair = ["--model", d, "--drafter", f"{PACK}/e-style-assistant"]
    args = [
        "generate",
        *pair,
        "--image",
        TEST_IMAGE,
        "--image",
        THIRD_IMAGE,
        "--image-budget",
        "70",
        "--prompt",
        "Compare the two pictures.",
        "--max-tokens",
        "12",
        "--ignore-eos",
        "--json",
        "--block-size",
        "4",
    ]
    assert main(args) == 0
    lines = _json_lines(capsys.readouterr().out)
    stats = lines[-1]["stats"]
    tok = load_tokenizer(d)
    msgs = [_image_msg(TEST_IMAGE, THIRD_IMAGE, text="Compare the two pictures.")]
    counts = [preprocess_image(p, max_soft_tokens=70).num_soft_tokens for p in (TEST_IMAGE, THIRD_IMAGE)]
    ids, spans = prompt_mod.expand_images(prompt_mod.encode_messages(tok, msgs), counts, prompt_mod.image_token_ids(d))
    assert len(spans) == 2 and stats["prompt_tokens"] == len(ids) and stats["drafted"] > 0
    drafted = [t["id"] for t in lines[:-1]]
    assert main([*args, "--no-draft"]) == 0
    assert [t["id"] for t in _json_lines(capsys.readouterr().out)[:-1]] == drafted
    # a budget outside the supported ones is refused
    i = args.index("--image-budget") + 1
    assert main([*args[:i], "300", *args[i + 1 :]]) == 1
    assert "image budget must be one of" in _json_lines(capsys.readouterr().out)[-1]["error"]


# --- drafter conventions -------------------------------------------------------------------


def test_drafter_conventions_reach_the_drafter(monkeypatch, capsys):
    from app.cli import main
    from core.model.drafter import Drafter

    seen = []
    real = Drafter.configure
    monkeypatch.setattr(Drafter, "configure", lambda self, **kw: (seen.append(kw), real(self, **kw))[1])
    base = [
        "generate",
        "--model",
        f"{PACK}/e-style-target",
        "--drafter",
        f"{PACK}/e-style-assistant",
        "--prompt",
        "Explain how a dictionary lookup works.",
        "--max-tokens",
        "40",
        "--ignore-eos",
        "--block-size",
        "4",
        "--json",
    ]
    runs = {}
    for flags in ([], ["--drafter-position", "P", "--drafter-window", "W+1"]):
        assert main([*base, *flags]) == 0
        lines = _json_lines(capsys.readouterr().out)
        runs[tuple(flags)] = ([t["id"] for t in lines[:-1]], lines[-1]["stats"]["accepted"])
    assert seen == [{"query_position": "P-1", "sliding_keys": "W"}, {"query_position": "P", "sliding_keys": "W+1"}]
    (ids_a, acc_a), (ids_b, acc_b) = runs.values()
    assert ids_a == ids_b and acc_a != acc_b  # same greedy output, different acceptance

    eng = Engine()
    try:
        eng.load(_spec("moe-style", drafter_position="P", drafter_window="W+1"), None).result(timeout=120)
        d = eng._state.drafter
        assert (d.query_position, d.sliding_keys) == ("P", "W+1")
        with pytest.raises(EngineError, match="query_position must be one of"):
            eng.load(_spec("moe-style", drafter_position="P+1"), None).result(timeout=120)
        with pytest.raises(EngineError, match="sliding_keys must be one of"):
            eng.load(_spec("moe-style", drafter=False, drafter_window="2W"), None).result(timeout=120)
        assert eng.info is not None and eng.info.name == "moe-style"  # the loaded pairing stays
    finally:
        eng.close()
