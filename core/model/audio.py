"""Gemma 4 audio encoders: log-mel frames (E2B/E4B conformer tower) or raw 40 ms frames (12B
embedder) -> audio soft tokens in text width.

E2B/E4B (`audio_config.model_type: gemma4_audio`; features from core.model.audio_features, valid
rows only; D = audio hidden, C = subsampling channels, H = text hidden):

    features [V, 128] -> SSCP: 2 x (conv 3x3 stride 2 pad 1, LayerNorm over channels, ReLU)
       -> [ceil(V/4), 32, C] -> flatten (f * C + c) -> input_proj_linear [n, D]
    -> N conformer layers:  x += 0.5 FF1(x);  x += post_norm(ATTN(pre_norm(x)));  x += LCONV(x);
       x += 0.5 FF2(x);  x = norm_out(x)
    -> output_proj (with bias) [n, out]  (= HF's `audio_tower` output)
    -> embed_audio: weightless RMSNorm -> embedding_projection [n, H]  (= the soft tokens)

ATTN is local and causal: query i sees keys j with 0 <= i - j < context_left - 1 (12 keys), logit
q_i.k_j + q_i.R[i - j] with R a learned projection of a sinusoid of the distance, soft-capped by
50 tanh(x / 50). transformers computes it in blocks of `attention_chunk_size` queries against a
padded context window with a relative shift; the banded form here is the same function.

Only valid frames go in. Every operation is causal in time except the SSCP convolutions, whose
right neighbour past the end is a zero either way (a masked frame or the padding), so the valid
rows equal the reference's without running the padding frames.

12B (`gemma4_unified`, `audio_config.model_type: gemma4_unified_audio`): no tower. Frames of 640
raw samples -> weightless RMSNorm -> embed_audio.embedding_projection [n, H].

The soft tokens replace the audio-token embeddings unscaled (no sqrt(H)); the per-layer inputs use
the pad id there; audio tokens attend causally (only image tokens are bidirectional).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from core.model.loader import load_safetensors, read_checkpoint_json, weight_files, weight_index
from core.model.vision import ClippableLinear, RMSNorm, load_module_weights

if TYPE_CHECKING:
    from core.model.audio_input import PreparedAudio

# Weight-name prefixes of the two layouts: HF/Google, then mlx-community (mlx-vlm's conversion).
_PREFIXES = ("model.", "")
_PARTS = ("audio_tower.", "embed_audio.")
_CLIP_BOUNDS = ("input_min", "input_max", "output_min", "output_max")
# transformers' saved names for the 12B embedder (conversion mapping), read as the hub's
_RENAMES = (("embed_audio.multimodal_embedder.embedding_projection.", "embed_audio.embedding_projection."),)
UNIFIED_AUDIO_TYPE = "gemma4_unified_audio"


@dataclass(frozen=True)
class AudioConfig:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    subsampling_conv_channels: tuple[int, int]
    conv_kernel_size: int
    residual_weight: float
    attention_context_left: int
    attention_logit_cap: float
    attention_invalid_logits_value: float
    use_clipped_linears: bool
    rms_norm_eps: float
    gradient_clipping: float
    output_proj_dims: int
    text_hidden_size: int
    mel_bins: int = 128

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def local_keys(self) -> int:
        """Keys each query sees: itself and the previous context_left - 2 frames (12)."""
        return self.attention_context_left - 1

    @classmethod
    def from_model_config(cls, config: dict) -> AudioConfig:
        """From a whole checkpoint `config.json` (`audio_config` of type gemma4_audio)."""
        a = config.get("audio_config")
        if not a:
            raise ValueError("config.json has no audio_config")
        text = config.get("text_config") or {}
        try:
            act = a.get("hidden_act", "silu")
            if act not in ("silu", "swish"):
                raise ValueError(f"unsupported audio activation {act!r}")
            if int(a.get("attention_context_right", 0)) != 0:
                raise ValueError("audio attention with right context is not supported")
            left, chunk = int(a["attention_context_left"]), int(a.get("attention_chunk_size", 12))
            if chunk < left - 1:  # the chunked form then limits the past more than the band does
                raise ValueError(f"attention_chunk_size {chunk} < attention_context_left - 1 ({left - 1})")
            channels = tuple(int(c) for c in a["subsampling_conv_channels"])
            if len(channels) != 2:
                raise ValueError(f"expected two subsampling convolutions, got {list(channels)}")
            return cls(
                hidden_size=int(a["hidden_size"]),
                num_hidden_layers=int(a["num_hidden_layers"]),
                num_attention_heads=int(a["num_attention_heads"]),
                subsampling_conv_channels=(channels[0], channels[1]),
                conv_kernel_size=int(a["conv_kernel_size"]),
                residual_weight=float(a.get("residual_weight", 0.5)),
                attention_context_left=left,
                attention_logit_cap=float(a.get("attention_logit_cap", 50.0)),
                attention_invalid_logits_value=float(a.get("attention_invalid_logits_value", -1e9)),
                use_clipped_linears=bool(a.get("use_clipped_linears", False)),
                rms_norm_eps=float(a.get("rms_norm_eps", 1e-6)),
                gradient_clipping=float(a.get("gradient_clipping", 1e10)),
                output_proj_dims=int(a["output_proj_dims"]),
                text_hidden_size=int(text.get("hidden_size") or config["hidden_size"]),
            )
        except KeyError as exc:
            raise ValueError(f"audio_config is missing {exc.args[0]!r}") from exc


# -- the tower ---------------------------------------------------------------------------------------


class SubsampleLayer(nn.Module):
    """Conv 3x3 stride 2 (no bias) -> LayerNorm over channels (weight only) -> ReLU, on [1, T, F, C]."""

    def __init__(self, in_channels: int, out_channels: int, eps: float):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=2, padding=1, bias=False)
        self.norm = nn.LayerNorm(out_channels, eps=eps, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return nn.relu(self.norm(self.conv(x)))


class SubsampleConvProjection(nn.Module):
    def __init__(self, cfg: AudioConfig):
        super().__init__()
        c0, c1 = cfg.subsampling_conv_channels
        self.layer0 = SubsampleLayer(1, c0, cfg.rms_norm_eps)
        self.layer1 = SubsampleLayer(c0, c1, cfg.rms_norm_eps)
        freq = math.ceil(math.ceil(cfg.mel_bins / 2) / 2)  # 128 -> 64 -> 32
        self.input_proj_linear = nn.Linear(freq * c1, cfg.hidden_size, bias=False)

    def __call__(self, features: mx.array) -> mx.array:
        """features [V, mel] -> [ceil(V/4), D]."""
        x = self.layer1(self.layer0(features[None, :, :, None]))  # [1, T2, F2, C1]
        return self.input_proj_linear(x.reshape(x.shape[1], -1))  # flattened f * C1 + c


class FeedForward(nn.Module):
    def __init__(self, cfg: AudioConfig):
        super().__init__()
        d, clip, eps = cfg.hidden_size, cfg.use_clipped_linears, cfg.rms_norm_eps
        self.pre_layer_norm = RMSNorm(d, eps)
        self.ffw_layer_1 = ClippableLinear(d, 4 * d, clip)
        self.ffw_layer_2 = ClippableLinear(4 * d, d, clip)
        self.post_layer_norm = RMSNorm(d, eps)
        self.residual_weight = cfg.residual_weight
        self.grad_clip = cfg.gradient_clipping

    def __call__(self, x: mx.array) -> mx.array:
        y = self.pre_layer_norm(_clip(x, self.grad_clip))
        y = self.ffw_layer_2(nn.silu(self.ffw_layer_1(y)))
        return x + self.residual_weight * self.post_layer_norm(_clip(y, self.grad_clip))


def relative_sinusoid(distances: np.ndarray, dims: int) -> np.ndarray:
    """[n, dims] = [sin(d * tau), cos(d * tau)] with tau_m = exp(-m ln(1e4) / (dims/2 - 1))."""
    half = dims // 2
    inv = np.exp(-np.arange(half, dtype=np.float64) * math.log(1e4) / max(half - 1, 1)).astype(np.float32)
    angles = distances.astype(np.float32)[:, None] * inv[None, :]
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=-1).astype(np.float32)


class LocalAttention(nn.Module):
    def __init__(self, cfg: AudioConfig):
        super().__init__()
        d, clip = cfg.hidden_size, cfg.use_clipped_linears
        self.n_heads, self.head_dim, self.n_keys = cfg.num_attention_heads, cfg.head_dim, cfg.local_keys
        self.q_proj = ClippableLinear(d, d, clip)
        self.k_proj = ClippableLinear(d, d, clip)
        self.v_proj = ClippableLinear(d, d, clip)
        self.post = ClippableLinear(d, d, clip)
        self.relative_k_proj = nn.Linear(d, d, bias=False)
        self.per_dim_scale = mx.zeros((self.head_dim,))
        self.cap = cfg.attention_logit_cap
        self.invalid = cfg.attention_invalid_logits_value
        # window slot w holds key i - (n_keys - 1) + w, at distance n_keys - 1 - w
        self._sinusoid = mx.array(relative_sinusoid(np.arange(self.n_keys - 1, -1, -1), d))

    def __call__(self, x: mx.array) -> mx.array:
        T, nh, hd, W = x.shape[0], self.n_heads, self.head_dim, self.n_keys
        q_scale = (hd**-0.5 / math.log(2.0)) * nn.softplus(self.per_dim_scale.astype(mx.float32))
        q = self.q_proj(x).reshape(T, nh, hd).astype(mx.float32) * q_scale
        k = self.k_proj(x).reshape(T, nh, hd).astype(mx.float32) * (math.log1p(math.e) / math.log(2.0))
        v = self.v_proj(x).reshape(T, nh, hd)
        rel = self.relative_k_proj(self._sinusoid.astype(x.dtype)).reshape(W, nh, hd).astype(mx.float32)
        # the W keys of each query as a window: [T, W, nh, hd] from the keys left-padded by W - 1
        idx = mx.arange(T)[:, None] + mx.arange(W)[None, :]
        k_win = mx.pad(k, [(W - 1, 0), (0, 0), (0, 0)])[idx]
        v_win = mx.pad(v, [(W - 1, 0), (0, 0), (0, 0)])[idx]
        content = (q[:, :, None, :] @ k_win.transpose(0, 2, 3, 1))[:, :, 0, :]  # [T, nh, W]
        position = (q.transpose(1, 0, 2) @ rel.transpose(1, 2, 0)).transpose(1, 0, 2)  # [T, nh, W]
        logits = mx.tanh((content + position) / self.cap) * self.cap
        before_start = (mx.arange(T)[:, None] + mx.arange(W)[None, :]) < (W - 1)  # key index < 0
        logits = mx.where(before_start[:, None, :], self.invalid, logits)
        probs = mx.softmax(logits, axis=-1).astype(v.dtype)  # [T, nh, W]
        out = (probs[:, :, None, :] @ v_win.transpose(0, 2, 1, 3))[:, :, 0, :]  # [T, nh, hd]
        return self.post(out.reshape(T, nh * hd))


class LightConv(nn.Module):
    """GLU -> causal depthwise conv -> norm -> SiLU -> linear, with a residual."""

    def __init__(self, cfg: AudioConfig):
        super().__init__()
        d, clip, eps = cfg.hidden_size, cfg.use_clipped_linears, cfg.rms_norm_eps
        self.kernel = cfg.conv_kernel_size
        self.pre_layer_norm = RMSNorm(d, eps)
        self.linear_start = ClippableLinear(d, 2 * d, clip)
        self.depthwise_conv1d = nn.Conv1d(d, d, kernel_size=self.kernel, groups=d, bias=False)
        self.conv_norm = RMSNorm(d, eps)
        self.linear_end = ClippableLinear(d, d, clip)
        self.grad_clip = cfg.gradient_clipping

    def __call__(self, x: mx.array) -> mx.array:
        y = self.linear_start(self.pre_layer_norm(x))
        a, gate = mx.split(y, 2, axis=-1)
        y = a * mx.sigmoid(gate)
        y = self.depthwise_conv1d(mx.pad(y[None], [(0, 0), (self.kernel - 1, 0), (0, 0)]))[0]
        return x + self.linear_end(nn.silu(self.conv_norm(_clip(y, self.grad_clip))))


class ConformerLayer(nn.Module):
    def __init__(self, cfg: AudioConfig):
        super().__init__()
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.feed_forward1 = FeedForward(cfg)
        self.norm_pre_attn = RMSNorm(d, eps)
        self.self_attn = LocalAttention(cfg)
        self.norm_post_attn = RMSNorm(d, eps)
        self.lconv1d = LightConv(cfg)
        self.feed_forward2 = FeedForward(cfg)
        self.norm_out = RMSNorm(d, eps)
        self.grad_clip = cfg.gradient_clipping

    def __call__(self, x: mx.array) -> mx.array:
        g = self.grad_clip
        x = self.feed_forward1(x)
        x = x + self.norm_post_attn(_clip(self.self_attn(self.norm_pre_attn(_clip(x, g))), g))
        x = self.lconv1d(x)
        x = self.feed_forward2(x)
        return self.norm_out(_clip(x, g))


class AudioTower(nn.Module):
    def __init__(self, cfg: AudioConfig):
        super().__init__()
        self.subsample_conv_projection = SubsampleConvProjection(cfg)
        self.layers = [ConformerLayer(cfg) for _ in range(cfg.num_hidden_layers)]
        self.output_proj = nn.Linear(cfg.hidden_size, cfg.output_proj_dims, bias=True)

    def __call__(self, features: mx.array) -> mx.array:
        x = self.subsample_conv_projection(features)
        for layer in self.layers:
            x = layer(x)
        return self.output_proj(x)


class AudioEmbedder(nn.Module):
    """`embed_audio`: weightless RMSNorm, then a bias-free projection to the text width."""

    def __init__(self, in_dims: int, text_hidden_size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.embedding_projection = nn.Linear(in_dims, text_hidden_size, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.embedding_projection(mx.fast.rms_norm(x, None, self.eps))


def _clip(x: mx.array, bound: float) -> mx.array:
    """transformers clamps activations to +-gradient_clipping (1e10): a no-op on sane values, kept exact."""
    return mx.clip(x, -bound, bound)


class AudioEncoder(nn.Module):
    """The checkpoint's `audio_tower` and `embed_audio` (E2B/E4B), with the same parameter names."""

    kind = "tower"

    def __init__(self, cfg: AudioConfig):
        super().__init__()
        self.config = cfg
        self.audio_tower = AudioTower(cfg)
        self.embed_audio = AudioEmbedder(cfg.output_proj_dims, cfg.text_hidden_size, cfg.rms_norm_eps)

    @property
    def dtype(self) -> mx.Dtype:
        return self.audio_tower.subsample_conv_projection.layer0.conv.weight.dtype

    def _features(self, features: Any) -> mx.array:
        x = mx.array(np.asarray(features, dtype=np.float32)) if not isinstance(features, mx.array) else features
        if x.ndim != 2 or x.shape[1] != self.config.mel_bins or x.shape[0] == 0:
            raise ValueError(f"audio features must be [frames, {self.config.mel_bins}], got {list(x.shape)}")
        return x.astype(self.dtype)

    def sscp(self, features: Any) -> mx.array:
        """The subsampling output [ceil(V/4), D] of valid feature rows [V, 128]."""
        return self.audio_tower.subsample_conv_projection(self._features(features))

    def tower(self, features: Any) -> mx.array:
        """HF's `audio_tower` output for one clip's valid rows: [ceil(V/4), output_proj_dims]."""
        return self.audio_tower(self._features(features))

    def encode(self, features: Any) -> mx.array:
        """Soft tokens [ceil(V/4), text hidden] of one clip's valid feature rows [V, 128]."""
        return self.embed_audio(self.tower(features))

    def encode_clip(self, clip: PreparedAudio) -> mx.array:
        """Soft tokens of a core.model.audio_input.PreparedAudio."""
        return self.encode(clip.features)


class UnifiedAudioEncoder(nn.Module):
    """The 12B's `embed_audio` alone: 640-sample frames -> weightless RMSNorm -> projection."""

    kind = "embedder"

    def __init__(self, samples_per_token: int, text_hidden_size: int, eps: float):
        super().__init__()
        self.samples_per_token = samples_per_token
        self.embed_audio = AudioEmbedder(samples_per_token, text_hidden_size, eps)

    def encode(self, frames: Any) -> mx.array:
        """frames [n, 640] raw samples (core.model.audio_features.unified_frames) -> [n, text hidden]."""
        x = mx.array(np.asarray(frames, dtype=np.float32)) if not isinstance(frames, mx.array) else frames
        if x.ndim != 2 or x.shape[1] != self.samples_per_token or x.shape[0] == 0:
            raise ValueError(f"audio frames must be [n, {self.samples_per_token}], got {list(x.shape)}")
        return self.embed_audio(x)

    def encode_clip(self, clip: PreparedAudio) -> mx.array:
        return self.encode(clip.features)


# -- loading -----------------------------------------------------------------------------------------


def is_unified_audio(config: dict) -> bool:
    a = config.get("audio_config") or {}
    return a.get("model_type") == UNIFIED_AUDIO_TYPE or config.get("model_type") == "gemma4_unified"


def select_audio_weights(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """The audio keys of either layout under this module's names, convolutions in MLX's layout
    (HF stores conv2d [O, I, kH, kW] and the depthwise conv1d [C, 1, K]; mlx-community [O, kH, kW, I], [C, K, 1])."""
    out = {}
    for key, value in weights.items():
        for prefix in _PREFIXES:
            if not key.startswith(prefix):
                continue
            name = key[len(prefix) :]
            for old, new in _RENAMES:
                if name.startswith(old):
                    name = new + name[len(old) :]
            if name.startswith(_PARTS):
                out[name] = _to_mlx_conv(name, value)
                break
    return out


def _to_mlx_conv(name: str, w: mx.array) -> mx.array:
    if name.rsplit(".", 1)[-1] in _CLIP_BOUNDS and w.size == 1:
        return w.reshape(())  # some converters store the scalar bounds as [1]
    if name.endswith("conv.weight") and w.ndim == 4:
        in_channels = 1 if ".layer0." in name else None
        # HF [O, I, 3, 3]; MLX [O, 3, 3, I]. layer0 has one input channel, layer1 has 128: never 3.
        hf = w.shape[1] == in_channels if in_channels else w.shape[-1] == 3 and w.shape[1] != 3
        return w.transpose(0, 2, 3, 1) if hf else w
    if name.endswith("depthwise_conv1d.weight") and w.ndim == 3 and w.shape[1] == 1 and w.shape[2] != 1:
        return w.transpose(0, 2, 1)  # [C, 1, K] -> [C, K, 1]
    return w


def build_audio_encoder(
    config: dict, weights: dict[str, mx.array], dtype: mx.Dtype | None = None
) -> AudioEncoder | UnifiedAudioEncoder | None:
    """The audio encoder of a checkpoint (config.json dict and any subset of its weights), or None
    when it has no audio_config or no audio weights. A linear is quantized when `<name>.scales` is there."""
    own = select_audio_weights(weights)
    if not config.get("audio_config") or not own:
        return None
    a = config["audio_config"]
    text = config.get("text_config") or {}
    model: AudioEncoder | UnifiedAudioEncoder
    if is_unified_audio(config):
        spt = int(a.get("audio_samples_per_token") or a.get("audio_embed_dim") or 640)
        hidden = int(text.get("hidden_size") or config["hidden_size"])
        model = UnifiedAudioEncoder(spt, hidden, float(a.get("rms_norm_eps", 1e-6)))
        own = {k: v for k, v in own.items() if k.startswith("embed_audio.")}
    else:
        cfg = AudioConfig.from_model_config(config)
        model = AudioEncoder(cfg)
        if not cfg.use_clipped_linears:
            own = {k: v for k, v in own.items() if k.rsplit(".", 1)[-1] not in _CLIP_BOUNDS}
    return load_module_weights(model, own, config, dtype)


def audio_weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files that hold audio weights (all of them when there is no index)."""
    index = weight_index(model_dir)  # every file checked to be a regular file inside the folder
    if index is not None:
        names = {f for k, f in index.items() if any(k.startswith(p + part) for p in _PREFIXES for part in _PARTS)}
        return sorted(names)
    return weight_files(model_dir, "*.safetensors")


def load_audio(model_dir: str | Path, dtype: mx.Dtype | None = None) -> AudioEncoder | UnifiedAudioEncoder | None:
    """The audio tower + embedder (E2B/E4B) or the audio embedder (12B) of a checkpoint directory,
    or None if it has none. mx.load is lazy, so only the audio tensors of a shard are read."""
    model_dir = Path(model_dir)
    config = read_checkpoint_json(model_dir, "config.json")
    if not config.get("audio_config"):
        return None
    weights: dict[str, mx.array] = {}
    for path in audio_weight_files(model_dir):
        weights.update(select_audio_weights(load_safetensors(path)))
    return build_audio_encoder(config, weights, dtype)
