"""Audio in the prompt (core.decode.prompt): placeholder expansion against transformers' ids for every
pack audio prompt (one clip, two clips, both families), ids from the config, message checks, images and
audio together, and cache reuse across audio turns."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from core.decode.prompt import (
    AudioTokenIds,
    ImageSpan,
    ImageTokenIds,
    TokenLog,
    audio_token_ids,
    check_messages,
    count_audio,
    encode_messages,
    expand_media,
    media_items,
    render_messages,
)

PACK = Path(__file__).parents[1] / "data" / "pack"
MODELS = PACK / "models"
AUDIO = PACK / "references" / "audio"
E_PROMPTS = json.loads((AUDIO / "e-style-audio.json").read_text())["prompts"]
U_PROMPTS = json.loads((AUDIO / "unified-style-audio.json").read_text())["prompts"]
CASES = [("e-style-audio-target", n, p) for n, p in E_PROMPTS.items()] + [
    ("unified-style-target", n, p) for n, p in U_PROMPTS.items()
]


@pytest.fixture(scope="module")
def tokenizer():
    from mlx_lm.tokenizer_utils import load

    return load(MODELS / "tokenizer")


@pytest.mark.parametrize("model,name,ref", CASES, ids=[f"{m.split('-')[0]}-{n}" for m, n, _ in CASES])
def test_audio_prompts_match_transformers_ids(tokenizer, model, name, ref):
    messages = ref["messages"]
    if "rendered" in ref:
        assert render_messages(tokenizer, messages) == ref["rendered"]
    assert count_audio(messages) == len(ref["num_soft_tokens_per_clip"])
    ids = encode_messages(tokenizer, messages)
    expanded, (spans,) = expand_media(ids, [(audio_token_ids(MODELS / model), ref["num_soft_tokens_per_clip"])])
    assert expanded == ref["prompt_ids"]
    if "audio_token_spans" in ref:
        assert [list(s) for s in spans] == ref["audio_token_spans"]
    assert [e - s for s, e in spans] == ref["num_soft_tokens_per_clip"]


def test_audio_ids_from_both_config_spellings(tmp_path):
    assert audio_token_ids(MODELS / "e-style-audio-target") == AudioTokenIds(boa=7, audio=9, eoa=8)
    # the 12B's config names the end marker eoa_token_index only
    assert "eoa_token_id" not in json.loads((MODELS / "unified-style-target" / "config.json").read_text())
    assert audio_token_ids(MODELS / "unified-style-target") == AudioTokenIds(7, 9, 8)
    (tmp_path / "config.json").write_text(json.dumps({"boa_token_id": 100, "audio_token_id": 101}))
    with pytest.raises(ValueError, match="^config.json has no eoa_token_id: the checkpoint does not take audio$"):
        audio_token_ids(tmp_path)


def test_images_and_audio_expand_in_one_pass(tokenizer):
    """Interleaved items: each placeholder takes the next count of its own kind."""
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "audio", "path": "a.wav"},
                {"type": "image", "path": "x.png"},
                {"type": "text", "text": "and"},
                {"type": "audio", "path": "b.wav"},
            ],
        }
    ]
    image_ids, audio_ids = ImageTokenIds(4, 6, 5), AudioTokenIds(7, 9, 8)
    ids = encode_messages(tokenizer, messages)
    expanded, (images, audio) = expand_media(ids, [(image_ids, [3]), (audio_ids, [2, 4])])
    assert [e - s for s, e in audio] == [2, 4] and [e - s for s, e in images] == [3]
    assert audio[0][1] < images[0][0] < audio[1][0]  # prompt order
    for (s, e), (begin, tok, end) in [(audio[0], (7, 9, 8)), (images[0], (4, 6, 5)), (audio[1], (7, 9, 8))]:
        assert expanded[s - 1] == begin and expanded[e] == end and set(expanded[s:e]) == {tok}
    assert len(expanded) == len(ids) + 3 * 2 + (3 - 1) + (2 - 1) + (4 - 1)
    with pytest.raises(ValueError, match="^the prompt has 2 audio placeholders for 3 audio clips$"):
        expand_media(ids, [(image_ids, [3]), (audio_ids, [2, 4, 1])])
    with pytest.raises(ValueError, match="^the prompt has more audio placeholders than the 1 audio clips given$"):
        expand_media(ids, [(image_ids, [3]), (audio_ids, [2])])
    assert [i["path"] for i in media_items(messages, "audio")] == ["a.wav", "b.wav"]


def test_check_messages_takes_audio_items():
    ok = [
        {"type": "audio", "path": "a.wav"},
        {"type": "audio", "audio": "a.wav"},
        {"type": "audio", "audio": b"RIFF...."},
        {"type": "audio", "audio": np.zeros(16000, np.float32), "sample_rate": 16000},
    ]
    check_messages([{"role": "user", "content": ok}])
    for bad in (
        {"type": "audio"},
        {"type": "audio", "path": ""},
        {"type": "audio", "audio": b""},
        {"type": "audio", "audio": np.zeros(10)},  # samples without a rate
        {"type": "audio", "path": 3},
    ):
        with pytest.raises(ValueError, match=r'^message 1, item 1: an audio item needs "path": a file name$'):
            check_messages([{"role": "user", "content": [bad]}])
    with pytest.raises(ValueError, match="type must be text, image or audio, got 'video'"):
        check_messages([{"role": "user", "content": [{"type": "video", "path": "v.mp4"}]}])


def test_reuse_keeps_an_unchanged_clip_and_reprefills_a_changed_one():
    """Audio spans follow the image rules: same placeholder ids are not enough, the clip's key decides."""
    boa, aud, eoa = 7, 9, 8
    turn1 = [2, 21, 30, boa, aud, aud, aud, eoa, 31, 22]
    span = ImageSpan(4, 7, "audio:clipA")
    log = TokenLog()
    log.extend(turn1 + [40, 41], [span])
    turn2 = turn1 + [40, 41, 22, 21, 32, 33]
    assert log.plan(turn2, [span]).keep == len(turn1) + 2  # everything cached is reused
    other = ImageSpan(4, 7, "audio:clipB")  # another clip of the same length in the same place
    assert log.plan(turn2, [other]).keep == 3  # from its boa token on
    assert log.plan(turn2, []).keep == 3  # the clip is gone from the prompt
