"""Make a tiny checkpoint write a given reply, for tool-call tests: the reference pack's models babble
docstrings and never call a tool by themselves.

`script_reply(monkeypatch, start, script)` adds a large bias to the target's logits for script[i] at
absolute position start + i (a function of the position only, so a one-token step and a K-token
verify agree, and greedy decoding with the drafter still must equal the target alone). With
`drafts=True` the drafter proposes the script as well, so its tokens (the stop included) come out
of accepted runs. Everything else is the real engine: cache, rounds, detokenizer, parser.
"""

from __future__ import annotations

from typing import Any


def script_reply(monkeypatch: Any, start: int, script: list[int], drafts: bool = False) -> None:
    import mlx.core as mx
    import numpy as np

    from core.model.drafter import Drafter
    from core.model.target import Target

    forward, draft = Target.forward, Drafter.draft

    def biased_forward(self: Target, tokens: Any, cache: Any, **kw: Any) -> Any:
        P, L = cache.offset, len(tokens)
        logits, hidden = forward(self, tokens, cache, **kw)
        if logits is None:
            return logits, hidden
        bias = np.zeros(logits.shape, np.float32)
        n = logits.shape[0]
        for r in range(n):
            nxt = P + L - n + r + 1 - start  # row r sits at position P + L - n + r and picks the next one
            if 0 <= nxt < len(script):
                bias[r, script[nxt]] = 1e4
        return logits + mx.array(bias), hidden

    def scripted_draft(self: Drafter, target: Any, cache: Any, bonus: Any, hidden: Any, n: int, **kw: Any) -> Any:
        got, q = draft(self, target, cache, bonus, hidden, n, **kw)
        first = cache.offset + 1 - start  # the drafts are positions P + 1 ... P + n
        if 0 <= first and first + n <= len(script):
            return mx.array(script[first : first + n], dtype=mx.uint32), q
        return got, q

    monkeypatch.setattr(Target, "forward", biased_forward)
    if drafts:
        monkeypatch.setattr(Drafter, "draft", scripted_draft)
