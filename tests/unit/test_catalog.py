"""Catalogue, memory fit, custom-pair validation and the local HF-cache view. No network."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from fakehub import FakeHub, FakeRepo, put_in_cache

from core.hub import catalog, fit, hfcache, pairing
from core.hub.download import local_snapshot

PACK = Path(__file__).parents[1] / "data" / "pack" / "models"
FAMILIES = ("e-style", "moe-style", "dense-style", "unified-style")


def _cfg(name: str) -> dict:
    return json.loads((PACK / name / "config.json").read_text())


# -- catalogue --------------------------------------------------------------------------------------


def test_the_official_pairings_name_their_own_assistant():
    cat = catalog.load_catalog()
    expected = {
        "e2b": ("mlx-community/gemma-4-e2b-it-bf16", "mlx-community/gemma-4-E2B-it-assistant-bf16"),
        "e4b": ("mlx-community/gemma-4-e4b-it-bf16", "mlx-community/gemma-4-E4B-it-assistant-bf16"),
        "12b": ("mlx-community/gemma-4-12B-it-bf16", "mlx-community/gemma-4-12B-it-assistant-bf16"),
        "26b-a4b": ("mlx-community/gemma-4-26b-a4b-it-bf16", "mlx-community/gemma-4-26B-A4B-it-assistant-bf16"),
        "31b": ("mlx-community/gemma-4-31b-it-bf16", "mlx-community/gemma-4-31B-it-assistant-bf16"),
    }
    for name, (target, drafter) in expected.items():
        p = catalog.get_pairing(name)
        assert (p.target_repo, p.drafter_repo) == (target, drafter)
        assert p.vision and p.quant == "bf16" and p.block_size >= 2
    # Quantized variants reuse their family's bf16 assistant, or (the "-d4" ones) name a 4-bit assistant of
    # their own; every one carries a source note.
    for p in cat.pairings:
        assert p.source
        assert re.fullmatch(r"mlx-community/gemma-4-(e2b|e4b|12B|26b-a4b|31b)-it-(bf16|8bit|4bit)", p.target_repo)
        if p.name.endswith("-d4"):
            assert re.fullmatch(
                r"mlx-community/gemma-4-(E2B|E4B|12B|26B-A4B|31B)-it(-qat)?-assistant-4bit", p.drafter_repo
            )
            assert p.drafter_quant == "4bit" and p.drafter_bytes < p.family.drafter_bytes / 2
            assert p.download_bytes == p.target_bytes + p.drafter_bytes and p.label.endswith(" 4+d4")
        else:
            assert p.drafter_repo.endswith("-it-assistant-bf16") and p.drafter_bytes == p.family.drafter_bytes
    d4 = {p.name: p for p in cat.pairings if p.name.endswith("-d4")}
    assert {"e2b-d4", "e4b-d4", "12b-d4", "26b-a4b-d4", "31b-d4"} == set(d4)
    assert not d4["e2b-d4"].confirmed and d4["31b-d4"].confirmed  # one source vs several


def test_unknown_pairing_name_suggests_close_ones():
    with pytest.raises(KeyError, match="did you mean e4b"):
        catalog.get_pairing("e4")


def test_catalogue_rejects_a_pairing_with_an_unknown_family():
    text = catalog.CATALOG_PATH.read_text().replace('family = "31b"', 'family = "32b"', 1)
    with pytest.raises(ValueError, match="unknown family '32b'"):
        catalog.parse_catalog(text)


@pytest.mark.parametrize(
    "name, sliding, full", [("e2b", 13, 14), ("e4b", 22, 23), ("12b", 46, 47), ("26b-a4b", 28, 29), ("31b", 58, 59)]
)
def test_producer_layers_match_the_design_notes(name, sliding, full):
    arch = catalog.get_pairing(name).family.arch
    assert fit.producer_layers(arch) == {"sliding_attention": sliding, "full_attention": full}


def test_kv_cache_size_from_config_numbers():
    e2b = catalog.get_pairing("e2b").family.arch
    # 15 layers own K/V: 12 sliding (512 x 1 head x 256) + 3 full (ctx x 1 head x 512); K+V, bf16.
    assert fit.kv_cache_bytes(e2b, 8192) == 12 * 512 * 1 * 256 * 4 + 3 * 8192 * 1 * 512 * 4
    big = catalog.get_pairing("31b").family.arch
    # 50 sliding (1024 x 16 x 256) + 10 full with k_eq_v global heads (ctx x 4 x 512).
    assert fit.kv_cache_bytes(big, 8192) == 50 * 1024 * 16 * 256 * 4 + 10 * 8192 * 4 * 512 * 4
    # 12B: 40 sliding (1024 x 8 x 256) + 8 full with one global kv head (ctx x 1 x 512).
    twelve = catalog.get_pairing("12b").family.arch
    assert fit.kv_cache_bytes(twelve, 8192) == 40 * 1024 * 8 * 256 * 4 + 8 * 8192 * 1 * 512 * 4
    # Below the window, sliding layers only hold the context.
    assert fit.kv_cache_bytes(e2b, 100) == 12 * 100 * 256 * 4 + 3 * 100 * 512 * 4


def test_fit_levels_against_a_given_machine():
    m = fit.MachineMemory(total_bytes=16 * 10**9, budget_bytes=12 * 10**9, note="test")
    assert fit.check_fit(9 * 10**9, m).level == "ok"
    tight = fit.check_fit(11 * 10**9, m)
    assert tight.level == "tight" and tight.warn
    wont = fit.check_fit(13 * 10**9, m)
    assert wont.level == "wont_fit" and "13.0 GB" in wont.message and "12.0 GB" in wont.message
    assert fit.check_fit(1, fit.MachineMemory(None, None, "?")).level == "unknown"
    assert fit.machine_memory().total_bytes  # this Linux box reports its RAM via sysconf


def test_list_entries_orders_memory_by_size_and_flags_what_does_not_fit(tmp_path):
    m = fit.MachineMemory(total_bytes=24 * 10**9, budget_bytes=24 * 10**9, note="test")
    entries = {e.pairing.name: e for e in catalog.list_entries(cache_dir=tmp_path, machine=m)}
    assert all(e.status == "missing" for e in entries.values())
    assert (
        entries["e2b-4bit"].memory.total_bytes < entries["e2b"].memory.total_bytes < entries["31b"].memory.total_bytes
    )
    assert entries["e2b-4bit"].fit.level == "ok" and entries["31b"].fit.level == "wont_fit"
    d = entries["31b"].as_dict()
    assert d["memory_bytes"] > d["download_bytes"] and d["vision"] is True and d["fit"] == "wont_fit"


# -- custom pairs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_each_pack_pair_is_valid(family):
    assert pairing.check_pair(_cfg(f"{family}-target"), _cfg(f"{family}-assistant")) == []


def test_cross_family_pair_says_what_differs():
    problems = pairing.check_pair(_cfg("e-style-target"), _cfg("moe-style-assistant"))
    assert any("hidden size 80" in p and "hidden size 96" in p for p in problems)
    assert any(
        p.startswith("sliding-window K/V heads differ: the drafter expects 2, the target's layer 1 has 1")
        for p in problems
    )
    # one sentence per problem, no duplicates
    assert len(problems) == len(set(problems))


def test_swapped_roles_are_named():
    t, d = _cfg("dense-style-target"), _cfg("dense-style-assistant")
    problems = pairing.check_pair(t, t)
    assert problems == [
        "the drafter is a Gemma 4 target model (model_type gemma4), not an assistant drafter: "
        "use the matching '-assistant' checkpoint"
    ]
    problems = pairing.check_pair(d, d)
    assert problems[0].startswith("the target is an assistant drafter")


def test_vocab_and_head_dim_mismatches_are_reported():
    t, d = _cfg("moe-style-target"), copy.deepcopy(_cfg("moe-style-assistant"))
    d["text_config"]["vocab_size"] = 4096
    d["text_config"]["global_head_dim"] = 64
    problems = pairing.check_pair(t, d)
    assert "vocabularies differ: the target has 2048 tokens, the drafter has 4096" in problems
    assert "full-attention head dim differs: the drafter expects 64, the target's layer 4 has 48" in problems
    assert len(problems) == 2


def test_validate_pair_by_local_path(tmp_path):
    ok = pairing.validate_pair(PACK / "e-style-target", PACK / "e-style-assistant")
    assert ok.ok and "fits" in ok.message()
    bad = pairing.validate_pair(PACK / "moe-style-target", PACK / "dense-style-assistant")
    assert not bad.ok and "cannot draft for" in bad.message()
    with pytest.raises(pairing.PairingError, match="no config.json"):
        pairing.validate_pair(tmp_path, PACK / "e-style-assistant")
    with pytest.raises(pairing.PairingError, match="neither a checkpoint directory nor"):
        pairing.validate_pair("not-a-repo", PACK / "e-style-assistant")


def test_validate_pair_by_repo_id_fetches_only_configs(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    repos = {
        "org/t": FakeRepo(
            {"config.json": (PACK / "e-style-target" / "config.json").read_bytes(), "model.safetensors": b"x" * 1000}
        ),
        "org/d": FakeRepo({"config.json": (PACK / "e-style-assistant" / "config.json").read_bytes()}),
    }
    with pytest.raises(pairing.PairingError, match="offline: org/t is not in the Hugging Face cache"):
        pairing.validate_pair("org/t", "org/d", offline=True, cache_dir=tmp_path)
    with FakeHub(repos=repos) as hub:
        check = pairing.validate_pair("org/t", "org/d", cache_dir=tmp_path, endpoint=hub.url)
        assert check.ok
        assert not any(p.endswith("model.safetensors") for _, p, _ in hub.requests)
        with pytest.raises(pairing.PairingError, match="org/missing was not found"):
            pairing.validate_pair("org/missing", "org/d", cache_dir=tmp_path, endpoint=hub.url)
    # now cached: offline works
    assert pairing.validate_pair("org/t", "org/d", offline=True, cache_dir=tmp_path).ok


# -- the local cache view ---------------------------------------------------------------------------

FILES = {"config.json": b'{"model_type": "gemma4"}', "model.safetensors": b"w" * 5000}


def test_repo_status_missing_partial_complete_and_case_insensitive(tmp_path):
    assert hfcache.repo_status("org/none", cache_dir=tmp_path).state == "missing"
    put_in_cache(tmp_path, "org/half", FILES, complete=False)
    half = hfcache.repo_status("org/half", cache_dir=tmp_path)
    assert half.state == "partial" and half.partial_bytes == 2500 and half.snapshot is None
    snap = put_in_cache(tmp_path, "Org/Full-Model", FILES)
    full = hfcache.repo_status("org/full-model", cache_dir=tmp_path)
    assert full.state == "complete" and full.snapshot == snap and full.cached_id == "Org/Full-Model"
    assert full.size_on_disk == sum(len(v) for v in FILES.values())
    scanned = {s.repo_id.lower(): s.state for s in hfcache.scan(tmp_path)}
    assert scanned == {"org/half": "partial", "org/full-model": "complete"}


def test_sharded_snapshot_missing_a_shard_is_not_complete(tmp_path):
    index = json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    )
    files = {
        "config.json": b"{}",
        "model.safetensors.index.json": index.encode(),
        "model-00001-of-00002.safetensors": b"1",
    }
    put_in_cache(tmp_path, "org/sharded", files)
    assert local_snapshot("org/sharded", cache_dir=tmp_path) is None
    assert hfcache.repo_status("org/sharded", cache_dir=tmp_path).state == "partial"


def test_delete_repos_frees_complete_and_partial(tmp_path):
    put_in_cache(tmp_path, "org/a", FILES)
    put_in_cache(tmp_path, "org/b", FILES, complete=False)
    put_in_cache(tmp_path, "org/keep", FILES)
    freed = hfcache.delete_repos(["ORG/A", "org/b"], cache_dir=tmp_path)
    assert freed >= 5000 + 2500
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("models--")) == ["models--org--keep"]
    # org/keep has the same commit hash as the removed ones (put_in_cache's default): untouched.
    assert hfcache.repo_status("org/keep", cache_dir=tmp_path).state == "complete"


def test_resolve_pairing_gives_local_paths_or_says_what_to_run(tmp_path):
    p = catalog.get_pairing("e2b-4bit")
    with pytest.raises(catalog.PairingNotLocal, match="gemma-chat models download e2b-4bit"):
        catalog.resolve_pairing("e2b-4bit", cache_dir=tmp_path)
    t = put_in_cache(tmp_path, p.target_repo, FILES)
    d = put_in_cache(tmp_path, p.drafter_repo, FILES)
    r = catalog.resolve_pairing("e2b-4bit", cache_dir=tmp_path)
    assert (r.target_path, r.drafter_path, r.block_size, r.vision) == (t, d, p.block_size, True)
    entries = {e.pairing.name: e.status for e in catalog.list_entries(cache_dir=tmp_path)}
    assert entries["e2b-4bit"] == "ready" and entries["e2b"] == "partial" and entries["e4b"] == "missing"


def test_fit_of_local_checkpoints_counts_their_weights_and_kv(tmp_path):
    est = fit.estimate_checkpoints(PACK / "dense-style-target", PACK / "dense-style-assistant", context=100)
    weights = sum(
        p.stat().st_size
        for d in ("dense-style-target", "dense-style-assistant")
        for p in (PACK / d).glob("*.safetensors")
    )
    assert est.weights_bytes == weights
    assert est.kv_bytes == fit.kv_cache_bytes(_cfg("dense-style-target")["text_config"], 100) > 0
    tiny = fit.MachineMemory(1000, 1000, "tiny")
    assert fit.check_checkpoints(PACK / "dense-style-target", machine=tiny).level == "wont_fit"


def test_other_local_checkpoints_lists_custom_gemma4_repos_only(tmp_path):
    put_in_cache(tmp_path, "me/my-gemma4", {"config.json": b'{"model_type": "gemma4"}', "model.safetensors": b"w"})
    put_in_cache(
        tmp_path, "me/my-drafter", {"config.json": b'{"model_type": "gemma4_assistant"}', "model.safetensors": b"w"}
    )
    put_in_cache(tmp_path, "me/llama", {"config.json": b'{"model_type": "llama"}', "model.safetensors": b"w"})
    put_in_cache(tmp_path, catalog.get_pairing("e2b").target_repo, FILES)
    found = {c.status.repo_id: c.model_type for c in catalog.other_local_checkpoints(cache_dir=tmp_path)}
    assert found == {"me/my-gemma4": "gemma4", "me/my-drafter": "gemma4_assistant"}


@pytest.mark.parametrize("family", FAMILIES)
def test_factory_mlx_quantized_targets_validate_with_their_drafter(factory_checkpoints, family):
    target = factory_checkpoints.target(family, layout="mlx", dtype="q4")
    assert pairing.validate_pair(target, factory_checkpoints.drafter(family)).ok
    other = "moe-style" if family != "moe-style" else "dense-style"
    assert not pairing.validate_pair(target, factory_checkpoints.drafter(other)).ok


def test_12b_pairings_name_the_unified_assistant_and_fit_a_16_gb_mac_when_quantized():
    """The 12B is the size a 16 GB laptop runs: its 4-bit pairing fits Metal's default 3/4 budget."""
    names = [p.name for p in catalog.load_catalog().pairings if p.family.key == "12b"]
    assert names == ["12b", "12b-8bit", "12b-4bit", "12b-d4"]
    mac16 = fit.MachineMemory(total_bytes=16 * 10**9, budget_bytes=12 * 10**9, note="test")
    four = catalog.get_pairing("12b-4bit")
    assert four.drafter_repo == "mlx-community/gemma-4-12B-it-assistant-bf16" and four.vision
    assert not four.confirmed and "one third-party PR" in four.source  # shown as unconfirmed
    assert fit.check_fit(four.memory().total_bytes, mac16).level == "ok"
    assert fit.check_fit(catalog.get_pairing("12b").memory().total_bytes, mac16).level == "wont_fit"
    # the HF cache folder may hold either spelling of the capitalised repo id
    assert catalog.get_pairing("12b-8bit").target_repo.lower() == "mlx-community/gemma-4-12b-it-8bit"


def test_audio_support_per_family():
    """E2B and E4B (audio tower) and 12B (audio embedder) take audio; 26B-A4B and 31B have none."""
    cat = catalog.load_catalog()
    by_family = {p.family.key: p.audio for p in cat.pairings}
    assert by_family == {"e2b": True, "e4b": True, "12b": True, "26b-a4b": False, "31b": False}
    assert all(p.audio == by_family[p.family.key] for p in cat.pairings)  # every quant of a family alike
