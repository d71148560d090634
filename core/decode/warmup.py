"""Warm-up runs: short decoding runs of every kind a chat meets first, to build and trace its compiled pieces.

`steps` gives them over a loaded pairing (the first token of a greeting, plain decoding, every block size,
a second turn that continues the cache, a prompt longer than the compiled pieces take, sampling, an image
prompt where the pairing takes images), each on a scratch cache, never the conversation's. MLX's CPU kernels
depend on the graph, the dtypes and the broadcast layout of the inputs, not on the text, so any prompt does.
core.engine.warmup (a child process) runs them to build the kernels; the engine runs them again, between
requests, to trace them (core.engine.kernels).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from core.decode import prompt as prompt_mod
from core.decode.detok import Detokenizer
from core.decode.spec import Controls, Decoder, Prompt
from core.limits import IMAGE_BUDGETS, MAX_BLOCK_SIZE
from core.model.image import ImageProcessorConfig, preprocess_image
from core.settings import GenerationSettings

GREETING = [{"role": "user", "content": "Hello"}]
LONG_TEXT = " ".join(["Speculative decoding drafts a few tokens and the target checks them in one step."] * 6)
CONTINUATION = "\nWhat is gemma-chat?"
IMAGE_QUESTION = "What is in this picture?"


def steps(
    target: Any,
    drafter: Any,
    tokenizer: Any,
    vision: Any = None,
    target_dir: Path | None = None,
    cancel: threading.Event | None = None,
) -> list[tuple[str, Callable[[], None]]]:
    """(name, run) for each warm-up step over a loaded pairing (engine thread only). A decoder of their
    own: the conversation's auto block size must not learn from warm-up rounds. With a vision tower (or
    the unified patch embedder) and its checkpoint folder, an image turn too. A step ends at its next
    round once `cancel` is set (a real request came: it must not wait for a warm-up step)."""
    decoder = Decoder(target, drafter, Detokenizer(tokenizer))
    cancel = cancel or threading.Event()
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
            controls = Controls(settings.block_size, settings.drafter_enabled, cancel_event=cancel)
            decoder.run(cache, prompt, settings, _ignore, controls)
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
    if vision is not None and target_dir is not None:
        plan.append(("image", image_turn(decoder, target, tokenizer, vision, target_dir, cancel)))
    return plan


def picture() -> Any:
    """A small synthetic RGB picture (PIL), wider than tall as photos are: gradients and a square."""
    from PIL import Image

    ys, xs = np.mgrid[0:96, 0:144]
    rgb = np.stack([xs * 255 // 143, ys * 255 // 95, (xs + ys) % 256], axis=-1).astype(np.uint8)
    rgb[24:72, 48:96] = (250, 40, 40)
    return Image.fromarray(rgb, "RGB")


def image_turn(
    decoder: Decoder, target: Any, tokenizer: Any, vision: Any, target_dir: Path, cancel: threading.Event
) -> Callable[[], None]:
    """A first image prompt as the engine runs it (its preprocessing, the tower or patch embedder, the
    soft-token rows, the prompt's bidirectional image span, then decoding), at the smallest image budget:
    the kernels depend on the graph and the dtypes, not on how many patches there are, and a small
    budget keeps this step short on the engine thread."""

    def go() -> None:
        import mlx.core as mx

        config = ImageProcessorConfig.from_model_dir(target_dir).with_max_soft_tokens(min(IMAGE_BUDGETS))
        image = preprocess_image(picture(), config)
        content = [{"type": "image", "path": "warm-up"}, {"type": "text", "text": IMAGE_QUESTION}]
        ids = prompt_mod.encode_messages(tokenizer, [{"role": "user", "content": content}])
        ids, (spans,) = prompt_mod.expand_media(
            ids, [(prompt_mod.image_token_ids(target_dir), [image.num_soft_tokens])]
        )
        (a, b) = spans[0]
        soft = vision.encode_image(image)  # [n, H]
        rows = mx.concatenate(
            [
                mx.zeros((a, soft.shape[1]), target.dtype),
                soft.astype(target.dtype),
                mx.zeros((len(ids) - b, soft.shape[1]), target.dtype),
            ]
        )
        flags = mx.array([a <= i < b for i in range(len(ids))])
        prompt = Prompt(ids, embeddings=rows, embedding_mask=flags, bidirectional=[(a, b)])
        settings = GenerationSettings(max_tokens=8, ignore_eos=True)
        controls = Controls(settings.block_size, True, cancel_event=cancel)
        decoder.run(target.make_cache(), prompt, settings, _ignore, controls)

    return go


def _ignore(event: object) -> None:
    pass
