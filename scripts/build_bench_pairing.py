"""Build a synthetic e-style pairing big enough for `gemma-chat bench` on a CPU.

    .venv/bin/python scripts/build_bench_pairing.py OUT_DIR [--size medium]

The demo pairing is so small that per-op overhead dominates its timings; these sizes make the
matmuls the main cost, as they are for real checkpoints. Random weights (factory), float32.
Then: gemma-chat bench --model OUT_DIR/e-style-target --drafter OUT_DIR/e-style-assistant
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # tests/support: factory, fake engine

from core.user.kernel_cache import use_private_kernel_cache  # noqa: E402

use_private_kernel_cache()  # before mlx runs anything: its compiled kernels go to gemma-chat's private folder

S, F = "sliding_attention", "full_attention"

SIZES = {
    "small": {
        "hidden_size": 512,
        "intermediate_size": 2048,
        "num_hidden_layers": 6,
        "layer_types": [S, S, F, S, S, F],
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "global_head_dim": 128,
        "num_kv_shared_layers": 3,
        "sliding_window": 128,
        "drafter": {"hidden_size": 128, "intermediate_size": 512, "num_attention_heads": 4},
    },
    "medium": {
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_hidden_layers": 8,
        "layer_types": [S, S, S, F, S, S, S, F],
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "global_head_dim": 256,
        "num_kv_shared_layers": 4,
        "sliding_window": 128,
        "drafter": {"hidden_size": 256, "intermediate_size": 1024, "num_attention_heads": 4},
    },
    # E2B's widths (hidden 1536, MLP 6144, 8 heads of 256), fewer layers: products as wide as a real target's
    "e2b-wide": {
        "hidden_size": 1536,
        "intermediate_size": 6144,
        "num_hidden_layers": 6,
        "layer_types": [S, S, F, S, S, F],
        "num_attention_heads": 8,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "global_head_dim": 512,
        "num_kv_shared_layers": 3,
        "sliding_window": 128,
        "drafter": {"hidden_size": 256, "intermediate_size": 2048, "num_attention_heads": 4},
    },
}


def build(out_dir, size: str = "medium", dtype: str = "float32"):
    from support.factory import build_pairing

    overrides = dict(SIZES[size])
    return build_pairing(out_dir, "e-style", "hf", dtype, 0, config_overrides=overrides)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--size", choices=sorted(SIZES), default="medium")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    a = p.parse_args()
    target, drafter = build(a.out_dir, a.size, a.dtype)
    print(f"--model {target} --drafter {drafter}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
