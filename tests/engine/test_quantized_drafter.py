"""4-bit drafters (as mlx-community publishes them): they load, draft exactly what the same drafter with
the dequantized weights drafts, the centroid head's packed embedding included, keep greedy output
identical to the target alone, and the controller's first guess at their cost is lower."""

from __future__ import annotations

import json

import mlx.core as mx
import mlx.nn as nn
import pytest
from support import factory

from core.decode.spec import Decoder, Prompt, draft_cost_hint
from core.model.drafter import check_pair, load_drafter
from core.model.target import load_target
from core.settings import GenerationSettings


@pytest.fixture(scope="module", params=["e-style", "moe-style"])  # centroid head; tied dense head
def quantized(request, factory_checkpoints, tmp_path_factory):
    target_dir, drafter_dir = factory_checkpoints.pairing(request.param)
    q_dir = factory.quantize_drafter(drafter_dir, tmp_path_factory.mktemp("q4") / request.param)
    return request.param, load_target(target_dir), drafter_dir, q_dir


def _dequantized_twin(q_dir, tmp_path):
    """The same drafter with every packed weight expanded back to floats (what the 4-bit one computes)."""
    w = mx.load(str(q_dir / "model.safetensors"))
    out = {}
    for name, v in w.items():
        if name.endswith((".scales", ".biases")):
            continue
        stem = name.removesuffix(".weight")
        if f"{stem}.scales" in w:
            v = mx.dequantize(v, w[f"{stem}.scales"], w[f"{stem}.biases"], group_size=64, bits=4)
        out[name] = v
    twin = tmp_path / "twin"
    twin.mkdir()
    mx.save_safetensors(str(twin / "model.safetensors"), out)
    config = json.loads((q_dir / "config.json").read_text())
    config.pop("quantization"), config.pop("quantization_config")
    (twin / "config.json").write_text(json.dumps(config))
    return twin


def test_a_4bit_drafter_loads_quantized(quantized):
    variant, tg, _, q_dir = quantized
    dr = load_drafter(q_dir, "float32")
    check_pair(tg, dr)
    assert isinstance(dr.embed_tokens, nn.QuantizedEmbedding)
    assert isinstance(dr.pre_projection, nn.QuantizedLinear)
    if variant == "e-style":
        assert dr.ordered and isinstance(dr.centroids, nn.QuantizedLinear)


def test_it_drafts_what_its_dequantized_twin_drafts(quantized, tmp_path):
    _, tg, _, q_dir = quantized
    dr = load_drafter(q_dir, "float32")
    twin = load_drafter(_dequantized_twin(q_dir, tmp_path), "float32")
    ids = [2] + list(range(30, 30 + 2 * tg.window))
    cache = tg.make_cache()
    _, hidden = tg.forward(ids, cache, logits=None)
    b = mx.array([7], dtype=mx.uint32)
    drafts, _ = dr.draft(tg, cache, b, hidden[-1], 6)
    expect, _ = twin.draft(tg, cache, b, hidden[-1], 6)
    assert drafts.tolist() == expect.tolist()
    # sampling reads the head's full distribution (dense) or its candidates (centroid): it runs too
    keys = [mx.random.key(i) for i in range(3)]
    sampled, lp = dr.draft(tg, cache, b, hidden[-1], 3, temperature=1.0, top_k=0, top_p=0.95, keys=keys)
    assert sampled.shape == (3,) and lp is not None


def test_greedy_stays_the_target_alone(quantized):
    _, tg, _, q_dir = quantized
    dr = load_drafter(q_dir, "float32")
    ids = [2] + list(range(30, 30 + 3 * tg.window))
    settings = GenerationSettings(max_tokens=16, ignore_eos=True)
    plain = Decoder(tg).run(tg.make_cache(), Prompt(ids), settings, lambda e: None)
    for block in (4, "auto"):
        run = Decoder(tg, dr).run(
            tg.make_cache(),
            Prompt(ids),
            GenerationSettings(**{**settings.__dict__, "block_size": block}),
            lambda e: None,
        )
        assert run.token_ids == plain.token_ids
    sampled = Decoder(tg, dr).run(
        tg.make_cache(),
        Prompt(ids),
        GenerationSettings(max_tokens=8, temperature=1.0, seed=3, block_size=3),
        lambda e: None,
    )
    assert len(sampled.token_ids) == 8


def test_the_controller_guesses_a_cheaper_draft_step(quantized):
    _, tg, drafter_dir, q_dir = quantized
    full = draft_cost_hint(tg, load_drafter(drafter_dir, "float32"))
    four = draft_cost_hint(tg, load_drafter(q_dir, "float32"))
    assert full is not None and four is not None and four < full
    assert Decoder(tg, load_drafter(q_dir, "float32")).auto.draft_cost == four
