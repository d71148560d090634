"""A reply's forced start: OpenAI's `tool_choice` "required" or a named function, as decoding constraints.

The reply must begin with a call: `<|tool_call>call:NAME{` for one of the allowed names. Each allowed
name's opening is tokenized the way the prompt's text is (`<|tool_call>` is one special token, the
text after it is encoded on its own, as a tokenizer always splits text at special tokens), and the
sequences go into a token trie (`ForcedPrefix`). Right after the prompt's prefill the decoder walks
it (core.decode.spec.SpecDecoder.prefill_turn): where one token can follow, that token is forced;
where several can (the first token where two names differ), the target's logits choose among them
(every other token masked out, then picked as usual: greedy or sampled). After the trie's last token
(the "{") the model writes the arguments freely and may go on to more calls.

The walk runs on the target alone before the first speculative round, so the drafter never proposes
a forced token and greedy output with the drafter stays identical to the target alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

# GenerationSettings.tool_choice: the reply calls one of the declared tools (OpenAI's "required");
# any other non-None value names the one tool it calls
REQUIRED = "*"


@dataclass
class ForcedPrefix:
    """A token trie: from this node, the tokens that may come next; `end` marks a complete opening."""

    children: dict[int, ForcedPrefix] = field(default_factory=dict)
    end: bool = False

    def add(self, tokens: Sequence[int]) -> None:
        node = self
        for tok in tokens:
            node = node.children.setdefault(int(tok), ForcedPrefix())
        node.end = True

    @property
    def depth(self) -> int:
        """The longest path's length in tokens (the most a walk can emit)."""
        return 1 + max((c.depth for c in self.children.values()), default=-1) if self.children else 0


def tool_choice_names(tools: Sequence[dict] | None, choice: str | None) -> list[str]:
    """The names a forced reply may call; [] when nothing is forced. ValueError for a name not declared."""
    if choice is None or not tools:
        return []
    names = [str(t["function"]["name"]) for t in tools]
    if choice == REQUIRED:
        return names
    if choice not in names:
        raise ValueError(f"tool_choice names {choice!r}, which is not among the declared tools ({', '.join(names)})")
    return [choice]


def forced_prefix(call_start: int, names: Sequence[str], encode: Callable[[str], list[int]]) -> ForcedPrefix | None:
    """The trie of `<|tool_call>call:NAME{` for each name (`encode`: text -> ids, no special tokens added)."""
    if not names:
        return None
    root = ForcedPrefix()
    for name in names:
        root.add([call_start, *encode(f"call:{name}{{")])
    return root


def choice_to_openai(choice: str | None) -> str | dict | None:
    """GenerationSettings.tool_choice as OpenAI's `tool_choice` field (None: leave it out, i.e. auto)."""
    if choice is None:
        return None
    if choice == REQUIRED:
        return "required"
    return {"type": "function", "function": {"name": choice}}
