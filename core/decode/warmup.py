"""Warm-up runs: short decoding runs of every kind a chat meets first, to build and trace its compiled pieces.

`steps` gives them over a loaded pairing (the first token of a greeting, plain decoding, every block size,
a second turn that continues the cache, a prompt longer than the compiled pieces take, sampling), each on
a scratch cache, never the conversation's. MLX's CPU kernels depend on the graph, the dtypes and the
broadcast layout of the inputs, not on the text, so any prompt does. core.engine.warmup (a child process)
runs them to build the kernels; the engine runs them again, between requests, to trace them
(core.engine.kernels).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from core.decode import prompt as prompt_mod
from core.decode.detok import Detokenizer
from core.decode.spec import Controls, Decoder, Prompt
from core.limits import MAX_BLOCK_SIZE
from core.settings import GenerationSettings

GREETING = [{"role": "user", "content": "Hello"}]
LONG_TEXT = " ".join(["Speculative decoding drafts a few tokens and the target checks them in one step."] * 6)
CONTINUATION = "\nWhat is gemma-chat?"


def steps(target: Any, drafter: Any, tokenizer: Any) -> list[tuple[str, Callable[[], None]]]:
    """(name, run) for each warm-up step over a loaded pairing (engine thread only). A decoder of their
    own: the conversation's auto block size must not learn from warm-up rounds."""
    decoder = Decoder(target, drafter, Detokenizer(tokenizer))
    greeting = prompt_mod.encode_messages(tokenizer, GREETING)
    bos = getattr(tokenizer, "bos_token_id", None)
    long_ids = ([bos] if bos is not None else []) + prompt_mod.encode_rendered(tokenizer, LONG_TEXT)
    more = prompt_mod.encode_rendered(tokenizer, CONTINUATION)
    scratch: dict[str, Any] = {}

    def run(ids: list[int], *, keep: bool = False, **kw: Any) -> Callable[[], None]:
        def go() -> None:
            settings = GenerationSettings(**{"max_tokens": 12, "ignore_eos": True, **kw})
            cache = scratch["cache"] if keep else target.make_cache()
            start = cache.offset if keep else 0
            prompt = Prompt(list(ids), start=start)
            decoder.run(cache, prompt, settings, _ignore, Controls(settings.block_size, settings.drafter_enabled))
            scratch["cache"] = cache

        return go

    plan = [
        ("first token", run(greeting, max_tokens=1)),  # the greeting's prompt: the first kernels a user needs
        ("plain decoding", run(greeting, max_tokens=3, drafter_enabled=False)),
    ]
    plan += [
        (f"block size {k}", run(long_ids[:24], block_size=k, max_tokens=2 * k + 2))
        for k in range(2, MAX_BLOCK_SIZE + 1)
    ]
    plan += [
        ("block size 1", run(long_ids[:24], block_size=1)),
        ("greeting", run(greeting)),
        ("second turn", run(more, keep=True)),  # continues the greeting's cache, as a second turn does
        ("long prompt", run(long_ids)),
        ("sampling", run(greeting, temperature=0.8, seed=0)),
        ("sampling top-k/top-p", run(long_ids[:30], temperature=1.0, top_k=64, top_p=0.95, seed=0)),
    ]
    return plan


def _ignore(event: object) -> None:
    pass
