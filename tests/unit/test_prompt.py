"""core.decode.prompt against the reference pack: rendering, ids, images, stop ids, thinking, reuse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.decode.prompt import (
    ImageSpan,
    ImageTokenIds,
    ThinkingMarkers,
    TokenLog,
    count_images,
    encode_messages,
    expand_images,
    image_token_ids,
    load_chat_template,
    plan_reuse,
    render_messages,
    split_thinking,
    stop_ids,
    strip_thinking,
    strip_thinking_from_history,
    supports_thinking,
    thinking_markers,
)

PACK = Path(__file__).parents[1] / "data" / "pack"
MODELS = PACK / "models"
FAMILIES = ["e-style", "moe-style", "dense-style"]


@pytest.fixture(scope="module")
def tokenizer():
    from mlx_lm.tokenizer_utils import load

    return load(MODELS / "tokenizer")


def _text_refs(family: str) -> dict:
    return json.loads((PACK / "references" / "text" / f"{family}.json").read_text())["prompts"]


@pytest.mark.parametrize("family", FAMILIES)
def test_text_prompts_match_reference_ids(tokenizer, family):
    for name, ref in _text_refs(family).items():
        text = render_messages(tokenizer, ref["messages"])
        assert text == ref["rendered"], name
        ids = encode_messages(tokenizer, ref["messages"])
        assert ids == ref["prompt_ids"], name
        assert ids[0] == tokenizer.bos_token_id and ids[1] != tokenizer.bos_token_id


def test_image_prompt_matches_reference(tokenizer):
    ref = json.loads((PACK / "references" / "images" / "e-style.json").read_text())
    want = json.loads(ref["prompt_ids"]) if isinstance(ref["prompt_ids"], str) else ref["prompt_ids"]
    messages = ref["messages"]
    assert count_images(messages) == 1
    ids = encode_messages(tokenizer, messages)
    image_ids = image_token_ids(MODELS / "e-style-target")
    assert ids.count(image_ids.image) == 1
    expanded, spans = expand_images(ids, [ref["num_soft_tokens"]], image_ids)
    assert len(expanded) == 158 == ref["prompt_len"]
    assert expanded == want
    assert spans == [(6, 136)] == [tuple(ref["image_token_span"])]
    assert expanded[5] == image_ids.boi and expanded[136] == image_ids.eoi
    # the safetensors copy agrees
    from safetensors.numpy import load_file

    arrays = load_file(str(PACK / "references" / "images" / "e-style.safetensors"))
    assert arrays["prompt_ids"].tolist() == expanded


def test_image_items_with_payload_render_one_placeholder_each(tokenizer):
    ids_cfg = image_token_ids(MODELS / "dense-style-target")
    messages = [
        {"role": "user", "content": [{"type": "image", "image": "a.png"}, {"type": "text", "text": "and"}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "this "}, {"type": "image", "image": object()}]},
    ]
    assert count_images(messages) == 2
    ids = encode_messages(tokenizer, messages)
    expanded, spans = expand_images(ids, [3, 5], ids_cfg)
    assert [e - s for s, e in spans] == [3, 5]
    for s, e in spans:
        assert expanded[s - 1] == ids_cfg.boi and expanded[e] == ids_cfg.eoi
        assert set(expanded[s:e]) == {ids_cfg.image}
    assert len(expanded) == len(ids) + 2 * 2 + (3 - 1) + (5 - 1)
    with pytest.raises(ValueError):
        expand_images(ids, [3], ids_cfg)
    with pytest.raises(ValueError):
        expand_images(ids, [3, 4, 5], ids_cfg)


def test_expand_images_without_images_is_identity():
    ids = [2, 21, 30, 31, 22]
    assert expand_images(ids, [], ImageTokenIds(4, 6, 5)) == (ids, [])


def test_image_ids_read_from_config(tmp_path):
    assert image_token_ids(MODELS / "e-style-target") == ImageTokenIds(boi=4, image=6, eoi=5)
    (tmp_path / "config.json").write_text(json.dumps({"boi_token_id": 100, "image_token_id": 7, "eoi_token_id": 9}))
    assert image_token_ids(tmp_path) == ImageTokenIds(100, 7, 9)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="boi_token_id"):
        image_token_ids(tmp_path)


def test_stop_ids(tokenizer, tmp_path):
    for family in FAMILIES:
        assert stop_ids(MODELS / f"{family}-target", tokenizer) == {1, 22, 12}
    # union of the sources, int or list, each file optional
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"eos_token_id": 40}, "eos_token_id": 41}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [42, 41]}))
    # plus <|tool_response> from the vocabulary (12 here): after its calls the model must stop
    tool_response = tokenizer.convert_tokens_to_ids("<|tool_response>")
    assert stop_ids(tmp_path, tokenizer) == {40, 41, 42, tokenizer.eos_token_id, tool_response}
    assert stop_ids(tmp_path / "missing", tokenizer._tokenizer) == {tokenizer.eos_token_id, tool_response}


def test_thinking_flag_and_template_sources(tokenizer, tmp_path):
    assert supports_thinking(tokenizer)
    msgs = [{"role": "user", "content": "hi"}]
    on = render_messages(tokenizer, msgs, thinking=True)
    off = render_messages(tokenizer, msgs, thinking=False)
    assert "<|think|>" in on and "<|think|>" not in off
    # a template in chat_template.jinja wins over tokenizer_config.json
    assert load_chat_template(MODELS / "tokenizer") == tokenizer.chat_template
    (tmp_path / "chat_template.jinja").write_text(
        "{{ bos_token }}X{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    template = load_chat_template(tmp_path)
    assert render_messages(tokenizer, msgs, template=template) == "<bos>Xhi"
    assert load_chat_template(tmp_path / "none") is None


def test_thinking_markers_and_split(tokenizer):
    markers = thinking_markers(tokenizer)
    assert markers == ThinkingMarkers("<|channel>", "<channel|>")
    assert tokenizer.convert_tokens_to_ids(markers.start) == 18  # the pack's (non-real) ids
    reply = "<|channel>thought\nLet me see.\nOK.<channel|>The answer is 4."
    assert split_thinking(reply, markers) == ("Let me see.\nOK.", "The answer is 4.")
    assert strip_thinking(reply, markers) == "The answer is 4."
    # still thinking (no end yet), no thinking at all, no markers known
    assert split_thinking("<|channel>thought\nhmm", markers) == ("hmm", "")
    assert split_thinking("plain", markers) == ("", "plain")
    assert split_thinking(reply, None) == ("", reply)
    # an empty channel (26B/31B templates with thinking off) and two channels
    assert strip_thinking("<|channel>thought\n<channel|>Hi", markers) == "Hi"
    assert split_thinking("<|channel>thought\na<channel|>x <|channel>thought\nb<channel|>y", markers) == ("a\nb", "x y")


def test_strip_thinking_from_history_only_touches_assistant(tokenizer):
    markers = thinking_markers(tokenizer)
    msgs = [
        {"role": "user", "content": "<|channel>keep<channel|>q"},
        {"role": "assistant", "content": "<|channel>thought\nx<channel|>A"},
        {"role": "assistant", "content": [{"type": "text", "text": "<|channel>thought\ny<channel|>B"}]},
    ]
    out = strip_thinking_from_history(msgs, markers)
    assert out[0] == msgs[0]
    assert out[1]["content"] == "A" and out[2]["content"][0]["text"] == "B"
    assert msgs[1]["content"].startswith("<|channel>")  # inputs untouched


# --- reuse plan ---------------------------------------------------------------------------


def test_plan_reuse_common_prefix_and_last_token_rule():
    assert plan_reuse([1, 2, 3, 4], [1, 2, 3, 9, 9]) == plan_reuse([1, 2, 3], [1, 2, 3, 9, 9])
    p = plan_reuse([1, 2, 3, 4], [1, 2, 3, 9, 9])
    assert (p.keep, p.suffix) == (3, [9, 9])
    # the new prompt is a prefix of (or equal to) the log: still re-run its last token
    for committed in ([1, 2, 3], [1, 2, 3, 4, 5]):
        p = plan_reuse(committed, [1, 2, 3])
        assert (p.keep, p.suffix) == (2, [3])
    assert plan_reuse([], [5]).suffix == [5]
    assert plan_reuse([7, 8], [1, 2]).keep == 0
    with pytest.raises(ValueError):
        plan_reuse([1], [])


def test_plan_reuse_never_splits_an_image():
    img = ImageSpan(3, 7, key="cat")  # boi at 2, soft tokens 3..6, eoi at 7
    committed = [2, 21, 4, 6, 6, 6, 6, 5, 30, 31]
    # the prompt diverges inside the image's soft tokens: back off to its boi
    p = plan_reuse(committed, [2, 21, 4, 6, 6, 9, 9, 9], [img], [ImageSpan(3, 6, key="x")])
    assert p.keep == 2 and p.suffix[0] == 4
    # the new prompt is cut inside the image (last-token rule lands inside it)
    p = plan_reuse(committed, [2, 21, 4, 6, 6, 6, 6], [img], [ImageSpan(3, 7, key="cat")])
    assert p.keep == 2
    # same ids, same place, different picture: the image is not reused
    new = committed + [22, 40]
    p = plan_reuse(committed, new, [img], [ImageSpan(3, 7, key="dog")])
    assert p.keep == 2
    # same picture: everything before the new tail is kept
    p = plan_reuse(committed, new, [img], [ImageSpan(3, 7, key="cat")])
    assert p.keep == len(committed) and p.suffix == [22, 40]
    # the new prompt has placeholder ids there but no image: not reused either
    p = plan_reuse(committed, new, [img], [])
    assert p.keep == 2
    # a divergence before the image is unaffected by it
    p = plan_reuse(committed, [2, 9, 4, 6, 6, 6, 6, 5], [img], [ImageSpan(3, 7, key="cat")])
    assert p.keep == 1
    # an image starting at the cut is prefilled whole
    p = plan_reuse([2, 21, 30], [2, 21, 30, 4, 6, 6, 5, 1], [], [ImageSpan(4, 6, key="a")])
    assert p.keep == 3 and p.suffix[:4] == [4, 6, 6, 5]


def test_token_log_follows_the_cache():
    log = TokenLog()
    prompt1 = [2, 21, 4, 6, 6, 5, 30]
    img = ImageSpan(3, 5, key="a")
    plan = log.plan(prompt1, [img])
    assert plan.keep == 0 and plan.suffix == prompt1
    log.apply(plan, [img])
    assert log.ids == prompt1 and log.images == [img]
    log.extend([40, 41, 22])  # the reply committed to the cache
    prompt2 = prompt1 + [40, 41, 22, 280, 21, 50, 280]
    plan = log.plan(prompt2, [img])
    assert plan.keep == len(log) and plan.suffix == [280, 21, 50, 280]
    log.apply(plan, [img])
    assert log.ids == prompt2 and len(log) == len(prompt2) and log.images == [img]
    # a new conversation whose image differs: everything from the boi is re-run
    plan = log.plan(prompt1, [ImageSpan(3, 5, key="b")])
    assert plan.keep == 2
    log.apply(plan, [ImageSpan(3, 5, key="b")])
    assert log.ids == prompt1 and log.images == [ImageSpan(3, 5, key="b")]
    log.truncate(4)
    assert log.images == [] and log.ids == prompt1[:4]
    with pytest.raises(ValueError):
        log.extend([], [ImageSpan(3, 9)])
    log.clear()
    assert len(log) == 0
