"""The demo's own 2048-token vocabulary, trained on its corpus (BPE, byte fallback, Gemma's layout).

    build_tokenizer(texts, base) -> tokenizer.json content (a dict)

The factory's packaged tokenizer (`core/data/tokenizer`) splits the time tool's declarations into
~490 tokens and numbers into irregular pieces ("10:25" in a result is `10 : 25`, in a reply
`▁1 0 : 25`), so a reply that copies a time from a tool result would have to learn a different
mapping for every number. This one keeps everything the engine reads from a Gemma tokenizer
(the same 24 special tokens at the same ids, then the 256 byte-fallback pieces, the `▁` space
normalizer and the `Replace ▁ -> ByteFallback -> Fuse` decoder) and changes only how text is cut:
- digits are always single pieces, and punctuation is its own piece, so a time or a timezone is
  the same pieces in a result, in a call and in a reply;
- merges are learned from the corpus's own rendered conversations plus the standard library's
  docstrings (general technical English), so the declarations take ~300 tokens and replies fewer.
Deterministic: the same texts give the same file.
"""

from __future__ import annotations

import json
from pathlib import Path

VOCAB_SIZE = 2048


def _pre_tokenizer():
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex("▁"), behavior="merged_with_next"),  # a word keeps the space before it
            pre_tokenizers.Split(Regex(r"[^\w▁]"), behavior="isolated"),  # punctuation alone
            pre_tokenizers.Digits(individual_digits=True),
        ]
    )


def build_tokenizer(texts: list[str], base: Path) -> dict:
    """Train on `texts` (rendered chat text, special tokens included) and return the tokenizer.json
    dict, laid out like `base` (the factory's tokenizer.json): its added tokens, post-processor and
    decoder unchanged, ids 0-23 special, 24-279 `<0x00>`..`<0xFF>`, then the learned pieces."""
    from tokenizers import Tokenizer, models, normalizers, trainers

    ref = json.loads(Path(base).read_text(encoding="utf-8"))
    specials = [t["content"] for t in sorted(ref["added_tokens"], key=lambda t: t["id"])]
    assert [t["id"] for t in sorted(ref["added_tokens"], key=lambda t: t["id"])] == list(range(len(specials)))
    byte_pieces = [f"<0x{b:02X}>" for b in range(256)]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = _pre_tokenizer()
    tok.add_special_tokens(specials)  # the chat markup is never split or merged
    ascii_chars = [chr(c) for c in range(33, 127)] + ["▁", "\n"]
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=specials + byte_pieces,  # ids 0..279, in this order
        initial_alphabet=ascii_chars,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    for i, piece in enumerate(specials + byte_pieces):
        if vocab.get(piece) != i:
            raise RuntimeError(f"trained vocabulary has {piece!r} at {vocab.get(piece)}, expected {i}")
    if len(vocab) != VOCAB_SIZE:
        raise RuntimeError(f"trained vocabulary has {len(vocab)} pieces, expected {VOCAB_SIZE}")
    out = dict(ref)
    out["normalizer"] = data["normalizer"]
    out["pre_tokenizer"] = data["pre_tokenizer"]
    out["added_tokens"] = ref["added_tokens"]  # the byte pieces stay plain vocabulary, not added tokens
    out["model"] = {**ref["model"], "vocab": vocab, "merges": data["model"]["merges"]}
    return out
