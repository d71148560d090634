"""Audio attachments: a file, encoded bytes or raw samples -> the model's audio input.

Pure numpy + soundfile + soxr (no mlx), so the CLI and the UI can check an attachment before a
model loads.

- Decoding: libsndfile through `soundfile`: WAV (8/16/24/32-bit PCM, 32/64-bit float), FLAC,
  OGG/Vorbis (and Opus), MP3, AIFF, ... PCM16 decodes as k / 32768 exactly, as the references do.
- Channels: averaged (in float64) to mono. Any sample rate: resampled to 16 kHz with soxr (HQ).
- Length: E2B/E4B hear at most 30 s per clip (the feature extractor's 480,000 samples; transformers
  cuts the rest silently): a longer clip is cut to its first 30 s and `PreparedAudio.notice` says so.
  The 12B's embedder has no such limit in transformers (one token per 40 ms, no cap); here it is
  bounded by MAX_UNIFIED_AUDIO_SECONDS, cut the same way. Only what is kept is read from the file.
- Refused with one clear line (`AudioError`): a missing file, a folder, an empty or oversized file,
  a file that is not audio or cannot be decoded, a clip with no samples, too short for one frame,
  or with NaN/infinite samples.

Message items (core.decode.prompt): `{"type": "audio", "path": FILE}`; `{"type": "audio", "audio":
FILE | bytes}` (bytes: an encoded file, e.g. a server's base64 `input_audio`); or raw samples
`{"type": "audio", "audio": ndarray [n] or [n, channels] float, "sample_rate": int}` (a recorder).
`audio_source(item)` returns what `prepare_audio` takes.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from core.limits import AUDIO_CLIP_SECONDS, MAX_AUDIO_FILE_BYTES, MAX_UNIFIED_AUDIO_SECONDS
from core.model.audio_features import (
    SAMPLE_RATE,
    UNIFIED_SAMPLES_PER_TOKEN,
    FeatureConfig,
    log_mel,
    unified_frames,
    valid_frames,
)

FORMATS_TEXT = "WAV, FLAC, OGG/Vorbis, MP3"


class AudioError(ValueError):
    """An audio clip could not be used. The message is meant for the user, as is."""


@dataclass(frozen=True)
class RawAudio:
    """Samples already decoded: [n] or [n, channels], any float or int dtype, at `sample_rate`."""

    samples: np.ndarray
    sample_rate: int
    label: str = "The audio samples"


@dataclass(frozen=True)
class AudioSpec:
    """What a checkpoint's audio input needs: a tower's log-mel features, or the 12B's raw frames."""

    kind: str  # "tower" (E2B/E4B) | "embedder" (12B)
    features: FeatureConfig
    samples_per_token: int = UNIFIED_SAMPLES_PER_TOKEN
    max_seconds: float = AUDIO_CLIP_SECONDS

    @classmethod
    def from_model_dir(cls, model_dir: str | os.PathLike) -> AudioSpec | None:
        """From config.json (`audio_config`) and processor_config.json; None when the checkpoint
        has no audio input (26B, 31B, text-only checkpoints)."""
        model_dir = Path(model_dir)
        config = _read_json(model_dir / "config.json")
        audio = config.get("audio_config")
        if not isinstance(audio, dict) or not audio:
            return None
        processor = _read_json(model_dir / "processor_config.json")
        if audio.get("model_type") == "gemma4_unified_audio" or config.get("model_type") == "gemma4_unified":
            spt = int(audio.get("audio_samples_per_token") or UNIFIED_SAMPLES_PER_TOKEN)
            return cls("embedder", FeatureConfig(), spt, MAX_UNIFIED_AUDIO_SECONDS)
        fe = FeatureConfig.from_processor_config(processor)
        return cls("tower", fe, max_seconds=fe.max_samples / fe.sampling_rate)

    @property
    def sample_rate(self) -> int:
        return self.features.sampling_rate


@dataclass
class PreparedAudio:
    """One clip ready for the audio encoder."""

    features: np.ndarray  # tower: log-mel [V, 128] (valid frames); embedder: raw frames [n, 640]
    num_soft_tokens: int  # placeholders in the prompt = rows the encoder returns
    seconds: float  # the clip's length as given
    used_seconds: float  # what the model hears (after a cut)
    key: str  # sha256 of the 16 kHz samples: the clip's identity for cache reuse
    label: str  # file name or "audio", for messages
    notice: str | None = None  # what the user should know (the clip was cut)


def audio_source(item: dict[str, Any]) -> str | bytes | RawAudio:
    """What `prepare_audio` takes, from a message's audio item (see the module docstring)."""
    value = next((item[k] for k in ("path", "audio", "url") if item.get(k) is not None), None)
    if isinstance(value, np.ndarray):
        rate = item.get("sample_rate") or item.get("sampling_rate")
        if not isinstance(rate, int) or isinstance(rate, bool) or rate <= 0:
            raise AudioError('raw audio samples need "sample_rate": a positive integer')
        return RawAudio(value, rate)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str) and value:
        return value[len("file://") :] if value.startswith("file://") else value
    raise AudioError('an audio item needs "path": a file name (or "audio": encoded bytes or samples)')


# --- decoding -----------------------------------------------------------------------------------


def decode_audio(
    source: str | os.PathLike | bytes | RawAudio, max_seconds: float | None = None
) -> tuple[np.ndarray, int, float, str]:
    """(mono float32 samples at their own rate, rate, seconds in the source, label). Reads at most
    `max_seconds` of a file (plus a little for the resampler's edge)."""
    if isinstance(source, RawAudio):
        x = _raw_samples(source)
        return x, source.sample_rate, x.shape[0] / source.sample_rate, source.label
    import soundfile as sf

    label, fp = _open_source(source)
    try:
        with sf.SoundFile(fp) as f:
            rate, total = int(f.samplerate), int(f.frames)
            if rate <= 0:
                raise AudioError(f"{label} has no sample rate")
            want = total if max_seconds is None else min(total, int(math.ceil((max_seconds + 0.05) * rate)))
            data = f.read(want, dtype="float32", always_2d=True)
    except AudioError:
        raise
    except sf.LibsndfileError as exc:
        text = str(exc.error_string) if hasattr(exc, "error_string") else str(exc)
        if "not recognised" in text.lower() or "unknown format" in text.lower():
            raise AudioError(f"{label} is not an audio file gemma-chat can read ({FORMATS_TEXT}).") from None
        raise AudioError(f"{label} is damaged and cannot be decoded ({text}).") from None
    except (RuntimeError, ValueError, TypeError, OSError) as exc:
        raise AudioError(f"{label} is damaged and cannot be decoded ({exc}).") from None
    finally:
        fp.close()
    if data.shape[0] == 0:
        raise AudioError(f"{label} holds no audio samples.")
    # frames may be unknown (-1 or a huge sentinel) for some streams: then the read length is the truth
    seconds = (total if 0 < total < 2**62 else data.shape[0]) / rate
    return _mono(data, label), rate, max(seconds, data.shape[0] / rate), label


def _open_source(source: str | os.PathLike | bytes) -> tuple[str, io.BufferedIOBase]:
    """(label for messages, an open binary file), after the checks that need no decoding."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        if not data:
            raise AudioError("The audio data is empty.")
        if len(data) > MAX_AUDIO_FILE_BYTES:
            raise AudioError(f"The audio data is {len(data) / 2**20:,.0f} MiB; the limit is {_limit_mib()} MiB.")
        return "The audio data", io.BytesIO(data)
    path = Path(source).expanduser()
    label = f"Audio file '{path.name}'"
    try:
        st = path.stat()
    except FileNotFoundError:
        raise AudioError(f"Audio file not found: {path}") from None
    except OSError as exc:
        raise AudioError(f"Cannot read audio file {path}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise AudioError(f"{path} is a folder, not an audio file.")
    if not stat.S_ISREG(st.st_mode):
        raise AudioError(f"{path} is not a regular file.")
    if st.st_size == 0:
        raise AudioError(f"{label} is empty (0 bytes).")
    if st.st_size > MAX_AUDIO_FILE_BYTES:
        raise AudioError(f"{label} is {st.st_size / 2**20:,.0f} MiB; the limit is {_limit_mib()} MiB.")
    try:
        return label, open(path, "rb")
    except PermissionError:
        raise AudioError(f"Permission denied reading {label[0].lower() + label[1:]}.") from None
    except OSError as exc:
        raise AudioError(f"Cannot read audio file {path}: {exc.strerror or exc}") from None


def _limit_mib() -> int:
    return MAX_AUDIO_FILE_BYTES >> 20


def _raw_samples(raw: RawAudio) -> np.ndarray:
    x = np.asarray(raw.samples)
    if x.ndim not in (1, 2) or x.size == 0:
        raise AudioError(f"raw audio must be samples [n] or [n, channels], got shape {list(x.shape)}")
    if raw.sample_rate <= 0:
        raise AudioError("raw audio needs a positive sample rate")
    if np.issubdtype(x.dtype, np.integer):  # PCM: full scale is 2^(bits-1)
        x = x.astype(np.float64) / float(2 ** (8 * x.dtype.itemsize - 1))
    elif not np.issubdtype(x.dtype, np.floating):
        raise AudioError(f"raw audio samples must be numbers, got {x.dtype}")
    return _mono(x.reshape(x.shape[0], -1), raw.label)


def _mono(data: np.ndarray, label: str) -> np.ndarray:
    if not np.isfinite(data).all():
        raise AudioError(f"{label} holds NaN or infinite samples.")
    if data.shape[1] == 1:
        return np.ascontiguousarray(data[:, 0], dtype=np.float32)
    return data.astype(np.float64).mean(axis=1).astype(np.float32)


def resample(samples: np.ndarray, rate: int, target: int = SAMPLE_RATE) -> np.ndarray:
    """float32 mono at `target` Hz (soxr, high quality); unchanged when the rate already matches."""
    if rate == target:
        return samples
    import soxr

    out = soxr.resample(samples.astype(np.float64), rate, target, quality="HQ")
    return np.asarray(out, dtype=np.float32)


# --- the model's input --------------------------------------------------------------------------


def prepare_audio(source: str | os.PathLike | bytes | RawAudio, spec: AudioSpec) -> PreparedAudio:
    """Decode, downmix, resample, cut to the model's limit, then features (tower) or frames (12B)."""
    x, rate, seconds, label = decode_audio(source, spec.max_seconds)
    x = resample(x, rate, spec.sample_rate)
    limit = int(round(spec.max_seconds * spec.sample_rate))
    notice = None
    if seconds > spec.max_seconds or x.shape[0] > limit:
        x = x[:limit]
        length = f"{seconds:.1f}" if round(seconds, 1) > spec.max_seconds else f"{seconds:.3f}"
        notice = f"{label} is {length} s long; the model hears only its first {spec.max_seconds:g} s"
    used = x.shape[0] / spec.sample_rate
    key = hashlib.sha256(x.tobytes()).hexdigest()
    if spec.kind == "embedder":
        frames = unified_frames(x, spec.samples_per_token)
        return PreparedAudio(frames, frames.shape[0], seconds, used, key, label, notice)
    if valid_frames(x.shape[0], spec.features) == 0:
        need = (spec.features.frame_length - spec.features.frame_length // 2 + 1) / spec.sample_rate
        raise AudioError(f"{label} is too short ({used * 1000:.1f} ms); a clip needs at least {need * 1000:.0f} ms.")
    feats = log_mel(x, spec.features)
    return PreparedAudio(feats.features, feats.num_soft_tokens, seconds, used, key, label, notice)


def _read_json(path: Path) -> dict:
    """A checkpoint settings file ({} when absent or not JSON); a FIFO or device in its place is refused
    (core.model.loader.checkpoint_file), never read."""
    from core.model.loader import CheckpointError, checkpoint_file, read_checkpoint_json

    if checkpoint_file(path.parent, path.name) is None:
        return {}
    try:
        return read_checkpoint_json(path.parent, path.name)
    except CheckpointError:
        return {}
