"""Audio input: decoding (formats, rates, channels), the feature extractor against transformers'
references (tests/data/pack, "The audio family"), token counts, and every refusal with its message."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from safetensors.numpy import load_file

from core.model import audio_input
from core.model.audio_features import (
    FeatureConfig,
    log_mel,
    mel_filter_bank,
    soft_token_count,
    unified_frames,
    unified_soft_token_count,
    valid_frames,
)
from core.model.audio_input import AudioError, AudioSpec, RawAudio, audio_source, decode_audio, prepare_audio

PACK = Path(__file__).parents[1] / "data" / "pack"
AUDIO = PACK / "references" / "audio"
INPUTS = AUDIO / "inputs"
FEATURES = json.loads((AUDIO / "features.json").read_text())["clips"]
MODELS = PACK / "models"
TOWER = AudioSpec.from_model_dir(MODELS / "e-style-audio-target")
EMBEDDER = AudioSpec.from_model_dir(MODELS / "unified-style-target")
FILES = {
    "sine_1s": "sine_1s.pcm16.wav",
    "chirp_3p7s": "chirp_3p7s.pcm16.wav",
    "noise_0p25s": "noise_0p25s.pcm16.wav",
    "silence_2s": "silence_2s.pcm16.wav",
    "long_31s": "long_31s.pcm16.flac",  # the pack's WAV, re-encoded losslessly
    "short_0p05s": "short_0p05s.pcm16.wav",
}
RESAMPLED = {"tone8k_1p5s": "tone8k_1p5s.pcm16.wav", "stereo44k_1s": "stereo44k_1s.pcm16.wav"}


@pytest.fixture(scope="module")
def ref_features():
    return load_file(AUDIO / "features.safetensors")


def _samples(name: str) -> np.ndarray:
    x, _ = sf.read(INPUTS / name, dtype="float32")
    return x


def test_specs_come_from_the_checkpoints():
    assert TOWER is not None and TOWER.kind == "tower" and TOWER.max_seconds == 30.0
    assert TOWER.features == FeatureConfig()  # the pack's processor_config is the released key set
    assert EMBEDDER is not None and EMBEDDER.kind == "embedder" and EMBEDDER.samples_per_token == 640
    for no_audio in ("e-style-target", "moe-style-target", "dense-style-target"):
        assert AudioSpec.from_model_dir(MODELS / no_audio) is None


@pytest.mark.parametrize("clip", list(FILES))
def test_features_equal_transformers(clip, ref_features):
    """Same float32 operations as transformers: equal to the bit (the pack allows 3e-3)."""
    meta = FEATURES[clip]
    prepared = prepare_audio(INPUTS / FILES[clip], TOWER)
    feats = prepared.features
    assert feats.shape == (meta["n_valid_frames"], 128)
    assert prepared.num_soft_tokens == meta["num_soft_tokens_hf"]
    if clip == "long_31s":  # only the first and last 100 frames are stored, and the full array's sha256
        np.testing.assert_array_equal(feats[:100], ref_features["long_31s.input_features_first100"])
        np.testing.assert_array_equal(feats[-100:], ref_features["long_31s.input_features_last100"])
        full = np.zeros((meta["n_frames"], 128), np.float32)
        full[: feats.shape[0]] = feats
        assert hashlib.sha256(full.tobytes()).hexdigest() == meta["features_f32_sha256"]
        assert prepared.seconds == 31.0 and prepared.used_seconds == 30.0
        assert prepared.notice == "Audio file 'long_31s.pcm16.flac' is 31.0 s long; the model hears only its first 30 s"
        return
    ref, mask = ref_features[f"{clip}.input_features"], ref_features[f"{clip}.input_features_mask"].astype(bool)
    assert mask.sum() == feats.shape[0] and mask[: feats.shape[0]].all()  # the valid frames are a prefix
    np.testing.assert_array_equal(feats, ref[mask])
    assert (ref[~mask] == 0).all()  # what was left out is zero in the reference
    assert prepared.notice is None


@pytest.mark.parametrize("clip", list(RESAMPLED))
def test_resampled_clips(clip, ref_features):
    """Another rate / stereo: downmixed and resampled by soxr, within 1e-3 of the pack's resampler away
    from the edges; the feature extractor alone is exact on the pack's own resampled waveform."""
    resampled = _samples(f"{clip}.resampled16k.f32.wav")
    x, rate, seconds, _ = decode_audio(INPUTS / RESAMPLED[clip])
    assert rate == FEATURES[clip]["rate"] and seconds == FEATURES[clip]["seconds"]
    ours = audio_input.resample(x, rate)
    assert ours.shape == resampled.shape
    n = len(ours)
    assert np.abs(ours[n // 10 : -n // 10] - resampled[n // 10 : -n // 10]).max() < 1e-3
    mask = ref_features[f"{clip}.input_features_mask"].astype(bool)
    np.testing.assert_array_equal(log_mel(resampled).features, ref_features[f"{clip}.input_features"][mask])
    prepared = prepare_audio(INPUTS / RESAMPLED[clip], TOWER)
    assert prepared.num_soft_tokens == FEATURES[clip]["num_soft_tokens_hf"]
    # Where the clip has energy (ln mel > -2), away from the first and last frames (the resamplers' edges
    # differ by up to 0.04), the features agree to 2e-3; near the mel floor a resampler's 1e-4 is a big step
    ref = ref_features[f"{clip}.input_features"][mask][2:-2]
    loud = ref > -2
    assert loud.mean() > 0.15
    assert np.abs(prepared.features[2:-2] - ref)[loud].max() < 2e-3


@pytest.mark.parametrize("clip", ["sine_1s", "noise_0p25s", "short_0p05s"])
def test_pcm16_and_float_wav_decode_to_the_same_samples(clip):
    np.testing.assert_array_equal(_samples(f"{clip}.pcm16.wav"), _samples(f"{clip}.f32.wav"))


def test_token_counts_follow_transformers_not_duration():
    """ceil(V / 4) with V = (N - 161) // 160 + 1, capped at 750; ceil(ms / 40) (mlx-vlm) is one too many
    for about a quarter of all lengths."""
    for clip, meta in FEATURES.items():
        n = meta.get("n_samples_after_truncation", meta["n_samples"])
        if "num_soft_tokens_hf" in meta:
            assert soft_token_count(n) == meta["num_soft_tokens_hf"], clip
    assert soft_token_count(4000) == 6 and soft_token_count(800) == 1  # mlx-vlm: 7 and 2
    assert [soft_token_count(n) for n in (160, 161, 320, 16000, 480000, 496000)] == [0, 1, 1, 25, 750, 750]
    off_by_one = sum(soft_token_count(n) != -(-(n * 1000 // 16000) // 40) for n in range(161, 48161))
    assert 0.2 < off_by_one / 48000 < 0.3
    for n in (161, 321, 4000, 16000, 59200):  # the formula is the frames the extractor marks valid
        assert log_mel(np.ones(n, np.float32) * 0.1).features.shape[0] == valid_frames(n)
    assert unified_soft_token_count(496000) == 775 and unified_soft_token_count(4000) == 7


def test_a_smaller_token_cap_keeps_exact_leading_frames():
    x = _samples("chirp_3p7s.pcm16.wav")
    capped = log_mel(x, FeatureConfig(max_soft_tokens=10))
    assert capped.num_soft_tokens == 10 and capped.features.shape[0] == 40
    np.testing.assert_array_equal(capped.features, log_mel(x).features[:40])


def test_mel_filter_bank_shape_and_first_filter():
    bank = mel_filter_bank(257, 128, 0.0, 8000.0, 16000)
    assert bank.shape == (257, 128) and bank.max() <= 1.0
    assert (bank[:, 0] == 0).all()  # its support holds no FFT bin: bin 0 of every frame is ln(1e-3)
    assert log_mel(_samples("sine_1s.pcm16.wav")).features[:, 0] == pytest.approx(np.log(1e-3))


def test_unified_frames_pad_to_640():
    x = _samples("noise_0p25s.pcm16.wav")  # 4000 samples: 6 full rows and 160 samples
    frames = unified_frames(x)
    assert frames.shape == (7, 640)
    np.testing.assert_array_equal(frames.reshape(-1)[:4000], x)
    assert (frames.reshape(-1)[4000:] == 0).all()
    long = prepare_audio(INPUTS / "long_31s.pcm16.flac", EMBEDDER)  # no 30 s cut for the 12B
    assert long.num_soft_tokens == 775 and long.notice is None


# -- formats, rates, channels -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "fmt,subtype,tol",
    [
        ("WAV", "PCM_U8", 1 / 128),
        ("WAV", "PCM_16", 0.0),
        ("WAV", "PCM_24", 0.0),
        ("WAV", "PCM_32", 0.0),
        ("WAV", "FLOAT", 0.0),
        ("WAV", "DOUBLE", 0.0),
        ("FLAC", "PCM_16", 0.0),
        ("OGG", "VORBIS", None),
        ("MP3", "MPEG_LAYER_III", None),
    ],
)
def test_formats_decode(tmp_path, fmt, subtype, tol):
    x = _samples("sine_1s.pcm16.wav")
    path = tmp_path / f"clip.{fmt.lower()}"
    sf.write(path, x, 16000, format=fmt, subtype=subtype)
    prepared = prepare_audio(path, TOWER)
    if tol is not None:  # lossless (to the format's precision): the same features
        y, rate, _, _ = decode_audio(path)
        assert rate == 16000 and np.abs(y - x).max() <= tol
        assert prepared.num_soft_tokens == 25
        if tol == 0.0:
            np.testing.assert_array_equal(prepared.features, log_mel(x).features)
    else:  # lossy codecs: the tone survives (its mel bin dominates), the length within a frame or so
        assert abs(prepared.num_soft_tokens - 25) <= 1
        peak = prepared.features[5:-5].mean(axis=0).argmax()
        assert peak == log_mel(x).features[5:-5].mean(axis=0).argmax()


def test_other_rates_and_stereo_are_resampled_and_downmixed(tmp_path):
    t = np.arange(44100 * 2) / 44100
    left, right = 0.3 * np.sin(2 * np.pi * 440 * t), 0.3 * np.sin(2 * np.pi * 440 * t + 0.5)
    path = tmp_path / "stereo.wav"
    sf.write(path, np.stack([left, right], axis=1), 44100, subtype="PCM_24")
    x, rate, seconds, _ = decode_audio(path)
    assert rate == 44100 and seconds == 2.0 and x.ndim == 1
    np.testing.assert_allclose(x, (left + right) / 2, atol=2e-7)
    prepared = prepare_audio(path, TOWER)
    assert prepared.num_soft_tokens == soft_token_count(32000) == 50


def test_raw_samples_and_encoded_bytes(tmp_path):
    x = _samples("sine_1s.pcm16.wav")
    by_path = prepare_audio(INPUTS / "sine_1s.pcm16.wav", TOWER)
    data = (INPUTS / "sine_1s.pcm16.wav").read_bytes()
    by_bytes = prepare_audio(audio_source({"type": "audio", "audio": data}), TOWER)
    raw = prepare_audio(audio_source({"type": "audio", "audio": x, "sample_rate": 16000}), TOWER)
    pcm = prepare_audio(RawAudio((x * 32768).astype(np.int16), 16000), TOWER)
    for other in (by_bytes, raw, pcm):
        np.testing.assert_array_equal(other.features, by_path.features)
        assert other.key == by_path.key  # the clip's identity is its samples, not where they came from
    raw8k = prepare_audio(RawAudio(x[::2], 8000), TOWER)
    assert raw8k.num_soft_tokens == 25 and raw8k.key != by_path.key
    assert audio_source({"type": "audio", "path": "file:///tmp/a.wav"}) == "/tmp/a.wav"


# -- refusals: one clear line each --------------------------------------------------------------------


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_refusals(tmp_path, monkeypatch):
    sine = (INPUTS / "sine_1s.pcm16.wav").read_bytes()
    cases = {
        tmp_path / "missing.wav": "Audio file not found: ",
        tmp_path: " is a folder, not an audio file.",
        _write(tmp_path, "empty.wav", b""): "Audio file 'empty.wav' is empty (0 bytes).",
        _write(tmp_path, "notes.wav", b"these are my notes, not a recording\n" * 20): (
            "Audio file 'notes.wav' is not an audio file gemma-chat can read (WAV, FLAC, OGG/Vorbis, MP3)."
        ),
        _write(tmp_path, "photo.mp3", (PACK / "references/images/test_image.png").read_bytes()): (
            "Audio file 'photo.mp3' is not an audio file gemma-chat can read"
        ),
        _write(tmp_path, "header.wav", sine[:30]): "Audio file 'header.wav' is damaged and cannot be decoded (",
        _write(tmp_path, "nodata.wav", sine[:44]): "Audio file 'nodata.wav' holds no audio samples.",
    }
    for path, message in cases.items():
        with pytest.raises(AudioError) as exc:
            prepare_audio(path, TOWER)
        assert message in str(exc.value), (path, str(exc.value))
        assert "\n" not in str(exc.value)
    tiny = tmp_path / "tiny.wav"
    sf.write(tiny, np.full(100, 0.1), 16000)  # 6 ms: not one 20 ms frame with its hop
    with pytest.raises(
        AudioError, match=r"^Audio file 'tiny.wav' is too short \(6.2 ms\); a clip needs at least 10 ms"
    ):
        prepare_audio(tiny, TOWER)
    assert prepare_audio(tiny, EMBEDDER).num_soft_tokens == 1  # the 12B takes any length
    nan = tmp_path / "nan.wav"
    sf.write(nan, np.array([0.1, np.nan] * 800, np.float32), 16000, subtype="FLOAT")
    with pytest.raises(AudioError, match="^Audio file 'nan.wav' holds NaN or infinite samples.$"):
        prepare_audio(nan, TOWER)
    with pytest.raises(AudioError, match="^The audio data is empty.$"):
        prepare_audio(b"", TOWER)
    with pytest.raises(AudioError, match='^raw audio samples need "sample_rate": a positive integer$'):
        audio_source({"type": "audio", "audio": np.zeros(10)})
    with pytest.raises(AudioError, match='an audio item needs "path"'):
        audio_source({"type": "audio"})
    # the size limit is checked before the file is opened
    monkeypatch.setattr(audio_input, "MAX_AUDIO_FILE_BYTES", 1000)
    opened = []
    monkeypatch.setattr(audio_input, "open", lambda *a, **k: opened.append(a), raising=False)
    with pytest.raises(AudioError, match=r"^Audio file 'sine_1s.pcm16.wav' is 0 MiB; the limit is 0 MiB.$"):
        prepare_audio(INPUTS / "sine_1s.pcm16.wav", TOWER)
    assert opened == []


def test_unreadable_file(tmp_path, monkeypatch):
    path = tmp_path / "locked.wav"
    path.write_bytes((INPUTS / "sine_1s.pcm16.wav").read_bytes())

    def denied(*args, **kwargs):  # chmod 0 does not stop root, who runs CI
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(audio_input, "open", denied, raising=False)
    with pytest.raises(AudioError, match="^Permission denied reading audio file 'locked.wav'.$"):
        prepare_audio(path, TOWER)


def test_only_the_part_the_model_hears_is_read(tmp_path, monkeypatch):
    """A long file: the reader is asked for 30 s (and a little for the resampler), not the whole file."""
    path = tmp_path / "long.flac"
    sf.write(path, np.zeros(16000 * 90, np.float32) + 0.01, 16000, subtype="PCM_16")
    asked = []
    real_read = sf.SoundFile.read

    def spy(self, frames=-1, *args, **kwargs):
        asked.append(frames)
        return real_read(self, frames, *args, **kwargs)

    monkeypatch.setattr(sf.SoundFile, "read", spy)
    prepared = prepare_audio(path, TOWER)
    assert asked == [int(np.ceil(30.05 * 16000))]
    assert prepared.seconds == 90.0 and prepared.used_seconds == 30.0 and prepared.num_soft_tokens == 750
    assert prepared.notice == "Audio file 'long.flac' is 90.0 s long; the model hears only its first 30 s"


def test_io_bytes_are_not_a_path():
    buf = io.BytesIO()
    sf.write(buf, np.zeros(1600, np.float32), 16000, format="WAV")
    assert prepare_audio(buf.getvalue(), TOWER).label == "The audio data"
