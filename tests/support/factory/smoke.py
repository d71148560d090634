"""Real-shape smoke run: build an E2B/E4B/12B-sized random checkpoint, load it with mlx-lm, generate,
then generate again with gemma-chat's engine and the matching drafter (block 2) and without it, and
(E2B/E4B/12B) once more from a 0.5 s audio clip through the real-size audio tower or embedder (on a
Linux CPU the real tower alone takes about a minute per second of audio).

    python -m support.factory.smoke [--shape E2B] [--dtypes bfloat16,q4] [--root DIR] [--tokens 32]

Reports per dtype: build seconds, size on disk, load seconds, peak memory after load and after
generation (`mx.get_peak_memory()`), prompt and generation tok/s. It needs ~10 GB of disk and RAM
for a bf16 E2B (its per-layer embedding table alone is 262144 x 8960). The weights are random, so
the text is noise; the point is shapes, loading and speed.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any


def _dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.iterdir() if p.is_file())


def _drafter_figures(root: Path, shape: str, dtype: str, target_dir: Path) -> dict:
    """Build the matching drafter, load it with the engine's loader and check the pair."""
    import mlx.core as mx

    from support.factory import build_drafter

    out = root / f"{shape}-assistant"
    t0 = time.perf_counter()
    build_drafter(out, dtype=dtype, full_config=shape)
    built = time.perf_counter() - t0
    figures: dict[str, Any] = {"drafter_build_s": round(built, 1), "drafter_disk_gb": round(_dir_bytes(out) / 1e9, 3)}
    try:
        from core.hub.pairing import check_pair
        from core.model.drafter import load_drafter
    except ImportError as e:  # the engine is written separately
        figures["drafter_load"] = f"skipped: {e}"
        return figures
    t0 = time.perf_counter()
    drafter = load_drafter(out)
    figures["drafter_load_s"] = round(time.perf_counter() - t0, 2)
    figures["drafter_params_m"] = round(sum(v.size for _, v in _leaves(drafter.parameters())) / 1e6, 1)

    def read(d: Path) -> dict:
        return json.loads((d / "config.json").read_text())

    figures["pair_problems"] = check_pair(read(target_dir), read(out))
    del drafter
    mx.clear_cache()
    figures.update(_engine_figures(target_dir, out))
    return figures


def _engine_figures(target_dir: Path, drafter_dir: Path, max_tokens: int = 4) -> dict:
    """Generate with gemma-chat's own engine, drafter on (block 2) and off, same prompt."""
    from core.engine.contract import PairingSpec
    from core.engine.local import Engine
    from core.settings import GenerationSettings

    engine = Engine()
    try:
        t0 = time.perf_counter()
        engine.load(PairingSpec("smoke", str(target_dir), str(drafter_dir)), lambda e: None).result()
        figures = {"engine_load_s": round(time.perf_counter() - t0, 1)}
        for name, drafter_on in (("mtp", True), ("plain", False)):
            settings = GenerationSettings(
                max_tokens=max_tokens, block_size=2, drafter_enabled=drafter_on, ignore_eos=True
            )
            done = engine.complete("Hello", settings, lambda e: None).result()
            if done.error:
                figures[f"{name}_error"] = done.error
                continue
            s = done.stats
            figures[f"{name}_tokens"] = len(done.token_ids)
            figures[f"{name}_decode_tps"] = round(s.decode_tps, 3)
            figures[f"{name}_acceptance"] = round(s.acceptance, 2)
            figures[f"{name}_peak_mem_gb"] = round(s.peak_memory_bytes / 1e9, 2)
        if engine.features.audio:
            figures.update(_audio_figures(engine, target_dir.parent / "smoke-clip.wav"))
        return figures
    finally:
        engine.close()


def _audio_figures(engine: Any, clip: Path, seconds: float = 0.5) -> dict:
    """One turn from a synthetic clip (a 440 Hz tone): its prompt length, prefill time and tokens."""
    import numpy as np
    import soundfile as sf

    from core.settings import GenerationSettings

    t = np.arange(int(16000 * seconds)) / 16000
    sf.write(clip, 0.3 * np.sin(2 * np.pi * 440 * t), 16000, subtype="PCM_16")
    messages = [{"role": "user", "content": [{"type": "audio", "path": str(clip)}, {"type": "text", "text": "Hi"}]}]
    settings = GenerationSettings(max_tokens=2, block_size=2, ignore_eos=True)
    done = engine.chat(messages, settings, lambda e: None).result()
    if done.error:
        return {"audio_error": done.error}
    return {
        "audio_prompt_tokens": done.stats.prompt_tokens,
        "audio_prefill_s": round(done.stats.prefill_s, 2),
        "audio_tokens": len(done.token_ids),
    }


def _leaves(tree: Any) -> Any:
    from mlx.utils import tree_flatten

    return tree_flatten(tree)


def smoke_one(
    root: Path,
    shape: str,
    dtype: str,
    max_tokens: int = 3,
    keep: bool = False,
    prompt_tokens: int = 4,
    with_drafter: bool = True,
) -> dict:
    import mlx.core as mx
    import mlx_lm

    from support.factory import build_checkpoint

    layout = "mlx" if dtype == "q4" else "hf"
    out = root / f"{shape}-{layout}-{dtype}"
    t0 = time.perf_counter()
    if not (out / "config.json").exists() or not keep:
        build_checkpoint(out, layout=layout, dtype=dtype, full_config=shape)
    built = time.perf_counter() - t0

    mx.reset_peak_memory()
    t0 = time.perf_counter()
    model, tokenizer = mlx_lm.load(str(out))  # type: ignore[misc]  # typed as 2 or 3 values; 2 without return_config
    loaded = time.perf_counter() - t0
    peak_load = mx.get_peak_memory()

    # A short prompt: MLX's CPU backend needs ~20 s per E2B token (quantized or bf16 matmuls
    # run single-threaded without BLAS), so on Linux this measures loading more than speed.
    prompt = tokenizer.encode("<|turn>model\n", add_special_tokens=True)[:prompt_tokens]
    last = None
    tokens = []
    for last in mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens=max_tokens):
        tokens.append(last.token)
    assert last is not None, "mlx-lm generated nothing"
    report = {
        "shape": shape,
        "layout": layout,
        "dtype": dtype,
        "build_s": round(built, 1),
        "disk_gb": round(_dir_bytes(out) / 1e9, 2),
        "load_s": round(loaded, 2),
        "peak_mem_after_load_gb": round(peak_load / 1e9, 2),
        "peak_mem_gb": round(mx.get_peak_memory() / 1e9, 2),
        "prompt_tokens": len(prompt),
        "generated_tokens": len(tokens),
        "prompt_tps": round(last.prompt_tps, 1),
        "generation_tps": round(last.generation_tps, 2),
        "vocab_size": model.args.vocab_size if hasattr(model.args, "vocab_size") else None,
        "text": last and tokenizer.decode(tokens)[:80],
    }
    del model, tokenizer
    gc.collect()
    mx.clear_cache()
    if with_drafter:
        report.update(_drafter_figures(root, shape, dtype, out))
    if not keep:
        shutil.rmtree(out, ignore_errors=True)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="E2B")
    ap.add_argument("--dtypes", default="bfloat16,q4")
    ap.add_argument("--root", default=None)
    ap.add_argument("--tokens", type=int, default=3)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args(argv)
    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="gemma-chat-smoke-"))
    for dtype in args.dtypes.split(","):
        print(json.dumps(smoke_one(root, args.shape, dtype, args.tokens, args.keep)), flush=True)
    if not args.keep and not args.root:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
