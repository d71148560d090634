"""core.model.memory: the Metal settings, checked on any backend by standing in for Metal's facts."""

import types

import pytest

from core.model import memory
from core.model.target import load_target

PACK = "tests/data/pack/models"


def test_prefill_chunk_size_follows_model_and_free_memory():
    assert memory.prefill_chunk_size(1536, 6144, 8, 131072, None) == 512  # unknown: the default
    assert memory.prefill_chunk_size(1536, 6144, 8, 131072, 64 * 2**30) == 2048
    sizes = [memory.prefill_chunk_size(1536, 6144, 8, 131072, gb * 2**30) for gb in (64, 4, 2, 1, 0.25, 0.01)]
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] == 256 and len(set(sizes)) > 2
    # a wider model gets smaller chunks from the same memory
    assert memory.prefill_chunk_size(5376, 21504, 32, 262144, 2 * 2**30) < sizes[2]


def test_metal_block_cap_is_the_fused_attention_kernels_limit(monkeypatch):
    assert memory.metal_block_cap(8, 1, 256) is None  # not on Metal here
    monkeypatch.setattr(memory, "on_metal", lambda: True)
    assert memory.metal_block_cap(8, 1, 256) == 4  # E2B sliding layers: 4 x 8 = 32
    assert memory.metal_block_cap(16, 8, 128) == 8  # GQA 2: the 8-query limit binds first
    assert memory.metal_block_cap(32, 1, 128) == 1
    assert memory.metal_block_cap(8, 1, 512) is None  # full layers' heads never take the kernel


def test_auto_block_size_stays_within_the_cap_on_metal(monkeypatch):
    from core.decode.spec import Decoder

    tg = load_target(f"{PACK}/e-style-target")
    assert tg.metal_block_cap() is None and Decoder(tg).auto.config.k_max == 8
    monkeypatch.setattr(memory, "on_metal", lambda: True)
    monkeypatch.setattr(memory, "VECTOR_HEAD_DIMS", (24,))  # the pack's tiny sliding head dim, as if supported
    cap = tg.metal_block_cap()
    a = tg.inner.layers[0].self_attn
    assert cap == min(8, 32 // (a.n_heads // a.n_kv_heads))
    assert Decoder(tg).auto.config.k_max == max(2, cap)


def test_wired_limit_sets_and_restores(monkeypatch):
    calls = []
    fake = types.SimpleNamespace(
        metal=types.SimpleNamespace(device_info=lambda: {"max_recommended_working_set_size": 1000}),
        set_wired_limit=lambda n: calls.append(n) or 7,
        synchronize=lambda: calls.append("sync"),
    )
    monkeypatch.setattr(memory, "mx", fake)
    monkeypatch.setattr(memory, "on_metal", lambda: True)
    with memory.wired_limit(5000):
        assert calls == [1000]  # capped at the recommended working set
    assert calls == [1000, "sync", 7]  # the old limit is back
    calls.clear()
    with pytest.raises(RuntimeError), memory.wired_limit(10):
        raise RuntimeError("a failed turn still restores the limit")
    assert calls == [10, "sync", 7]
    monkeypatch.setattr(memory, "on_metal", lambda: False)
    calls.clear()
    with memory.wired_limit(10):
        pass
    assert calls == []
