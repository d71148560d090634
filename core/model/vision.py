"""Gemma 4 vision tower + `embed_vision`: patch rows from core.model.image -> soft tokens in text width.

Data flow for one image (n real patches, D = vision hidden, H = text hidden):

    pixels [n, 768] in [0,1] --x2-1--> input_proj --+ pos_table[0][x] + pos_table[1][y]--> [n, D]
    -> N bidirectional blocks (q/k RMSNorm with weight, v RMSNorm without, axial 2-D RoPE, GeGLU,
       linears optionally clipped by their input/output bounds)
    -> mean over each 3x3 block of patch positions -> * sqrt(D) -> (x - std_bias) * std_scale
       [n/9, D]  (= HF's `vision_tower` output)
    -> weightless RMSNorm -> embedding_projection [n/9, H]  (= the soft tokens)

Padding rows (position (-1, -1)) are dropped before the encoder. The reference masks them out as
keys and zeroes them before pooling, so dropping them gives the same result and saves the work.

How the soft tokens go into a prompt (done by the engine): the prompt holds `boi` + `image_token_id`
x num_soft_tokens + `eoi` per image (`core.decode.prompt.expand_images` builds it from
`PreparedImage.num_soft_tokens` and returns each image's span [start, end)). Embed the ids as usual
(times the text embed scale sqrt(H)), then overwrite the rows of each run with that image's soft
tokens as they are: they are NOT multiplied by the embed scale. For per-layer inputs (PLE, E2B/E4B)
use the pad id 0 in place of the image token id at those positions. With
`use_bidirectional_attention: "vision"` each run is also the unit of the bidirectional overlay of
the attention mask (see tests/data/pack/README.md, "Image attention mask").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from core.model.layers import geglu_for
from core.model.loader import load_safetensors, read_checkpoint_json, weight_files, weight_index

if TYPE_CHECKING:
    from core.model.image import PreparedImage

M = TypeVar("M", bound=nn.Module)

# Weight-name prefixes of the two layouts: HF/Google, then mlx-community (mlx-vlm's conversion).
_PREFIXES = ("model.", "")
_PARTS = ("vision_tower.", "embed_vision.")
_CLIP_BOUNDS = ("input_min", "input_max", "output_min", "output_max")
_SCORE_BUDGET = 64 * 1024 * 1024  # attention scores held at once (elements)


@dataclass(frozen=True)
class VisionConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    patch_size: int
    pooling_kernel_size: int
    position_embedding_size: int
    use_clipped_linears: bool
    standardize: bool
    hidden_activation: str
    text_hidden_size: int

    @classmethod
    def from_model_config(cls, config: dict) -> VisionConfig:
        """From a whole checkpoint `config.json` (needs `vision_config` and `text_config.hidden_size`)."""
        v = config.get("vision_config")
        if not v:
            raise ValueError("config.json has no vision_config")
        text = config.get("text_config") or {}
        try:
            heads = int(v["num_attention_heads"])
            rope = v.get("rope_parameters") or {}
            theta = rope.get("rope_theta", v.get("rope_theta"))
            if theta is None:
                raise KeyError("rope_parameters.rope_theta")
            act = v.get("hidden_activation") or v.get("hidden_act") or "gelu_pytorch_tanh"
            if act not in ("gelu_pytorch_tanh", "gelu_approx", "gelu_new"):
                raise ValueError(f"unsupported vision activation {act!r}")
            return cls(
                hidden_size=int(v["hidden_size"]),
                intermediate_size=int(v["intermediate_size"]),
                num_hidden_layers=int(v["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=int(v.get("num_key_value_heads") or heads),
                head_dim=int(v.get("head_dim") or int(v["hidden_size"]) // heads),
                rms_norm_eps=float(v.get("rms_norm_eps", 1e-6)),
                rope_theta=float(theta),
                patch_size=int(v["patch_size"]),
                pooling_kernel_size=int(v["pooling_kernel_size"]),
                position_embedding_size=int(v["position_embedding_size"]),
                use_clipped_linears=bool(v.get("use_clipped_linears", False)),
                standardize=bool(v.get("standardize", False)),
                hidden_activation=act,
                text_hidden_size=int(text.get("hidden_size") or config["hidden_size"]),
            )
        except KeyError as exc:
            raise ValueError(f"vision_config is missing {exc.args[0]!r}") from exc


class ClippableLinear(nn.Module):
    """A bias-free linear whose input and output may be clamped to calibrated scalar bounds."""

    def __init__(self, in_dims: int, out_dims: int, clipped: bool):
        super().__init__()
        self.linear = nn.Linear(in_dims, out_dims, bias=False)
        self.clipped = clipped
        if clipped:  # +-inf until the checkpoint's bounds are loaded
            self.input_min = mx.array(-math.inf)
            self.input_max = mx.array(math.inf)
            self.output_min = mx.array(-math.inf)
            self.output_max = mx.array(math.inf)

    def __call__(self, x: mx.array) -> mx.array:
        if self.clipped:
            x = mx.clip(x, self.input_min.astype(x.dtype), self.input_max.astype(x.dtype))
        x = self.linear(x)
        if self.clipped:
            x = mx.clip(x, self.output_min.astype(x.dtype), self.output_max.astype(x.dtype))
        return x


class RMSNorm(nn.Module):
    """Gemma 4 norm: the weight multiplies directly (no 1 + w). weightless=True has no weight."""

    def __init__(self, dims: int, eps: float, weightless: bool = False):
        super().__init__()
        self.eps = eps
        self.weightless = weightless
        if not weightless:
            self.weight = mx.ones((dims,))

    def __call__(self, x: mx.array) -> mx.array:
        return mx.fast.rms_norm(x, None if self.weightless else self.weight, self.eps)


def axial_rope_tables(positions: mx.array, head_dim: int, theta: float) -> tuple[mx.array, mx.array]:
    """cos/sin [n, head_dim] for 2-D positions [n, 2]: the first half of each head rotates by x, the second by y.

    Each half is a standard rotate-half RoPE over head_dim/2 channels with the same
    frequencies theta^(-2i / (head_dim/2)).
    """
    half = head_dim // 2
    inv_freq = 1.0 / (theta ** (mx.arange(0, half, 2, dtype=mx.float32) / half))  # [half/2]
    angles_x = positions[:, 0:1].astype(mx.float32) * inv_freq  # [n, half/2]
    angles_y = positions[:, 1:2].astype(mx.float32) * inv_freq
    angles = mx.concatenate([angles_x, angles_x, angles_y, angles_y], axis=-1)  # [n, head_dim]
    return mx.cos(angles), mx.sin(angles)


def _apply_axial_rope(x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
    # x [n, heads, head_dim]; rotate-half inside each of the two halves separately
    d = x.shape[-1]
    q = d // 4
    x1, x2, y1, y2 = x[..., :q], x[..., q : 2 * q], x[..., 2 * q : 3 * q], x[..., 3 * q :]
    rotated = mx.concatenate([-x2, x1, -y2, y1], axis=-1)
    cos, sin = cos[:, None, :].astype(x.dtype), sin[:, None, :].astype(x.dtype)
    return x * cos + rotated * sin


class VisionAttention(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.n_heads = cfg.num_attention_heads
        self.n_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        clip = cfg.use_clipped_linears
        self.q_proj = ClippableLinear(cfg.hidden_size, self.n_heads * self.head_dim, clip)
        self.k_proj = ClippableLinear(cfg.hidden_size, self.n_kv_heads * self.head_dim, clip)
        self.v_proj = ClippableLinear(cfg.hidden_size, self.n_kv_heads * self.head_dim, clip)
        self.o_proj = ClippableLinear(self.n_heads * self.head_dim, cfg.hidden_size, clip)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.v_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps, weightless=True)

    def __call__(self, x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
        n = x.shape[0]
        q = self.q_norm(self.q_proj(x).reshape(n, self.n_heads, self.head_dim))
        k = self.k_norm(self.k_proj(x).reshape(n, self.n_kv_heads, self.head_dim))
        v = self.v_norm(self.v_proj(x).reshape(n, self.n_kv_heads, self.head_dim))
        q = _apply_axial_rope(q, cos, sin)
        k = _apply_axial_rope(k, cos, sin)
        # [1, heads, n, head_dim]; bidirectional, no mask (padding was dropped); q/k are normed: scale 1
        q, k, v = (t.transpose(1, 0, 2)[None] for t in (q, k, v))
        # Big images in query blocks: the unfused paths (CPU, head_dim 72) materialise
        # heads x queries x n scores, 6.5 GB at 1120 soft tokens if done at once.
        block = max(256, _SCORE_BUDGET // (self.n_heads * n))
        if block >= n:
            out = mx.fast.scaled_dot_product_attention(q, k, v, scale=1.0)
        else:
            parts = [
                mx.fast.scaled_dot_product_attention(q[:, :, i : i + block], k, v, scale=1.0)
                for i in range(0, n, block)
            ]
            out = mx.concatenate(parts, axis=2)
        return self.o_proj(out[0].transpose(1, 0, 2).reshape(n, -1))


class VisionMLP(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        clip = cfg.use_clipped_linears
        self.gate_proj = ClippableLinear(cfg.hidden_size, cfg.intermediate_size, clip)
        self.up_proj = ClippableLinear(cfg.hidden_size, cfg.intermediate_size, clip)
        self.down_proj = ClippableLinear(cfg.intermediate_size, cfg.hidden_size, clip)

    def __call__(self, x: mx.array) -> mx.array:
        # one fused GeGLU (written with exp on the CPU backend: core.model.layers) instead of six passes
        return self.down_proj(geglu_for(x.dtype)(self.gate_proj(x), self.up_proj(x)))


class VisionBlock(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        eps = cfg.rms_norm_eps
        self.self_attn = VisionAttention(cfg)
        self.mlp = VisionMLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.pre_feedforward_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, eps)

    def __call__(self, x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class PatchEmbedder(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.input_proj = nn.Linear(3 * cfg.patch_size**2, cfg.hidden_size, bias=False)
        self.position_embedding_table = mx.zeros((2, cfg.position_embedding_size, cfg.hidden_size))

    def __call__(self, pixels: mx.array, positions: mx.array) -> mx.array:
        # pixels [n, 768] in [0, 1]; the model was trained on [-1, 1]
        dtype = self.position_embedding_table.dtype
        h = self.input_proj((2.0 * (pixels - 0.5)).astype(dtype))
        table = self.position_embedding_table
        return h + table[0][positions[:, 0]] + table[1][positions[:, 1]]


class Encoder(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.layers = [VisionBlock(cfg) for _ in range(cfg.num_hidden_layers)]


class VisionTower(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.cfg = cfg
        self.patch_embedder = PatchEmbedder(cfg)
        self.encoder = Encoder(cfg)
        if cfg.standardize:
            self.std_bias = mx.zeros((cfg.hidden_size,))
            self.std_scale = mx.ones((cfg.hidden_size,))

    def __call__(self, pixels: mx.array, positions: mx.array, pool_order: mx.array) -> mx.array:
        """pixels [n, 768], positions [n, 2] (no padding), pool_order [n/k^2, k^2] -> [n/k^2, D] float32."""
        cfg = self.cfg
        h = self.patch_embedder(pixels, positions)
        cos, sin = axial_rope_tables(positions, cfg.head_dim, cfg.rope_theta)
        for layer in self.encoder.layers:
            h = layer(h, cos, sin)
        # Pooling and the sqrt(D) scale run in float32: the scale pushes values past float16 range.
        k2 = pool_order.shape[1]
        pooled = h.astype(mx.float32)[pool_order].sum(axis=1) / k2  # [n/k^2, D]
        pooled = pooled * math.sqrt(cfg.hidden_size)
        if cfg.standardize:
            pooled = (pooled - self.std_bias.astype(mx.float32)) * self.std_scale.astype(mx.float32)
        return pooled


class VisionEmbedder(nn.Module):
    """`embed_vision`: weightless RMSNorm, then a bias-free projection to the text width."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.eps = cfg.rms_norm_eps
        self.embedding_projection = nn.Linear(cfg.hidden_size, cfg.text_hidden_size, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.embedding_projection(mx.fast.rms_norm(x, None, self.eps))


def pooling_order(position_ids: np.ndarray, k: int) -> np.ndarray:
    """[n_cells, k*k] row indices of the real patches in each k x k cell, cells in row-major order.

    Cells are numbered like the reference does (cell_x + cells_wide * cell_y), so the output
    order is row-major over the pooled grid whatever the order of the patch rows.
    """
    pos = np.asarray(position_ids, dtype=np.int64)
    cx, cy = pos[:, 0] // k, pos[:, 1] // k
    cells_wide = (int(pos[:, 0].max()) + 1) // k
    cell = cx + cells_wide * cy
    order = np.argsort(cell, kind="stable")
    _, counts = np.unique(cell, return_counts=True)
    if not (counts == k * k).all():
        raise ValueError(
            f"patch positions do not tile {k}x{k} pooling cells (image sides must be multiples of {k} patches)"
        )
    return order.reshape(-1, k * k).astype(np.int32)


class VisionEncoder(nn.Module):
    """The checkpoint's `vision_tower` and `embed_vision`, with the same parameter names."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.config = cfg
        self.vision_tower = VisionTower(cfg)
        self.embed_vision = VisionEmbedder(cfg)

    # -- inputs ---------------------------------------------------------------------------
    def _real_inputs(
        self, pixel_values: np.ndarray | mx.array, position_ids: np.ndarray
    ) -> tuple[mx.array, mx.array, mx.array]:
        pos = np.asarray(position_ids)
        pixels = pixel_values
        if pos.ndim == 3:
            if pos.shape[0] != 1:
                raise ValueError("encode takes one image at a time")
            pos = pos[0]
            pixels = pixels[0]
        real = np.flatnonzero(~(pos == -1).all(axis=-1))
        if real.size == 0:
            raise ValueError("the image has no real patches")
        pos = pos[real]
        if pos.min() < 0 or pos.max() >= self.config.position_embedding_size:
            raise ValueError(
                f"patch positions must lie in [0, {self.config.position_embedding_size}) for this vision tower "
                f"(got up to {int(pos.max())}); use a smaller image token budget"
            )
        order = pooling_order(pos, self.config.pooling_kernel_size)
        if isinstance(pixels, mx.array):
            if real.size != pixels.shape[0]:
                pixels = pixels[mx.array(real.astype(np.int32))]
        else:
            pixels = mx.array(np.asarray(pixels, dtype=np.float32)[real])
        return pixels, mx.array(pos.astype(np.int32)), mx.array(order)

    def soft_token_count(self, position_ids: np.ndarray) -> int:
        """Soft tokens the tower returns for these positions: real patches / pool^2."""
        pos = np.asarray(position_ids).reshape(-1, 2)
        real = int((~(pos == -1).all(axis=-1)).sum())
        return real // self.config.pooling_kernel_size**2

    # -- forward --------------------------------------------------------------------------
    def tower(self, pixel_values: np.ndarray | mx.array, position_ids: np.ndarray) -> mx.array:
        """HF's `vision_tower` output for one image: [n_soft, D] float32 (pooled, scaled, standardised)."""
        pixels, pos, order = self._real_inputs(pixel_values, position_ids)
        return self.vision_tower(pixels, pos, order)

    def encode(self, pixel_values: np.ndarray | mx.array, position_ids: np.ndarray) -> mx.array:
        """Soft tokens for one image: [n_soft, text hidden], in the projection's dtype.

        pixel_values [N, p*p*3] (or [1, N, ...]) in [0, 1], numpy or mx; position_ids [N, 2]
        (or [1, N, 2]) with (-1, -1) on padding rows, as core.model.image.preprocess_image makes them.
        """
        pooled = self.tower(pixel_values, position_ids)
        dtype = self.vision_tower.patch_embedder.position_embedding_table.dtype
        return self.embed_vision(pooled.astype(dtype))

    def encode_image(self, image: PreparedImage) -> mx.array:
        """Soft tokens for a core.model.image.PreparedImage."""
        n = image.num_patches
        return self.encode(image.pixel_values[:n], image.position_ids[:n])

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def from_weights(
        cls, config: dict, weights: dict[str, mx.array], dtype: mx.Dtype | None = None
    ) -> VisionEncoder | None:
        """Build from a checkpoint config.json dict and its weights (any layout; non-vision keys ignored).

        Returns None when the weights hold no vision tower. A linear is quantized when
        `<name>.scales` is present; its bits and group size follow from the shapes.
        """
        own = select_vision_weights(weights)
        if not own or not config.get("vision_config"):
            return None
        cfg = VisionConfig.from_model_config(config)
        model = cls(cfg)
        if not cfg.use_clipped_linears:
            own = {k: v for k, v in own.items() if k.rsplit(".", 1)[-1] not in _CLIP_BOUNDS}
        return load_module_weights(model, own, config, dtype)


def load_module_weights(model: M, own: dict[str, mx.array], config: dict, dtype: mx.Dtype | None) -> M:
    """Quantize `model` as the checkpoint's weights are (if they are), load `own` into it strictly (floats
    cast to `dtype` when given) and evaluate it: the shared tail of every image encoder's load."""
    _quantize_like(model, own, _quant_mode(config))
    if dtype is not None:
        own = {k: v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v for k, v in own.items()}
    model.load_weights(list(own.items()), strict=True)
    model.eval()
    mx.eval(model.parameters())
    return model


def select_vision_weights(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """The vision keys of either layout, renamed to this module's names (`vision_tower.*`, `embed_vision.*`)."""
    out = {}
    for key, value in weights.items():
        for prefix in _PREFIXES:
            if key.startswith(prefix) and key[len(prefix) :].startswith(_PARTS):
                name = key[len(prefix) :]
                if "rotary_emb" not in name:
                    out[name] = value
                break
    return out


def _quant_mode(config: dict) -> str:
    q = config.get("quantization") or config.get("quantization_config") or {}
    return q.get("mode", "affine") if isinstance(q, dict) else "affine"


def _quantize_like(model: nn.Module, weights: dict[str, mx.array], mode: str) -> None:
    def predicate(path: str, module: nn.Module) -> bool | dict:
        if not isinstance(module, nn.Linear) or f"{path}.scales" not in weights:
            return False
        in_dims = module.weight.shape[1]
        packed, scales = weights[f"{path}.weight"], weights[f"{path}.scales"]
        bits = packed.shape[-1] * 32 // in_dims
        group_size = in_dims // scales.shape[-1]
        return {"group_size": group_size, "bits": bits, "mode": mode}

    nn.quantize(model, class_predicate=predicate)


def vision_weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files that hold vision weights (all of them when there is no index)."""
    index = weight_index(model_dir)
    if index is not None:
        names = {f for k, f in index.items() if any(k.startswith(p + part) for p in _PREFIXES for part in _PARTS)}
        return sorted(names)
    return weight_files(model_dir, "*.safetensors")


def load_vision_tower(model_dir: str | Path, dtype: mx.Dtype | None = None) -> VisionEncoder | None:
    """Load the vision tower + embedder of a checkpoint directory, or None if it has none (the 12B's
    encoder-free embedder is core.model.unified's; core.model.encoders.load_vision picks).

    `dtype` casts the float weights (e.g. mx.float32 for parity checks); None keeps the
    checkpoint's dtype. mx.load is lazy, so only the vision tensors of a shard are read.
    """
    model_dir = Path(model_dir)
    config = read_checkpoint_json(model_dir, "config.json")
    if not config.get("vision_config"):
        return None
    weights: dict[str, mx.array] = {}
    for path in vision_weight_files(model_dir):
        weights.update(select_vision_weights(load_safetensors(path)))
    return VisionEncoder.from_weights(config, weights, dtype=dtype)
