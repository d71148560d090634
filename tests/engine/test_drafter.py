"""The gemma4_assistant drafter against the pack's HF and mlx-vlm references (float32)."""

import json

import mlx.core as mx
import numpy as np
import pytest
from safetensors.numpy import load_file

from core import sampling
from core.model.drafter import check_pair, load_drafter
from core.model.loader import CheckpointError
from core.model.target import FULL, SLIDING, load_target

PACK = "tests/data/pack/models"
REFS = "tests/data/pack/references/drafter"
FAMILIES = ["e-style", "moe-style", "dense-style", "unified-style"]
# (reference implementation, position) -> our settings (query_position, sliding_keys)
CONVENTIONS = {
    ("mlx_vlm", "P-1"): ("P-1", "W"),
    ("mlx_vlm", "P"): ("P", "W"),
    ("hf", "P-1"): ("P-1", "W+1"),
    ("hf", "P"): ("P", "W+1"),
}


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request):
    fam = request.param
    tg = load_target(f"{PACK}/{fam}-target")
    dr = load_drafter(f"{PACK}/{fam}-assistant")
    return fam, tg, dr, json.load(open(f"{REFS}/{fam}.json")), load_file(f"{REFS}/{fam}.safetensors")


def _prefill(tg, ids):
    cache = tg.make_cache(slack=5)
    for s in range(0, len(ids), 20):
        logits, hidden = tg.forward(ids[s : s + 20], cache)
    return cache, logits[0], hidden[-1]


@pytest.mark.parametrize("impl,position", list(CONVENTIONS))
def test_draft_block_matches_reference(pair, impl, position):
    fam, tg, dr, meta, refs = pair
    qp, sk = CONVENTIONS[(impl, position)]
    dr.configure(query_position=qp, sliding_keys=sk)
    for state in meta["states"]:
        name, P = state["state"], state["P"]
        ids = refs[f"{name}.input.prompt_ids"].tolist()
        cache, logits, hidden = _prefill(tg, ids)
        # our target produces the drafter's inputs the references were given
        assert np.abs(np.array(hidden) - refs[f"{name}.input.hidden"]).max() <= 1e-4
        bonus = int(mx.argmax(logits).item())
        assert bonus == state["bonus_token"]
        for t in (SLIDING, FULL):
            p = tg.producer_kv(cache, t, 0 if P <= tg.window + 1 else P - tg.window - 1)
            want = refs[f"{name}.input.{t}.keys"][:, p.first :]
            assert np.abs(np.array(p.keys[0]) - want).max() <= 1e-4
        pos, kv = dr.gather_kv(tg, cache, P)
        assert pos == state["implementations"][f"{impl}.pos_{position}"]["position"]
        seen = state["implementations"][f"{impl}.pos_{position}"]["sliding_keys_attended"]
        assert kv[SLIDING][0].shape[2] == seen["n"]
        tok, h = mx.array([bonus]), hidden.reshape(1, 1, -1)
        want_logits = refs[f"{name}.{impl}.pos_{position}.logits"]
        want_hidden = refs[f"{name}.{impl}.pos_{position}.next_hidden"]
        drafted = []
        for j in range(3):
            y, h = dr.step(tg.embed(tok.reshape(1, 1)), h, kv, pos)
            full = np.array(dr.logits(y, fill="min-1"))
            assert np.abs(full - want_logits[j]).max() <= 1e-4, (name, j)
            assert np.abs(np.array(h).reshape(-1) - want_hidden[j]).max() <= 1e-4, (name, j)
            tok = dr.greedy_token(y)
            assert int(tok.item()) == int(np.argmax(want_logits[j]))
            drafted.append(int(tok.item()))
        assert drafted == state["implementations"][f"{impl}.pos_{position}"]["draft_tokens"]
        # the lazy block gives the same tokens
        block, lp = dr.draft(tg, cache, mx.array([bonus]), hidden, 3)
        assert lp is None and block.tolist() == drafted


def test_convention_names_are_checked():
    dr = load_drafter(f"{PACK}/dense-style-assistant")
    assert (dr.query_position, dr.sliding_keys) == ("P-1", "W")  # defaults: mlx-vlm / vLLM
    with pytest.raises(ValueError, match="query_position"):
        dr.configure(query_position="P+1")
    with pytest.raises(ValueError, match="sliding_keys"):
        dr.configure(sliding_keys="W-1")


def test_sampling_logits_exclude_non_candidates():
    tg = load_target(f"{PACK}/e-style-target")
    dr = load_drafter(f"{PACK}/e-style-assistant")
    cache, logits, hidden = _prefill(tg, [2, 21, 40, 41, 42, 43])
    pos, kv = dr.gather_kv(tg, cache, cache.offset)
    y, _ = dr.step(tg.embed(mx.array([[5]])), hidden.reshape(1, 1, -1), kv, pos)
    full = np.array(dr.logits(y))
    finite = np.isfinite(full)
    assert finite.sum() == dr.cfg.centroid_top_k * dr.vocab_size // dr.cfg.num_centroids
    assert full.argmax() == int(dr.greedy_token(y).item())
    drafts, lp = dr.draft(
        tg, cache, mx.array([5]), hidden, 4, temperature=0.8, keys=list(mx.random.split(mx.random.key(3), 4))
    )
    # the centroid head keeps the draft distribution sparse until verify: [4, m] candidates
    assert isinstance(lp, sampling.SparseLogProbs) and lp.ids.shape == (4, int(finite.sum()))
    lp = np.array(lp.dense(dr.vocab_size))
    assert lp.shape == (4, dr.vocab_size)
    for j, d in enumerate(drafts.tolist()):
        assert np.isfinite(lp[j, d])
        assert np.isclose(np.exp(lp[j][np.isfinite(lp[j])]).sum(), 1.0, atol=1e-4)


def test_mismatched_pair_and_non_drafter_are_refused():
    tg = load_target(f"{PACK}/e-style-target")
    too_wide = r"hidden size 80 \(its backbone_hidden_size\), but the target has hidden size 96"
    with pytest.raises(CheckpointError, match=too_wide):
        check_pair(tg, load_drafter(f"{PACK}/moe-style-assistant"))
    with pytest.raises(CheckpointError, match="not a Gemma 4 assistant"):
        load_drafter(f"{PACK}/e-style-target")
    check_pair(tg, load_drafter(f"{PACK}/e-style-assistant"))
    # K/V heads: the moe drafter reads 2 sliding K/V heads; dense-style target has the same shapes
    check_pair(load_target(f"{PACK}/dense-style-target"), load_drafter(f"{PACK}/dense-style-assistant"))


def test_kv_head_mismatch_is_refused(tmp_path):
    import shutil

    src = f"{PACK}/moe-style-assistant"
    for name in ("model.safetensors", "generation_config.json"):
        shutil.copy(f"{src}/{name}", tmp_path / name)
    cfg = json.load(open(f"{src}/config.json"))
    cfg["text_config"]["num_key_value_heads"] = 4
    json.dump(cfg, open(tmp_path / "config.json", "w"))
    with pytest.raises(CheckpointError, match="K/V heads"):
        check_pair(load_target(f"{PACK}/moe-style-target"), load_drafter(tmp_path))


def test_quantized_drafter_loads_and_drafts(tmp_path):
    """A 4-bit drafter (`quantization` in config.json, `.scales` beside the packed weights)."""
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    src = f"{PACK}/moe-style-assistant"
    dr = load_drafter(src)
    nn.quantize(
        dr,
        group_size=32,
        bits=4,
        class_predicate=lambda p, m: isinstance(m, (nn.Linear, nn.Embedding)) and m.weight.shape[-1] % 32 == 0,
    )
    weights = {
        ("model." + k if k.startswith(("layers.", "embed_tokens.", "norm.")) else k): v
        for k, v in tree_flatten(dr.parameters())
    }
    assert any(k.endswith(".scales") for k in weights)
    dr.use_fast_layers()  # its fast layers hold the float weights they were built from: build them again
    mx.save_safetensors(str(tmp_path / "model.safetensors"), weights)
    cfg = json.load(open(f"{src}/config.json"))
    cfg["quantization"] = {"group_size": 32, "bits": 4}
    json.dump(cfg, open(tmp_path / "config.json", "w"))
    q = load_drafter(tmp_path)
    assert isinstance(q.pre_projection, nn.QuantizedLinear)
    tg = load_target(f"{PACK}/moe-style-target")
    check_pair(tg, q)
    cache, logits, hidden = _prefill(tg, list(range(2, 40)))
    drafts, _ = q.draft(tg, cache, mx.argmax(logits).reshape(1), hidden, 3)
    ref, _ = dr.draft(tg, cache, mx.argmax(logits).reshape(1), hidden, 3)
    assert drafts.tolist() == ref.tolist()  # same model, quantized in place before saving


@pytest.mark.parametrize("temp,top_k,top_p", [(0.8, 0, 1.0), (1.0, 5, 1.0), (0.7, 0, 0.9), (1.3, 40, 0.95)])
def test_sparse_candidate_distribution_equals_the_full_vocabulary_one(temp, top_k, top_p):
    """Sampling among the centroid head's candidates is the full-vocabulary distribution (-inf
    outside them) under the same temperature / top-k / top-p transform."""
    tg = load_target(f"{PACK}/e-style-target")
    dr = load_drafter(f"{PACK}/e-style-assistant")
    cache, _, hidden = _prefill(tg, [2, 21, 40, 41, 42, 43, 50, 51])
    pos, kv = dr.gather_kv(tg, cache, cache.offset)
    y, _ = dr.step(tg.embed(mx.array([[7]])), hidden.reshape(1, 1, -1), kv, pos)
    full = sampling.transform_logits(dr.logits(y), temp, top_k, top_p)
    ids, sel = dr._candidates(y.reshape(-1))
    sparse = sampling.SparseLogProbs(ids[None], sampling.transform_logits(sel, temp, top_k, top_p)[None])
    np.testing.assert_allclose(np.array(sparse.dense(dr.vocab_size)[0]), np.array(full), atol=1e-5)


@pytest.mark.parametrize("fam", ["e-style", "dense-style"])  # the centroid head and the dense tied head
def test_a_gate_reads_each_drafts_probability_and_ends_the_block_where_it_says(fam):
    tg = load_target(f"{PACK}/{fam}-target")
    dr = load_drafter(f"{PACK}/{fam}-assistant")
    cache, logits, hidden = _prefill(tg, [2, 21, 40, 41, 42, 43, 44, 45])
    bonus = mx.argmax(logits).reshape(1)
    plain, _ = dr.draft(tg, cache, bonus, hidden, 5)
    seen: list[tuple[int, float]] = []
    gated, _ = dr.draft(tg, cache, bonus, hidden, 5, gate=lambda j, p: seen.append((j, p)) or True)
    assert gated.tolist() == plain.tolist() and [j for j, _ in seen] == [0, 1, 2, 3, 4]
    # each p is the drafter's softmax probability of the token it drafted, recomputed step by step
    pos, kv = dr.gather_kv(tg, cache, cache.offset)
    tok, h = bonus, hidden.reshape(1, 1, -1)
    for j, d in enumerate(plain.tolist()):
        y, h = dr.step(tg.embed(tok.reshape(1, 1)), h, kv, pos)
        full = np.array(dr.logits(y), dtype=np.float64)
        want = np.exp(full[d] - full.max()) / np.exp(full - full.max()).sum()
        assert abs(seen[j][1] - want) < 1e-5 and 0.0 < seen[j][1] <= 1.0
        tok = mx.array([d])
    # False at step 2 drops that draft and drafts no further
    calls: list[int] = []
    cut, _ = dr.draft(tg, cache, bonus, hidden, 5, gate=lambda j, p: calls.append(j) or j < 2)
    assert cut.tolist() == plain.tolist()[:2] and calls == [0, 1, 2]
    # sampled: the same keys draw the same tokens; the distributions are cut with them
    keys = list(mx.random.split(mx.random.key(5), 4))
    sampled, lp = dr.draft(tg, cache, bonus, hidden, 4, temperature=1.0, top_p=0.95, keys=keys)
    probs: list[float] = []
    first, lp1 = dr.draft(
        tg, cache, bonus, hidden, 4, temperature=1.0, top_p=0.95, keys=keys, gate=lambda j, p: probs.append(p) or j < 1
    )
    assert first.tolist() == sampled.tolist()[:1] and len(probs) == 2
    dense = np.array(lp.dense(dr.vocab_size) if isinstance(lp, sampling.SparseLogProbs) else lp)
    dense1 = np.array(lp1.dense(dr.vocab_size) if isinstance(lp1, sampling.SparseLogProbs) else lp1)
    assert dense1.shape == (1, dr.vocab_size) and np.allclose(dense1[0], dense[0], atol=1e-6)
    for j in range(2):
        assert abs(probs[j] - float(np.exp(dense[j, sampled.tolist()[j]]))) < 1e-5
