"""From chat messages to the target's token ids, and what of the cache a new prompt can reuse.

- Rendering uses the checkpoint's own chat template (the tokenizer's, or `chat_template.jinja` in
  the checkpoint when the tokenizer has none), except for requests with tools (below); the template
  writes `<bos>` itself, so the text is tokenised without special tokens (never a second `<bos>`).
- Every special id is read from `config.json`, `generation_config.json` or the tokenizer.
- Images and audio: the template writes one placeholder per image (audio clip); `expand_images`
  (`expand_media` for both kinds) turns each into `boi + image_token * n + eoi` (`boa + audio_token *
  n + eoa`) and reports where each one's soft tokens sit.
- Thinking: Gemma 4 writes its reasoning inside a channel (`<|channel>thought\\n...<channel|>`).
  The markers are read from the tokenizer as strings; `split_thinking`/`strip_thinking` take the
  reasoning out of a reply before it goes back into the history.
- Cache reuse: `TokenLog` holds the ids committed to the target's cache for this conversation,
  with the images they contain; `plan_reuse` says how much of it a new prompt can keep.

Messages: `[{"role": "system" | "user" | "assistant" | "tool", "content": str | [item, ...]}]` with
items `{"type": "text", "text": str}`, `{"type": "image", ...}` or `{"type": "audio", ...}` (the source
keys are read by core.model.image and core.model.audio_input: a path, encoded bytes, or for audio raw
samples with their `sample_rate`; extra keys are ignored here), and tool use in the OpenAI shape
(`check_messages`). A request with tools (declared, or calls and results in the history) renders with
Gemma 4's canonical format instead of the checkpoint's template (`encode_chat`, `core.decode.chat_format`
says why).
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.decode.tool_calls import ToolMarkers

Message = dict[str, Any]
# mlx-lm's TokenizerWrapper or the Hugging Face tokenizer inside it (neither is typed)
Tokenizer = Any


# --- rendering ----------------------------------------------------------------------------


def _hf(tokenizer: Tokenizer) -> Any:
    """The Hugging Face tokenizer inside mlx-lm's TokenizerWrapper (or the tokenizer itself)."""
    return getattr(tokenizer, "_tokenizer", tokenizer)


def load_chat_template(model_dir: str | Path) -> str | None:
    """The checkpoint's template: `chat_template.jinja`, else `tokenizer_config.json`'s."""
    from core.model.loader import read_checkpoint_text

    model_dir = Path(model_dir)
    jinja = read_checkpoint_text(model_dir, "chat_template.jinja")
    if jinja is not None:
        return jinja
    cfg = _read_json(model_dir / "tokenizer_config.json")
    template = cfg.get("chat_template")
    if isinstance(template, list):  # the older named-template form
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) else None


def chat_template(tokenizer: Tokenizer, model_dir: str | Path | None = None) -> str:
    """The template rendering will use; raises if neither the tokenizer nor the dir has one."""
    template = getattr(_hf(tokenizer), "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default") or next(iter(template.values()), None)
    if not template and model_dir is not None:
        template = load_chat_template(model_dir)
    if not template:
        raise ValueError("the checkpoint has no chat template (tokenizer_config.json or chat_template.jinja)")
    return template


def supports_thinking(tokenizer: Tokenizer, model_dir: str | Path | None = None) -> bool:
    """Whether the chat template reacts to `enable_thinking`."""
    try:
        return "enable_thinking" in chat_template(tokenizer, model_dir)
    except ValueError:
        return False


def render_messages(
    tokenizer: Tokenizer,
    messages: Sequence[Message],
    *,
    thinking: bool = False,
    add_generation_prompt: bool = True,
    template: str | None = None,
) -> str:
    """Render messages with the chat template (ends with the generation prompt by default).

    `template` overrides the tokenizer's (pass `load_chat_template(dir)` for a checkpoint whose
    tokenizer carries none). `enable_thinking` is always passed explicitly: mlx-lm's wrapper
    would otherwise switch it on for any vocabulary with channel tokens.
    """
    kwargs: dict[str, Any] = dict(add_generation_prompt=add_generation_prompt, enable_thinking=thinking)
    if template is not None:
        kwargs["chat_template"] = template
    from jinja2 import TemplateError

    try:
        text = _hf(tokenizer).apply_chat_template(list(messages), tokenize=False, **kwargs)
    except TemplateError as e:  # the template's own error (or the sandbox refusing it), not the engine's
        raise ValueError(f"the checkpoint's chat template failed: {type(e).__name__}: {e}") from None
    if not isinstance(text, str):
        raise TypeError(f"chat template rendered {type(text).__name__}, expected str")
    return text


def encode_rendered(tokenizer: Tokenizer, text: str) -> list[int]:
    """Tokenise template output: no special tokens added (the template wrote `<bos>`)."""
    return list(_hf(tokenizer).encode(text, add_special_tokens=False))


def encode_messages(
    tokenizer: Tokenizer, messages: Sequence[Message], *, thinking: bool = False, template: str | None = None
) -> list[int]:
    """render_messages + encode_rendered: prompt ids with one placeholder per image."""
    return encode_rendered(tokenizer, render_messages(tokenizer, messages, thinking=thinking, template=template))


@dataclass(frozen=True)
class ChatPrompt:
    """A rendered chat turn: ids with one placeholder per image or audio clip, and those items in order."""

    ids: list[int]
    images: list[dict]
    audio: list[dict]
    ends_in_thought: bool = False  # the prompt ends inside an open thought channel (after a tool result)
    canonical: bool = False  # rendered by core.decode.chat_format (the request uses tools)


def empty_thought_prompt(tokenizer: Tokenizer, template: str | None = None) -> bool:
    """Whether the checkpoint's template follows the generation prompt with an empty thought channel
    when thinking is off (Gemma 4 12B/26B/31B do, E2B/E4B do not): the canonical variant to use."""
    markers = thinking_markers(tokenizer)
    if markers is None:
        return False
    try:
        text = render_messages(tokenizer, [{"role": "user", "content": "x"}], thinking=False, template=template)
    except Exception:  # a template that cannot render a plain turn has no say
        return False
    return text.endswith(f"{markers.start}thought\n{markers.end}")


def encode_chat(
    tokenizer: Tokenizer,
    messages: Sequence[Message],
    *,
    tools: Sequence[Message] | None = None,
    thinking: bool = False,
    empty_thought: bool = False,
    template: str | None = None,
) -> ChatPrompt:
    """The prompt of a chat turn. With tools declared or tool calls/results in the history, Gemma 4's
    canonical format (core.decode.chat_format; `empty_thought` picks the 12B/26B/31B variant), else
    the checkpoint's own template. Raises ValueError for messages or tools it cannot render."""
    from core.decode import chat_format

    if not chat_format.uses_tools(messages, tools):
        ids = encode_messages(tokenizer, messages, thinking=thinking, template=template)
        return ChatPrompt(ids, media_items(messages, "image"), media_items(messages, "audio"))
    rendered = chat_format.render(
        chat_format.normalize_messages(messages),
        chat_format.normalize_tools(list(tools) if tools is not None else None),
        bos=getattr(_hf(tokenizer), "bos_token", None) or "",
        empty_thought=empty_thought,
        thinking=thinking,
    )
    ids = encode_rendered(tokenizer, rendered.text)
    return ChatPrompt(ids, list(rendered.images), list(rendered.audio), rendered.ends_in_thought, True)


ROLES = ("system", "user", "assistant", "tool")
_REASONING_FIELDS = ("reasoning_content", "reasoning", "thinking")


def check_messages(messages: Any) -> None:
    """Raise ValueError naming the first item that is not a chat message of the form above:
    "message 2: role must be one of system, user, assistant, tool, got 'bot'".

    Tool use in the OpenAI shape: an assistant message may carry `tool_calls` (then its content may
    be null) with `function.arguments` a JSON object or its JSON text; a `role: "tool"` message
    answers one (`tool_call_id`, optional `name`) with text or text and image items. The native
    form (`tool_responses: [{name, response}]` on the assistant message) is taken too."""
    from core.decode.chat_format import normalize_messages

    if not isinstance(messages, list):
        raise ValueError(f"expected a list of messages, got {type(messages).__name__}")
    if not messages:
        raise ValueError("the message list is empty")
    for i, m in enumerate(messages, 1):
        where = f"message {i}"
        if not isinstance(m, dict):
            raise ValueError(f"{where}: expected an object {{role, content}}, got {type(m).__name__}")
        role = m.get("role")
        if role not in ROLES:
            raise ValueError(f"{where}: role must be one of {', '.join(ROLES)}, got {role!r}")
        acts = _check_tool_fields(m, role, where)
        if m.get("content") is None:
            if acts:
                continue
            raise ValueError(f"{where}: has no content")
        _check_content(m["content"], where)
    normalize_messages(messages)  # the calls' names and JSON arguments ("message 3, tool call 1: ...")


def _check_tool_fields(m: dict, role: str, where: str) -> bool:
    """The tool-use fields of one message; True if it carries calls or results (content may be null)."""
    for name in ("tool_calls", "tool_responses"):
        if m.get(name) is not None and role != "assistant":
            raise ValueError(f"{where}: only an assistant message has {name}")
    calls, results = m.get("tool_calls"), m.get("tool_responses")
    if calls is not None:
        if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
            raise ValueError(f"{where}: tool_calls must be a list of objects {{id, type, function}}")
        for j, call in enumerate(calls, 1):
            if call.get("id") is not None and not isinstance(call["id"], str):
                raise ValueError(f"{where}, tool call {j}: id must be a string")
    if results is not None and (
        not isinstance(results, list) or not all(isinstance(r, dict) and "response" in r for r in results)
    ):
        raise ValueError(f"{where}: tool_responses must be a list of objects {{name, response}}")
    for name in ("tool_call_id", "name", *_REASONING_FIELDS):
        if m.get(name) is not None and not isinstance(m[name], str):
            raise ValueError(f"{where}: {name} must be a string")
    return bool(calls) or bool(results)


def _check_content(content: Any, where: str) -> None:
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise ValueError(f"{where}: content must be a string or a list of items, got {type(content).__name__}")
    for j, item in enumerate(content, 1):
        at = f"{where}, item {j}"
        if not isinstance(item, dict):
            raise ValueError(f"{at}: expected an object with a type, got {type(item).__name__}")
        kind = item.get("type")
        if kind == "text":
            if not isinstance(item.get("text"), str):
                raise ValueError(f'{at}: a text item needs "text": a string')
        elif kind == "image":
            source = item.get("path") or item.get("image") or item.get("url")
            if not isinstance(source, str) or not source:
                raise ValueError(f'{at}: an image item needs "path": a file name')
        elif kind == "audio":
            if not _has_audio_source(item):
                raise ValueError(f'{at}: an audio item needs "path": a file name')
        else:
            raise ValueError(f"{at}: type must be text, image or audio, got {kind!r}")


def _has_audio_source(item: dict) -> bool:
    """A file name, encoded bytes, or samples (anything with a length, e.g. an array) with a sample rate."""
    source = next((item[k] for k in ("path", "audio", "url") if item.get(k) is not None), None)
    if isinstance(source, str):
        return bool(source)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return len(source) > 0
    return hasattr(source, "shape") and "sample_rate" in item


def media_items(messages: Sequence[Message], kind: str) -> list[dict]:
    """The items of one kind ("image" or "audio") in prompt order: the placeholders the template writes."""
    return [
        item
        for m in messages
        if not isinstance(m.get("content"), str)
        for item in m.get("content") or ()
        if isinstance(item, dict) and item.get("type") == kind
    ]


def count_images(messages: Sequence[Message]) -> int:
    """Image items in the messages, i.e. the placeholders the template will write."""
    return len(media_items(messages, "image"))


def count_audio(messages: Sequence[Message]) -> int:
    """Audio items in the messages, i.e. the placeholders the template will write."""
    return len(media_items(messages, "audio"))


# --- images -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageTokenIds:
    boi: int  # begin of image
    image: int  # one soft token (also what the template writes as the placeholder)
    eoi: int  # end of image


def image_token_ids(model_dir: str | Path) -> ImageTokenIds:
    """Read boi/image/eoi ids from config.json (top level, where Gemma 4 keeps them)."""
    cfg = _read_json(Path(model_dir) / "config.json")
    try:
        return ImageTokenIds(int(cfg["boi_token_id"]), int(cfg["image_token_id"]), int(cfg["eoi_token_id"]))
    except KeyError as e:
        raise ValueError(f"config.json has no {e.args[0]}: the checkpoint does not take images") from None


def expand_images(
    ids: Sequence[int], soft_token_counts: Sequence[int], image_ids: ImageTokenIds
) -> tuple[list[int], list[tuple[int, int]]]:
    """Replace the i-th image placeholder by `boi + [image] * n_i + eoi`.

    Returns the new ids and, per image, the span [start, end) of its soft tokens (boi and eoi
    lie just outside it). The number of placeholders must equal the number of counts.
    """
    out, (spans,) = expand_media(ids, [(image_ids, soft_token_counts)])
    return out, spans


@dataclass(frozen=True)
class AudioTokenIds:
    boa: int  # begin of audio
    audio: int  # one soft token (also what the template writes as the placeholder)
    eoa: int  # end of audio


def audio_token_ids(model_dir: str | Path) -> AudioTokenIds:
    """Read boa/audio/eoa ids from config.json (`eoa_token_id`, or `eoa_token_index` as the 12B names it)."""
    cfg = _read_json(Path(model_dir) / "config.json")
    eoa = cfg.get("eoa_token_id", cfg.get("eoa_token_index"))
    try:
        if eoa is None:
            raise KeyError("eoa_token_id")
        return AudioTokenIds(int(cfg["boa_token_id"]), int(cfg["audio_token_id"]), int(eoa))
    except KeyError as e:
        raise ValueError(f"config.json has no {e.args[0]}: the checkpoint does not take audio") from None


_KIND_NAMES = {ImageTokenIds: ("image", "an image", "images"), AudioTokenIds: ("audio", "an audio clip", "audio clips")}


def expand_media(
    ids: Sequence[int], kinds: Sequence[tuple[ImageTokenIds | AudioTokenIds, Sequence[int]]]
) -> tuple[list[int], list[list[tuple[int, int]]]]:
    """One pass over the ids for several kinds (images, audio): the i-th placeholder of a kind becomes
    `begin + [placeholder] * n_i + end` with that kind's i-th count. Returns the new ids and, per kind,
    the span [start, end) of each one's soft tokens. Each kind's placeholders must equal its counts."""
    out: list[int] = []
    spans: list[list[tuple[int, int]]] = [[] for _ in kinds]
    by_id = {_triple(tok_ids)[1]: k for k, (tok_ids, _) in enumerate(kinds)}
    for tok in ids:
        k = by_id.get(tok)
        if k is None:
            out.append(tok)
            continue
        tok_ids, counts = kinds[k]
        begin, placeholder, end = _triple(tok_ids)
        name, one, many = _KIND_NAMES[type(tok_ids)]
        if len(spans[k]) == len(counts):
            raise ValueError(f"the prompt has more {name} placeholders than the {len(counts)} {many} given")
        n = counts[len(spans[k])]
        if n < 1:
            raise ValueError(f"{one} needs at least one soft token")
        out.append(begin)
        spans[k].append((len(out), len(out) + n))
        out.extend([placeholder] * n)
        out.append(end)
    for (tok_ids, counts), found in zip(kinds, spans):
        if len(found) != len(counts):
            name, _, many = _KIND_NAMES[type(tok_ids)]
            raise ValueError(f"the prompt has {len(found)} {name} placeholders for {len(counts)} {many}")
    return out, spans


def _triple(tok_ids: ImageTokenIds | AudioTokenIds) -> tuple[int, int, int]:
    if isinstance(tok_ids, ImageTokenIds):
        return tok_ids.boi, tok_ids.image, tok_ids.eoi
    return tok_ids.boa, tok_ids.audio, tok_ids.eoa


# --- stop ids -----------------------------------------------------------------------------


def stop_ids(model_dir: str | Path, tokenizer: Tokenizer) -> set[int]:
    """Union of config.json / generation_config.json `eos_token_id` (int or list) and the
    tokenizer's eos (and, when mlx-lm's wrapper is passed, its eos set)."""
    model_dir = Path(model_dir)
    ids: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        cfg = _read_json(model_dir / name)
        for section in (cfg, cfg.get("text_config") or {}):
            ids.update(_as_ids(section.get("eos_token_id")))
    ids.update(_as_ids(getattr(_hf(tokenizer), "eos_token_id", None)))
    ids.update(_as_ids(getattr(tokenizer, "eos_token_ids", None)))
    ids.update(tool_stop_ids(tokenizer))
    return ids


def tool_stop_ids(tokenizer: Tokenizer) -> set[int]:
    """`<|tool_response>` by its text in the vocabulary: the model writes it after its calls, and a
    reply that went on would invent the tool's answer. Real checkpoints list it in
    generation_config.json too (50); conversions without that file still stop."""
    id_ = _hf(tokenizer).get_vocab().get(TOOL_RESPONSE)
    return {int(id_)} if id_ is not None else set()


TOOL_RESPONSE = "<|tool_response>"


def tool_markers(tokenizer: Tokenizer) -> ToolMarkers | None:
    """The tool-call markers' ids (core.decode.tool_calls), or None: a vocabulary without tool calls."""
    from core.decode.tool_calls import tool_markers as from_vocab

    return from_vocab(_hf(tokenizer).get_vocab())


def _as_ids(value: int | Iterable[int] | None) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


# --- thinking -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ThinkingMarkers:
    start: str  # opens the channel, e.g. "<|channel>"
    end: str  # closes it, e.g. "<channel|>"


def thinking_markers(tokenizer: Tokenizer) -> ThinkingMarkers | None:
    """The channel markers as strings, from the tokenizer's named special tokens
    (`soc_token`/`eoc_token`, "start/end of channel"), else from its vocabulary; None if absent."""
    hf = _hf(tokenizer)
    start, end = getattr(hf, "soc_token", None), getattr(hf, "eoc_token", None)
    if isinstance(start, str) and isinstance(end, str) and start and end:
        return ThinkingMarkers(start, end)
    vocab = hf.get_vocab()
    if "<|channel>" in vocab and "<channel|>" in vocab:
        return ThinkingMarkers("<|channel>", "<channel|>")
    return None


_CHANNEL_NAME = re.compile(r"[A-Za-z_]+\n")


def split_thinking(text: str, markers: ThinkingMarkers | None) -> tuple[str, str]:
    """(thinking, answer) from reply text that keeps the channel markers.

    Works on partial text too: an open channel with no end yet is all thinking. The channel
    name line ("thought\\n") is dropped from the thinking; several channels are joined.
    """
    if markers is None or markers.start not in text:
        return "", text
    thoughts: list[str] = []
    answer: list[str] = []
    rest = text
    while True:
        i = rest.find(markers.start)
        if i < 0:
            answer.append(rest)
            break
        answer.append(rest[:i])
        rest = rest[i + len(markers.start) :]
        j = rest.find(markers.end)
        body, rest = (rest, "") if j < 0 else (rest[:j], rest[j + len(markers.end) :])
        m = _CHANNEL_NAME.match(body)
        thoughts.append(body[m.end() :] if m else body)
        if j < 0:
            break
    return "\n".join(t.strip() for t in thoughts if t.strip()), "".join(answer).lstrip()


def strip_thinking(text: str, markers: ThinkingMarkers | None) -> str:
    """The reply without its thinking channel(s): what goes back into the history."""
    return split_thinking(text, markers)[1]


def strip_thinking_from_history(messages: Iterable[Message], markers: ThinkingMarkers | None) -> list[Message]:
    """Copies of the messages with thinking removed from every assistant turn."""
    out = []
    for m in messages:
        if m.get("role") != "assistant" or markers is None:
            out.append(m)
            continue
        content = m.get("content")
        if isinstance(content, str):
            content = strip_thinking(content, markers)
        elif content is not None:
            content = [
                {**item, "text": strip_thinking(item["text"], markers)}
                if isinstance(item, dict) and item.get("type") == "text" and isinstance(item.get("text"), str)
                else item
                for item in content
            ]
        out.append({**m, "content": content})
    return out


# --- committed tokens and cache reuse -----------------------------------------------------


@dataclass(frozen=True)
class ImageSpan:
    """The soft tokens of one image or audio clip in the prompt (a media span: the reuse rules are the same)."""

    start: int  # first soft token
    end: int  # one past the last soft token
    key: Hashable = None  # identity of the image or clip (a hash of its pixels or samples); equal ids are not enough


MediaSpan = ImageSpan


@dataclass(frozen=True)
class ReusePlan:
    keep: int  # cached tokens to keep (trim the cache to this length)
    suffix: list[int]  # new_prompt[keep:], to prefill; never empty


def plan_reuse(
    committed: Sequence[int],
    new_prompt: Sequence[int],
    committed_images: Sequence[ImageSpan] = (),
    new_images: Sequence[ImageSpan] = (),
) -> ReusePlan:
    """How much of the cached conversation a new prompt can keep.

    keep = the longest common prefix of the two id lists, then
    - at most len(new_prompt) - 1: the last prompt token is always run again, so the
      prefill yields logits;
    - never inside an image: soft-token ids are the same for every image, so two images are
      the same only if their spans and keys are equal; the prefix ends before the first image
      that differs, and a prefix ending inside an image backs off to its boi token so that the
      whole image is prefilled together.
    """
    if not new_prompt:
        raise ValueError("empty prompt")
    keep = 0
    limit = min(len(committed), len(new_prompt) - 1)
    while keep < limit and committed[keep] == new_prompt[keep]:
        keep += 1
    old = {(s.start, s.end): s.key for s in committed_images}
    for span in sorted(new_images, key=lambda s: s.start):
        if span.start - 1 >= keep:  # the image starts at/after the cut (boi at start-1)
            break
        same = old.get((span.start, span.end), _MISSING) == span.key
        if not same or span.end > keep:
            keep = max(span.start - 1, 0)  # re-run from the boi token
            break
    # a committed image that the new prompt does not have at the same place
    for span in committed_images:
        if span.start - 1 < keep and not any(
            (s.start, s.end, s.key) == (span.start, span.end, span.key) for s in new_images
        ):
            keep = max(span.start - 1, 0)
    return ReusePlan(keep=keep, suffix=list(new_prompt[keep:]))


_MISSING = object()


@dataclass
class TokenLog:
    """The ids in the target's cache for this conversation, in order, with their images.

    The engine keeps it equal to the cache: `truncate` when the cache is trimmed, `extend`
    when tokens are committed (prefill suffix, then each turn's reply).
    """

    ids: list[int] = field(default_factory=list)
    images: list[ImageSpan] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)

    def plan(self, new_prompt: Sequence[int], new_images: Sequence[ImageSpan] = ()) -> ReusePlan:
        return plan_reuse(self.ids, new_prompt, self.images, new_images)

    def truncate(self, n: int) -> None:
        """Keep the first n ids; images that would be cut are dropped (a plan never cuts one)."""
        del self.ids[n:]
        self.images = [s for s in self.images if s.end <= n]

    def extend(self, ids: Iterable[int], images: Iterable[ImageSpan] = ()) -> None:
        """Append ids; `images` spans are absolute positions (as in the full prompt)."""
        self.ids.extend(int(i) for i in ids)
        for s in images:
            if s.end > len(self.ids):
                raise ValueError("an image span lies past the committed ids")
            if s not in self.images:
                self.images.append(s)

    def apply(self, plan: ReusePlan, new_images: Sequence[ImageSpan] = ()) -> None:
        """After prefilling a plan: the log is the new prompt."""
        self.truncate(plan.keep)
        self.extend(plan.suffix, [s for s in new_images if s.start >= plan.keep])

    def clear(self) -> None:
        self.ids.clear()
        self.images.clear()


def _read_json(path: Path) -> dict:
    from core.model.loader import read_checkpoint_json  # a FIFO or a device is refused, never read

    return read_checkpoint_json(path.parent, path.name)
