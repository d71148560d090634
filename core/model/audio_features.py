"""Gemma 4 audio features: a 16 kHz mono waveform -> log-mel frames for the E2B/E4B audio tower,
or raw 40 ms frames for the 12B's encoder-free embedder. Pure numpy (no mlx).

E2B/E4B (`Gemma4AudioFeatureExtractor`, the checkpoint's `processor_config.json` `feature_extractor`):

    samples [N] float32 in [-1, 1]  (N <= 480000: 30 s; longer clips are cut by the caller, see
    core.model.audio_input)  -> right-pad with zeros to a multiple of 128
    -> prepend 160 zeros ("semicausal") -> frames of 320 at hop 160: T = (L + 160 - 321) // 160 + 1
    -> x periodic Hann(320) -> |rfft(frame, 512)| (the magnitude, not the power)
    -> @ 128 HTK mel filters over 0..8000 Hz (peak 1, no area norm) -> ln(mel + 0.001)
    -> frames past the real audio are invalid: V = (N - 161) // 160 + 1 valid frames, zeroed

Soft tokens: the tower's two stride-2 convolutions keep ceil(ceil(V / 2) / 2) rows, at most 750
(`audio_seq_length`). That is NOT ceil(duration_ms / 40): that formula (mlx-vlm's) is one more for
about a quarter of all lengths, e.g. 0.25 s gives 6 tokens, not 7.

The numpy operations are transformers' own, in the same dtypes (float32 frames and window, numpy's
float32 rfft, the magnitude, a matmul with the float64 filter bank, ln in float64, then float32), so
the features equal the reference exactly where numpy's FFT does.

12B (`gemma4_unified`): no mel. The waveform is zero-padded to a multiple of 640 samples and cut
into rows of 640 (40 ms each); one soft token per row, no cap and no truncation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

SAMPLE_RATE = 16_000
MAX_SAMPLES = 480_000  # 30 s: the feature extractor's max_length; the tower was trained on up to this
MAX_SOFT_TOKENS = 750  # processor `audio_seq_length`
UNIFIED_SAMPLES_PER_TOKEN = 640  # the 12B: audio_config.audio_samples_per_token


@dataclass(frozen=True)
class FeatureConfig:
    """The checkpoint's feature-extractor settings (the released values are the defaults)."""

    sampling_rate: int = SAMPLE_RATE
    feature_size: int = 128
    frame_length: int = 320
    hop_length: int = 160
    fft_length: int = 512
    min_frequency: float = 0.0
    max_frequency: float = 8000.0
    mel_floor: float = 1e-3
    pad_multiple: int = 128  # HF's pad_to_multiple_of
    max_samples: int = MAX_SAMPLES
    max_soft_tokens: int = MAX_SOFT_TOKENS

    @classmethod
    def from_processor_config(cls, processor: dict[str, Any] | None) -> FeatureConfig:
        """From `processor_config.json` (its `feature_extractor` block and `audio_seq_length`).

        Settings this recipe does not implement (pre-emphasis, dither, FFT overdrive, per-bin
        normalisation, input scaling) are refused rather than ignored."""
        processor = processor or {}
        fe = processor.get("feature_extractor") or {}
        unsupported = {
            "preemphasis": 0.0,
            "dither": 0.0,
            "fft_overdrive": False,
            "per_bin_mean": None,
            "per_bin_stddev": None,
            "input_scale_factor": 1.0,
        }
        for key, neutral in unsupported.items():
            if fe.get(key, neutral) != neutral:
                raise ValueError(f"audio feature extractor setting {key}={fe[key]!r} is not supported")
        d = cls()
        return cls(
            sampling_rate=int(fe.get("sampling_rate", d.sampling_rate)),
            feature_size=int(fe.get("feature_size", d.feature_size)),
            frame_length=int(fe.get("frame_length", d.frame_length)),
            hop_length=int(fe.get("hop_length", d.hop_length)),
            fft_length=int(fe.get("fft_length", d.fft_length)),
            min_frequency=float(fe.get("min_frequency", d.min_frequency)),
            max_frequency=float(fe.get("max_frequency", d.max_frequency)),
            mel_floor=float(fe.get("mel_floor", d.mel_floor)),
            max_soft_tokens=int(processor.get("audio_seq_length") or d.max_soft_tokens),
        )


@dataclass
class AudioFeatures:
    """One clip's log-mel frames, valid rows only (the padding frames carry nothing)."""

    features: np.ndarray  # [V, feature_size] float32
    num_soft_tokens: int  # rows the tower returns: ceil(V / 4), at most max_soft_tokens


def valid_frames(n_samples: int, config: FeatureConfig | None = None) -> int:
    """Frames whose window ends inside the real audio: floor((N - 161) / 160) + 1 (0 below 161)."""
    c = config or FeatureConfig()
    half = c.frame_length // 2
    if n_samples < c.frame_length - half + 1:
        return 0
    return (n_samples - (c.frame_length - half + 1)) // c.hop_length + 1


def soft_token_count(n_samples: int, config: FeatureConfig | None = None) -> int:
    """Audio soft tokens (placeholders) an E2B/E4B clip of n samples at 16 kHz takes."""
    c = config or FeatureConfig()
    v = valid_frames(min(n_samples, c.max_samples), c)
    return min(math.ceil(math.ceil(v / 2) / 2), c.max_soft_tokens)


def unified_soft_token_count(n_samples: int, samples_per_token: int = UNIFIED_SAMPLES_PER_TOKEN) -> int:
    """Soft tokens of a 12B clip: one per 640 samples (40 ms), rounded up; no cap."""
    return -(-n_samples // samples_per_token)


@lru_cache(maxsize=4)
def hann_window(frame_length: int) -> np.ndarray:
    """Periodic Hann window, computed in float64 and cast (as transformers does)."""
    n = np.arange(frame_length, dtype=np.float64)
    return (0.5 - 0.5 * np.cos(2.0 * math.pi * n / frame_length)).astype(np.float32)


def _hz_to_mel(freq: np.ndarray | float) -> np.ndarray:
    return 2595.0 * np.log10(1.0 + np.asarray(freq, dtype=np.float64) / 700.0)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    return 700.0 * (10.0 ** (mel / 2595.0) - 1.0)


@lru_cache(maxsize=4)
def mel_filter_bank(
    n_freqs: int, n_mels: int, min_frequency: float, max_frequency: float, sampling_rate: int
) -> np.ndarray:
    """[n_freqs, n_mels] float64 HTK triangles, peak 1, no area normalisation.

    Filter m rises from edge m to edge m+1 and falls to edge m+2, the n_mels + 2 edges evenly
    spaced in mel between the two frequencies; FFT bin k sits at k * (rate/2) / (n_freqs - 1) Hz."""
    fft_freqs = np.linspace(0, sampling_rate // 2, n_freqs)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(min_frequency), _hz_to_mel(max_frequency), n_mels + 2))
    widths = np.diff(edges)  # [n_mels + 1]
    slopes = edges[None, :] - fft_freqs[:, None]  # [n_freqs, n_mels + 2]
    falling = -slopes[:, :-2] / widths[:-1]
    rising = slopes[:, 2:] / widths[1:]
    return np.maximum(0.0, np.minimum(falling, rising))


def log_mel(samples: np.ndarray, config: FeatureConfig | None = None) -> AudioFeatures:
    """Log-mel features of one 16 kHz mono clip (at most max_samples; see the module docstring)."""
    c = config or FeatureConfig()
    x = np.asarray(samples, dtype=np.float32).reshape(-1)
    if x.size > c.max_samples:
        raise ValueError(f"a clip has at most {c.max_samples} samples here ({x.size} given): cut it first")
    n_valid = valid_frames(x.size, c)
    if n_valid == 0:
        raise ValueError(
            f"the clip is too short: {x.size} samples, at least {c.frame_length - c.frame_length // 2 + 1} needed"
        )
    # a cap below ceil(V / 4) keeps the first 4 x cap frames: the rows it keeps depend on no later frame
    n_valid = min(n_valid, 4 * c.max_soft_tokens)
    padded = -(-x.size // c.pad_multiple) * c.pad_multiple
    half = c.frame_length // 2
    wave = np.zeros(half + padded, dtype=np.float32)
    wave[half : half + x.size] = x
    # only the valid frames: every later one is zeroed anyway, and no valid row depends on them
    starts = np.arange(n_valid) * c.hop_length
    frames = wave[starts[:, None] + np.arange(c.frame_length)[None, :]]  # [V, 320] float32
    spectrum = np.abs(np.fft.rfft(frames * hann_window(c.frame_length), n=c.fft_length, axis=-1))
    bank = mel_filter_bank(c.fft_length // 2 + 1, c.feature_size, c.min_frequency, c.max_frequency, c.sampling_rate)
    features = np.log(spectrum @ bank + c.mel_floor).astype(np.float32)
    return AudioFeatures(features, -(-n_valid // 4))


def unified_frames(samples: np.ndarray, samples_per_token: int = UNIFIED_SAMPLES_PER_TOKEN) -> np.ndarray:
    """The 12B's input: [ceil(N / 640), 640] float32, the last row zero-padded."""
    x = np.asarray(samples, dtype=np.float32).reshape(-1)
    if x.size == 0:
        raise ValueError("the clip has no samples")
    rows = unified_soft_token_count(x.size, samples_per_token)
    out = np.zeros(rows * samples_per_token, dtype=np.float32)
    out[: x.size] = x
    return out.reshape(rows, samples_per_token)
