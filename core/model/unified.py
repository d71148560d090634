"""Gemma 4 12B (`gemma4_unified`): the encoder-free vision embedder and its 48-pixel patches.

The 12B has no vision tower. The processor resizes exactly as for the other sizes (core.model.image:
multiples of 48, at most 9 x budget 16-px patches), but the model takes one row per 48 x 48
"model patch" (3 x 3 merged 16-px patches), 6912 raw values in (row, column, channel) order,
padded with zero rows to `budget` rows, positions (x, y) on the 48-px grid, (-1, -1) for padding.

    pixels [n, 6912] in [0, 1] -> patch_ln1 (LayerNorm, eps 1e-5) -> patch_dense (+ bias) [n, D]
    -> patch_ln2 -> + pos_embedding[x, 0] + pos_embedding[y, 1] -> pos_norm   (= vision_embedder output)
    -> embed_vision: RMSNorm without weight -> embedding_projection [n, H]    (= the soft tokens)

One soft token per model patch, so `PreparedImage.num_soft_tokens` (patches / 9) is the count here
too. The soft tokens replace the image-token embeddings unscaled, as for the other sizes; the
attention rule differs (core.model.target: image tokens see their whole image on every layer).

Precision: the mean and variance of `patch_ln1` over 6912 raw values lose ~2e-4 in float32 on
MLX's CPU backend, so that normalisation runs in float64 on the host (the pixels come from numpy
anyway); its weight and bias, and everything after, run in the model's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from core.model.vision import load_module_weights

if TYPE_CHECKING:
    from core.model.image import PreparedImage

LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, which the unified embedder uses
# Layout prefixes: HF hub names, mlx-community (mlx-vlm keeps hub names without `model.`)
_PREFIXES = ("model.", "")
# transformers renames these on load (conversion_mapping, gemma4_unified); accept its saved names too
_RENAMES = (
    ("embed_vision.multimodal_embedder.embedding_projection.", "embed_vision.embedding_projection."),
    ("embed_vision.patch_ln1.", "vision_embedder.patch_ln1."),
    ("embed_vision.patch_dense.", "vision_embedder.patch_dense."),
    ("embed_vision.patch_ln2.", "vision_embedder.patch_ln2."),
    ("embed_vision.pos_norm.", "vision_embedder.pos_norm."),
    ("embed_vision.pos_embedding", "vision_embedder.pos_embedding"),
)


@dataclass(frozen=True)
class UnifiedVisionConfig:
    patch_size: int
    pooling_kernel_size: int
    model_patch_size: int
    mm_embed_dim: int
    mm_posemb_size: int
    output_proj_dims: int
    rms_norm_eps: float
    text_hidden_size: int

    @property
    def raw_dims(self) -> int:
        return 3 * self.model_patch_size**2

    @classmethod
    def from_model_config(cls, config: dict) -> UnifiedVisionConfig:
        v = config.get("vision_config")
        if not v:
            raise ValueError("config.json has no vision_config")
        text = config.get("text_config") or {}
        try:
            patch, pool = int(v.get("patch_size", 16)), int(v.get("pooling_kernel_size", 3))
            model_patch = int(v.get("model_patch_size") or patch * pool)
            if model_patch != patch * pool:
                raise ValueError(f"model_patch_size {model_patch} is not patch_size x pooling_kernel_size")
            mm = int(v["mm_embed_dim"])
            out = int(v.get("output_proj_dims") or mm)
            if out != mm:
                raise ValueError(f"output_proj_dims {out} must equal mm_embed_dim {mm}")
            return cls(
                patch_size=patch,
                pooling_kernel_size=pool,
                model_patch_size=model_patch,
                mm_embed_dim=mm,
                mm_posemb_size=int(v["mm_posemb_size"]),
                output_proj_dims=out,
                rms_norm_eps=float(v.get("rms_norm_eps", 1e-6)),
                text_hidden_size=int(text.get("hidden_size") or config["hidden_size"]),
            )
        except KeyError as exc:
            raise ValueError(f"vision_config is missing {exc.args[0]!r}") from exc


# -- 16-px patches -> 48-px model patches ----------------------------------------------------------


def merge_patches(
    pixel_values: np.ndarray | mx.array, position_ids: np.ndarray, k: int = 3
) -> tuple[np.ndarray, np.ndarray]:
    """Real 16-px patch rows [N, p*p*3] with positions (x, y) -> the model patches of k x k of them.

    Returns (pixels [N / k^2, (k p)^2 * 3] float32, positions [N / k^2, 2] int64) in row-major order
    of the merged grid; each model patch is flattened (row, column, channel) over its k p pixels.
    Padding rows (position (-1, -1)) are dropped.
    """
    pos = np.asarray(position_ids, dtype=np.int64).reshape(-1, 2)
    pixels = np.asarray(pixel_values, dtype=np.float32)
    real = ~(pos == -1).all(axis=-1)
    pos, pixels = pos[real], pixels.reshape(len(real), -1)[real]
    if not len(pos):
        raise ValueError("the image has no real patches")
    p = int(round((pixels.shape[1] / 3) ** 0.5))
    cols, rows = int(pos[:, 0].max()) + 1, int(pos[:, 1].max()) + 1
    if cols % k or rows % k or len(pos) != rows * cols:
        raise ValueError(f"patch positions do not tile {k}x{k} model patches (a {rows}x{cols} patch grid)")
    image = np.zeros((rows, cols, p, p, 3), np.float32)
    image[pos[:, 1], pos[:, 0]] = pixels.reshape(-1, p, p, 3)
    # [rows/k, k, cols/k, k, p, p, 3] -> [rows/k, cols/k, k (row), p, k (col), p, 3]
    merged = image.reshape(rows // k, k, cols // k, k, p, p, 3).transpose(0, 2, 1, 4, 3, 5, 6)
    out = merged.reshape((rows // k) * (cols // k), (k * p) ** 2 * 3)
    ys, xs = np.divmod(np.arange(out.shape[0]), cols // k)
    return out, np.stack([xs, ys], axis=1).astype(np.int64)


def model_inputs(image: PreparedImage, k: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """A core.model.image.PreparedImage -> the unified processor's padded inputs: pixel_values
    [budget, 6912] and image_position_ids [budget, 2], (-1, -1) and zeros on padding rows."""
    budget = image.pixel_values.shape[0] // (k * k)  # PreparedImage pads to k^2 x budget 16-px rows
    pixels, pos = merge_patches(image.pixel_values, image.position_ids, k)
    padded = np.zeros((budget, pixels.shape[1]), np.float32)
    padded[: len(pixels)] = pixels
    positions = np.full((budget, 2), -1, np.int64)
    positions[: len(pos)] = pos
    return padded, positions


# -- the embedder ----------------------------------------------------------------------------------


class VisionEmbedderBlock(nn.Module):
    """`vision_embedder`, with the checkpoint's parameter names."""

    def __init__(self, cfg: UnifiedVisionConfig):
        super().__init__()
        d = cfg.mm_embed_dim
        self.patch_ln1 = nn.LayerNorm(cfg.raw_dims, eps=LAYER_NORM_EPS)
        self.patch_dense = nn.Linear(cfg.raw_dims, d, bias=True)
        self.patch_ln2 = nn.LayerNorm(d, eps=LAYER_NORM_EPS)
        self.pos_embedding = mx.zeros((cfg.mm_posemb_size, 2, d))
        self.pos_norm = nn.LayerNorm(d, eps=LAYER_NORM_EPS)

    def __call__(self, normalized: mx.array, positions: mx.array) -> mx.array:
        """normalized [n, 6912]: pixels already standardised per row (see `standardize_rows`)."""
        dtype = self.pos_embedding.dtype
        h = normalized.astype(dtype) * self.patch_ln1.weight + self.patch_ln1.bias
        h = self.patch_ln2(self.patch_dense(h))
        table = self.pos_embedding
        h = h + table[positions[:, 0], 0] + table[positions[:, 1], 1]
        return self.pos_norm(h)


class EmbedVision(nn.Module):
    def __init__(self, cfg: UnifiedVisionConfig):
        super().__init__()
        self.eps = cfg.rms_norm_eps
        self.embedding_projection = nn.Linear(cfg.output_proj_dims, cfg.text_hidden_size, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.embedding_projection(mx.fast.rms_norm(x, None, self.eps))


def standardize_rows(pixels: np.ndarray, eps: float = LAYER_NORM_EPS) -> np.ndarray:
    """(x - mean) / sqrt(var + eps) per row, in float64: the weightless part of `patch_ln1`."""
    x = np.asarray(pixels, dtype=np.float64)
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return ((x - mean) / np.sqrt(var + eps)).astype(np.float32)


class UnifiedVisionEncoder(nn.Module):
    """The 12B's `vision_embedder` + `embed_vision`; same interface as core.model.vision.VisionEncoder."""

    def __init__(self, cfg: UnifiedVisionConfig):
        super().__init__()
        self.config = cfg
        self.vision_embedder = VisionEmbedderBlock(cfg)
        self.embed_vision = EmbedVision(cfg)

    def _inputs(self, pixel_values: np.ndarray | mx.array, position_ids: np.ndarray) -> tuple[mx.array, mx.array]:
        pixels = np.asarray(pixel_values, dtype=np.float32)
        pos = np.asarray(position_ids, dtype=np.int64)
        pixels, pos = pixels.reshape(-1, pixels.shape[-1]), pos.reshape(-1, 2)
        if pixels.shape[1] != self.config.raw_dims:
            raise ValueError(
                f"unified model patches have {self.config.raw_dims} values, got {pixels.shape[1]} "
                "(merge 16-px patches with core.model.unified.merge_patches)"
            )
        real = ~(pos == -1).all(axis=-1)
        if not real.any():
            raise ValueError("the image has no real patches")
        pixels, pos = pixels[real], pos[real]
        if pos.min() < 0 or pos.max() >= self.config.mm_posemb_size:
            raise ValueError(
                f"patch positions must lie in [0, {self.config.mm_posemb_size}) for this vision embedder "
                f"(got up to {int(pos.max())}); use a smaller image token budget"
            )
        return mx.array(standardize_rows(pixels)), mx.array(pos.astype(np.int32))

    def embedder(self, pixel_values: np.ndarray | mx.array, position_ids: np.ndarray) -> mx.array:
        """The `vision_embedder` output for one image: [n_real, mm_embed_dim]. Inputs are the unified
        processor's: pixel_values [(1,) budget, 6912] in [0, 1], positions [(1,) budget, 2]."""
        return self.vision_embedder(*self._inputs(pixel_values, position_ids))

    def encode(self, pixel_values: np.ndarray | mx.array, position_ids: np.ndarray) -> mx.array:
        """Soft tokens for one image: [n_real, text hidden]."""
        return self.embed_vision(self.embedder(pixel_values, position_ids))

    def encode_image(self, image: PreparedImage) -> mx.array:
        """Soft tokens for a core.model.image.PreparedImage (16-px patches; merged here)."""
        pixels, pos = merge_patches(image.pixel_values, image.position_ids, self.config.pooling_kernel_size)
        return self.encode(pixels, pos)

    def soft_token_count(self, position_ids: np.ndarray) -> int:
        pos = np.asarray(position_ids).reshape(-1, 2)
        return int((~(pos == -1).all(axis=-1)).sum())

    @classmethod
    def from_weights(
        cls, config: dict, weights: dict[str, mx.array], dtype: mx.Dtype | None = None
    ) -> UnifiedVisionEncoder | None:
        own = select_unified_weights(weights)
        if not own or not config.get("vision_config"):
            return None
        model = cls(UnifiedVisionConfig.from_model_config(config))
        return load_module_weights(model, own, config, dtype)


def select_unified_weights(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """`vision_embedder.*` and `embed_vision.*` of any layout, under this module's names."""
    out = {}
    for key, value in weights.items():
        for prefix in _PREFIXES:
            if not key.startswith(prefix):
                continue
            name = key[len(prefix) :]
            for old, new in _RENAMES:
                if name.startswith(old):
                    name = new + name[len(old) :]
                    break
            if name.startswith(("vision_embedder.", "embed_vision.")):
                out[name] = value
                break
    return out


def is_unified_vision_weight(name: str) -> bool:
    """Whether `select_unified_weights` keeps a tensor of this name (the encoder-free embedder's)."""
    return bool(select_unified_weights({name: mx.array(0)}))


def load_unified_vision(model_dir: str | Path, dtype: mx.Dtype | None = None) -> UnifiedVisionEncoder | None:
    from core.model.loader import load_safetensors, read_checkpoint_json, weight_files, weight_index

    model_dir = Path(model_dir)
    config = read_checkpoint_json(model_dir, "config.json")
    index = weight_index(model_dir)
    if index is not None:
        files = sorted({f for n, f in index.items() if is_unified_vision_weight(n)})
    else:
        files = weight_files(model_dir, "*.safetensors")

    weights: dict[str, mx.array] = {}
    for path in files:
        weights.update(select_unified_weights(load_safetensors(path)))
    return UnifiedVisionEncoder.from_weights(config, weights, dtype=dtype)
