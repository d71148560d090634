"""The prompt sets the auto block size is judged on: recorded traces (scripts/record_traces.py) and the
real timed runs (scripts/measure_autoblock.py) use the same ones. A second, held-out set of the same
categories (`cases_for(pairing, held_out=True)`, traces in tests/data/traces-held-out/) is never tuned
on: a controller change that only fits the first set's replies shows there.

A case is one reply: a chat (the last message is the user's; a "second turn" case carries the first
turn's question and the target's own reply to it, filled in by the recorder), a category and a reply
length. Categories: "in-corpus" (asked as the demo's corpus asks it), "paraphrase" (its topics in other
words), "off-topic" (nothing the demo knows), "second-turn" (a follow-up in the same chat), "long" (a
300-token reply; eos is ignored, so the target runs on past what it was trained to say).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Case:
    name: str
    category: str
    user: str
    first_turn: str | None = None  # "second-turn": the first question (the recorder adds the reply)
    max_tokens: int = 160
    ignore_eos: bool = False
    system: str | None = None
    tags: tuple[str, ...] = field(default=())


DEMO_CASES = [
    Case("speculative", "in-corpus", "What is speculative decoding?"),
    Case("who", "in-corpus", "Who are you?"),
    Case("app", "in-corpus", "What is gemma-chat?"),
    Case("hello", "in-corpus", "Hello!"),
    Case("json-dumps", "in-corpus", "What does json.dumps do?"),
    Case("para-speculative", "paraphrase", "Could you tell me how speculative decoding makes replies quicker?"),
    Case("para-app", "paraphrase", "In a few words, what is this application for?"),
    Case("para-keys", "paraphrase", "Which key changes how many tokens are drafted?"),
    Case("off-haiku", "off-topic", "Write a haiku about the sea."),
    Case("off-capital", "off-topic", "What is the capital of France?"),
    Case("off-recipe", "off-topic", "Give me a recipe for pancakes with blueberries."),
    Case(
        "turn2-again",
        "second-turn",
        "Can you say that again in other words?",
        first_turn="What is speculative decoding?",
    ),
    Case("turn2-weather", "second-turn", "And what is the weather like today?", first_turn="Hello!"),
    Case(
        "long", "long", "Tell me everything about gemma-chat and speculative decoding.", max_tokens=300, ignore_eos=True
    ),
]

# The reference pack's targets were trained on Python-stdlib docstrings (tests/data/pack/README.md) and end
# their replies within a few tokens; like the measurements that found auto slower (96-200 greedy tokens),
# their replies run on past the eos to 128 tokens (300 for "long").
PACK_CASES = [
    Case("reverse", "in-corpus", "How do I reverse a list in place?", max_tokens=128, ignore_eos=True),
    Case("pathlib", "in-corpus", "Explain: what does the pathlib module provide?", max_tokens=128, ignore_eos=True),
    Case(
        "para-dict",
        "paraphrase",
        "Why does looking something up in a dict stay quick as it grows?",
        max_tokens=128,
        ignore_eos=True,
    ),
    Case(
        "off-dragon", "off-topic", "Tell me a story about a dragon who learns to fly.", max_tokens=128, ignore_eos=True
    ),
    Case("off-capital", "off-topic", "What is the capital of France?", max_tokens=128, ignore_eos=True),
    Case(
        "turn2-files",
        "second-turn",
        "Explain: how do I list the files in a directory with it?",
        first_turn="Explain: what does the pathlib module provide?",
        max_tokens=128,
        ignore_eos=True,
    ),
    Case("long", "long", "Explain: what does the json module provide?", max_tokens=300, ignore_eos=True),
]

# The sampled settings the traces are also recorded at (Gemma 4's recommended sampling).
SAMPLED = {"temperature": 1.0, "top_p": 0.95, "top_k": 64}

PACK_FAMILIES = ["e-style", "moe-style", "dense-style"]


# Held out: other replies of the same categories (tests/data/traces-held-out/).
HELD_OUT_DEMO_CASES = [
    Case("gemma4", "in-corpus", "What is Gemma 4?"),
    Case("block", "in-corpus", "How do I change the block size?"),
    Case("keys", "in-corpus", "What are the keys of this app?"),
    Case("py-rev", "in-corpus", "Write a Python function that reverses a string."),
    Case("para-mlx", "paraphrase", "Can you explain in short what MLX is for?"),
    Case("para-drafter", "paraphrase", "So what does the small drafter model actually do?"),
    Case("para-quit", "paraphrase", "how would I leave the app"),
    Case("off-moon", "off-topic", "How far away is the moon?"),
    Case("off-poem", "off-topic", "Write a short poem about rain in the city."),
    Case("off-math", "off-topic", "What is 17 times 23?"),
    Case("turn2-more", "second-turn", "Tell me more about that.", first_turn="What is Gemma 4?"),
    Case("turn2-joke", "second-turn", "Now tell me a joke.", first_turn="Hi"),
    Case(
        "long2",
        "long",
        "Explain the keys, the block size and the drafter of this app in detail.",
        max_tokens=300,
        ignore_eos=True,
    ),
]

HELD_OUT_PACK_CASES = [
    Case("sort", "in-corpus", "How do I sort a list of tuples by the second item?", max_tokens=128, ignore_eos=True),
    Case("itertools", "in-corpus", "Explain: what does the itertools module provide?", max_tokens=128, ignore_eos=True),
    Case("para-set", "paraphrase", "Why is checking membership in a set so fast?", max_tokens=128, ignore_eos=True),
    Case("off-poem", "off-topic", "Write a short poem about rain in the city.", max_tokens=128, ignore_eos=True),
    Case("off-moon", "off-topic", "How far away is the moon?", max_tokens=128, ignore_eos=True),
    Case(
        "turn2-os",
        "second-turn",
        "Explain: how do I read an environment variable with it?",
        first_turn="Explain: what does the os module provide?",
        max_tokens=128,
        ignore_eos=True,
    ),
    Case("long2", "long", "Explain: what does the collections module provide?", max_tokens=300, ignore_eos=True),
]


def cases_for(pairing: str, held_out: bool = False) -> list[Case]:
    if held_out:
        return HELD_OUT_DEMO_CASES if pairing == "demo" else HELD_OUT_PACK_CASES
    return DEMO_CASES if pairing == "demo" else PACK_CASES
