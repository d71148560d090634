"""core.decode.detok with the pack tokenizer (byte fallback, '▁' for spaces, Gemma 4 special strings)."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from core.decode.detok import Detokenizer, default_skip_ids, special_ids

TOKENIZER_DIR = Path(__file__).parents[1] / "data" / "pack" / "models" / "tokenizer"

TEXTS = [
    "Return the index of the first item.",
    "  leading spaces, trailing  double  spaces  ",
    "tabs\tand\nnew lines\n\n  indented",
    "emoji: 😀👍🏽 and flags 🇫🇷",
    "CJK: 你好，世界。日本語のテキスト",
    "accents: café naïve Ærøskøbing — “quotes” … ±½ €100",
    "mixed😀a€b你c",
    "👨‍👩‍👧",  # zero-width joiners
    "<0x41> is not a byte token when typed",
]


@pytest.fixture(scope="module")
def tokenizer():
    from mlx_lm.tokenizer_utils import load

    return load(TOKENIZER_DIR)


@pytest.fixture(scope="module")
def detok(tokenizer):
    return Detokenizer(tokenizer)


def _stream(detok: Detokenizer, ids) -> list[str]:
    detok.reset()
    deltas = [detok.add(i) for i in ids]
    deltas.append(detok.flush())
    return deltas


def _reference(tokenizer, detok, ids) -> str:
    return tokenizer.decode([i for i in ids if i not in detok.skip_ids], skip_special_tokens=False)


@pytest.mark.parametrize("text", TEXTS)
def test_stream_equals_decode_and_never_emits_partial_chars(tokenizer, detok, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    deltas = _stream(detok, ids)
    assert "".join(deltas) == tokenizer.decode(ids) == text
    assert all("\ufffd" not in d for d in deltas)
    assert detok.text == text and detok.tokens == ids


def test_multibyte_characters_wait_for_their_last_byte(tokenizer, detok):
    ids = tokenizer.encode("€😀", add_special_tokens=False)
    pieces = tokenizer.convert_ids_to_tokens(ids)
    assert pieces == ["<0xE2>", "<0x82>", "<0xAC>", "<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]
    assert _stream(detok, ids) == ["", "", "€", "", "", "", "😀", ""]


def test_special_tokens_policy(tokenizer, detok):
    skip = default_skip_ids(tokenizer)
    specials = special_ids(tokenizer)
    by_text = {v: k for k, v in specials.items()}
    # end of turn, eos, image tokens and the like give no text; thinking markers are kept
    for name in ("<turn|>", "<eos>", "<bos>", "<|turn>", "<|image|>", "<|tool_response>", "<pad>"):
        assert by_text[name] in skip
    assert by_text["<|channel>"] not in skip and by_text["<channel|>"] not in skip
    detok.reset()
    assert detok.add(by_text["<turn|>"]) == ""
    ids = (
        [by_text["<|channel>"]]
        + tokenizer.encode("thought\nhmm", add_special_tokens=False)
        + [by_text["<channel|>"]]
        + tokenizer.encode("Hi 😀", add_special_tokens=False)
        + [by_text["<turn|>"], by_text["<eos>"]]
    )
    text = "".join(_stream(detok, ids))
    assert text == "<|channel>thought\nhmm<channel|>Hi 😀"
    assert text == _reference(tokenizer, detok, ids)
    # a custom policy: keep nothing special
    plain = Detokenizer(tokenizer, skip_ids=specials.keys())
    assert "".join(_stream(plain, ids)) == "thought\nhmmHi 😀"


def test_skipped_token_inside_a_character_does_not_break_it(tokenizer, detok):
    ids = tokenizer.encode("😀", add_special_tokens=False)
    eot = tokenizer.convert_tokens_to_ids("<turn|>")
    mixed = ids[:2] + [eot] + ids[2:]
    assert "".join(_stream(detok, mixed)) == "😀" == _reference(tokenizer, detok, mixed)


def test_invalid_bytes_become_replacement_chars_not_errors(tokenizer, detok):
    e2 = tokenizer.convert_tokens_to_ids("<0xE2>")
    a = tokenizer.encode("a", add_special_tokens=False)
    assert "".join(_stream(detok, [e2] + a)) == "\ufffda" == tokenizer.decode([e2] + a)
    assert "".join(_stream(detok, [e2])) == "\ufffd"  # flushed at the end of a reply
    c3 = tokenizer.convert_tokens_to_ids("<0xC3>")
    a9 = tokenizer.convert_tokens_to_ids("<0xA9>")
    assert "".join(_stream(detok, [e2, c3, a9])) == "\ufffdé"


def test_random_token_streams_match_decode(tokenizer, detok):
    rng = random.Random(0)
    vocab = len(tokenizer)
    specials = set(special_ids(tokenizer))
    normal = [i for i in range(vocab) if i not in specials]
    byte_ids = [i for i in normal if tokenizer.convert_ids_to_tokens(i).startswith("<0x")]
    checked = 0
    for _ in range(300):
        # text-like streams from real strings with specials sprinkled in
        s = "".join(rng.choice(["ab", " c", "😀", "é", "你", "\n", "  ", "x€"]) for _ in range(rng.randint(1, 12)))
        ids = tokenizer.encode(s, add_special_tokens=False)
        for _ in range(rng.randint(0, 3)):
            ids.insert(rng.randint(0, len(ids)), rng.choice(sorted(specials)))
        want = _reference(tokenizer, detok, ids)
        got = "".join(_stream(detok, ids))
        if "\ufffd" not in want:  # a kept special (a channel marker) may split a character
            assert got == want
            checked += 1
        else:
            assert "\ufffd" in got
        # arbitrary ids: equal whenever the bytes are valid UTF-8
        ids = [rng.choice(normal if rng.random() < 0.7 else byte_ids) for _ in range(rng.randint(1, 20))]
        want = _reference(tokenizer, detok, ids)
        got = "".join(_stream(detok, ids))
        if "\ufffd" not in want:
            assert got == want
            checked += 1
        else:
            assert "\ufffd" in got
    assert checked > 350


def test_cost_is_constant_per_token(tokenizer):
    detok = Detokenizer(tokenizer)
    ids = tokenizer.encode("Return the value of x. 😀 你好 " * 400, add_special_tokens=False)
    detok.add_many(ids[:50])  # warm the piece table
    detok.reset()
    start = time.perf_counter()
    for i in ids:
        detok.add(i)
    elapsed = time.perf_counter() - start
    assert detok.text + detok.flush() == tokenizer.decode(ids)
    assert elapsed / len(ids) < 50e-6, f"{elapsed / len(ids) * 1e6:.1f} us per token"
