"""Gemma 4's canonical chat format (the 2026-07-09 template) in Python, for prompts with tools.

Why a renderer of our own: tool declarations, calls and results must reach the model exactly as it
was trained on them, and checkpoints ship templates that disagree there. The April 2026 revisions
print `None` for null, paste string arguments verbatim (`call:f{{"n": 1}}`) and, in the earliest
one, know no `role: "tool"` messages; the tiny test checkpoints ship a simplified template with no
tools at all. So whenever a request carries tools or tool messages, the prompt is rendered here;
without them the checkpoint's own template still renders it (`core.decode.prompt`).
`tests/unit/test_chat_format.py` checks this renderer token for token against the canonical Jinja
template (vendored in tests/data/templates) on a table of cases, for both variants:

- E2B/E4B: the generation prompt is `<|turn>model\\n`;
- 12B/26B/31B (`empty_thought=True`): with thinking off it is followed by an empty thought channel
  `<|channel>thought\\n<channel|>`. The two canonical files differ only there.

Where this module deliberately differs from the template, it does so on the way in, in
`normalize_messages` / `normalize_tools`, never in `render`:
- OpenAI `tool_calls[].function.arguments` is a JSON string: it is decoded (the template refuses
  strings);
- a `role: "tool"` message whose content is a JSON object or array string is rendered as that
  value (`response:f{temp:15}`), as vLLM's and llama.cpp's Gemma 4 paths do and as Google's docs
  show, instead of the template's `response:f{value:<|"|>{"temp": 15}<|"|>}`;
- a JSON-schema `type` given as a list (`["string", "null"]`) or an `anyOf` of one type and null
  becomes that type plus `nullable: true` (the template would print `['STRING', 'NULL']`).

Jinja semantics reproduced on purpose: `dictsort` orders keys case-insensitively (stable), numbers
print as Python's `str()` (`1e-05`), a missing description prints as nothing, and the template's
quirks (an unclosed `parameters:{` when a schema has no `type`) are kept: they are what the model saw.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

QUOTE = '<|"|>'
STANDARD_KEYS = ("description", "type", "properties", "required", "nullable")
_MEDIA = {"image": "<|image|>", "image_url": "<|image|>", "audio": "<|audio|>", "input_audio": "<|audio|>"}
_MEDIA["video"] = "<|video|>"
THOUGHT_OPEN = "<|channel>thought\n"
EMPTY_THOUGHT = "<|channel>thought\n<channel|>"


class _Missing:
    """Jinja's Undefined, as far as the template uses it: falsy, prints as ''."""

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        return ""


MISSING: Any = _Missing()


@dataclass(frozen=True)
class RenderedPrompt:
    text: str
    images: tuple[dict, ...]  # the image items, in the order of their `<|image|>` placeholders
    audio: tuple[dict, ...]  # the audio items, in the order of their `<|audio|>` placeholders
    ends_in_thought: bool  # the prompt ends inside an open thought channel (after a tool result)


class ToolFormatError(ValueError):
    """Messages or tools that cannot be rendered; the message names the item."""


# --- values -------------------------------------------------------------------------------------


def _get(value: Any, key: str) -> Any:
    return value.get(key, MISSING) if isinstance(value, Mapping) else MISSING


def _s(value: Any) -> str:
    """Jinja's print: None -> 'None', Undefined -> ''."""
    return value if isinstance(value, str) else str(value)


def _upper(value: Any) -> str:
    return _s(value).upper()


def dictsort(mapping: Mapping) -> list[tuple[Any, Any]]:
    """Jinja's `dictsort`: by key, case-insensitive, stable for keys equal but for case."""
    return sorted(mapping.items(), key=lambda kv: kv[0].lower() if isinstance(kv[0], str) else kv[0])


def format_argument(value: Any, escape_keys: bool = True) -> str:
    """A value as the template writes call arguments, enums and tool results."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return QUOTE + value + QUOTE
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        items = (
            (QUOTE + _s(k) + QUOTE if escape_keys else _s(k)) + ":" + format_argument(v, escape_keys)
            for k, v in dictsort(value)
        )
        return "{" + ",".join(items) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(format_argument(v, escape_keys) for v in value) + "]"
    return _s(value)


def _quoted_list(items: Any) -> str:
    return ",".join(QUOTE + _s(item) + QUOTE for item in items)


# --- declarations ---------------------------------------------------------------------------------


def _parameters(properties: Mapping, filter_keys: bool = False) -> str:
    """`format_parameters`: each property as `name:{description,enum|items,nullable,properties,required,type}`."""
    out = []
    for key, value in dictsort(properties):
        if filter_keys and key in STANDARD_KEYS:
            continue
        parts = []
        if description := _get(value, "description"):
            parts.append(f"description:{QUOTE}{_s(description)}{QUOTE}")
        kind = _upper(_get(value, "type"))
        if kind == "STRING" and (enum := _get(value, "enum")):
            parts.append("enum:" + format_argument(enum))
        elif kind == "ARRAY" and isinstance(items := _get(value, "items"), Mapping) and items:
            parts.append("items:{" + _items(items) + "}")
        if _get(value, "nullable"):
            parts.append("nullable:true")
        if kind == "OBJECT":
            nested = _get(value, "properties")
            if isinstance(nested, Mapping):
                parts.append("properties:{" + _parameters(nested) + "}")
            elif isinstance(value, Mapping):  # no properties: the template walks the schema itself
                parts.append("properties:{" + _parameters(value, filter_keys=True) + "}")
            if required := _get(value, "required"):
                parts.append("required:[" + _quoted_list(required) + "]")
        parts.append(f"type:{QUOTE}{kind}{QUOTE}")
        out.append(f"{_s(key)}:{{" + ",".join(parts) + "}")
    return ",".join(out)


def _items(items: Mapping) -> str:
    parts = []
    for key, value in dictsort(items):
        if value is None:
            continue
        if key == "properties":
            parts.append("properties:{" + (_parameters(value) if isinstance(value, Mapping) else "") + "}")
        elif key == "required":
            parts.append("required:[" + _quoted_list(value) + "]")
        elif key == "type":
            upper = value.upper() if isinstance(value, str) else [_upper(v) for v in value]
            parts.append("type:" + format_argument(upper))
        else:
            parts.append(f"{_s(key)}:" + format_argument(value))
    return ",".join(parts)


def format_declaration(tool: Mapping) -> str:
    """`format_function_declaration`: `declaration:NAME{description:...,parameters:{...}}`."""
    fn = tool["function"]
    out = f"declaration:{_s(fn['name'])}{{description:{QUOTE}{_s(fn.get('description', MISSING))}{QUOTE}"
    params = fn.get("parameters", MISSING)
    if params:
        out += ",parameters:{"
        if properties := _get(params, "properties"):
            out += "properties:{" + _parameters(properties) + "},"
        if required := _get(params, "required"):
            out += "required:[" + _quoted_list(required) + "],"
        if kind := _get(params, "type"):
            out += f"type:{QUOTE}{_upper(kind)}{QUOTE}}}"
    if "response" in fn:
        response = fn["response"]
        out += ",response:{"
        if description := _get(response, "description"):
            out += f"description:{QUOTE}{_s(description)}{QUOTE},"
        if _upper(_get(response, "type")) == "OBJECT":
            out += f"type:{QUOTE}OBJECT{QUOTE}}}"
    return (out + "}").strip()


# --- turns ------------------------------------------------------------------------------------


def strip_channels(text: str) -> str:
    """The template's `strip_thinking`: drop every `<|channel>...<channel|>` span, then trim."""
    out = ""
    for part in text.split("<channel|>"):
        out += part.split("<|channel>")[0]
    return out.strip()


def tool_response_block(name: str, response: Any) -> str:
    if isinstance(response, Mapping):
        body = ",".join(f"{_s(k)}:{format_argument(v, False)}" for k, v in dictsort(response))
        return f"<|tool_response>response:{name}{{{body}}}<tool_response|>"
    return f"<|tool_response>response:{name}{{value:{format_argument(response, False)}}}<tool_response|>"


def _tool_call(call: Mapping) -> str:
    fn = call["function"]
    args = fn.get("arguments", MISSING)
    if isinstance(args, Mapping):
        body = ",".join(f"{_s(k)}:{format_argument(v, False)}" for k, v in dictsort(args))
    elif args is None:
        body = ""
    else:
        raise ToolFormatError("tool_calls[].function.arguments must be a JSON object")
    return f"<|tool_call>call:{_s(fn['name'])}{{{body}}}<tool_call|>"


def _tool_results(message: Mapping, following: Sequence[Mapping], media: dict[str, list[dict]]) -> str:
    """The results that answer `message`'s calls: native `tool_responses`, else the `role: "tool"`
    messages right after it (a name resolved from `tool_call_id`, as the template does)."""
    out = ""
    if responses := message.get("tool_responses"):
        for r in responses:
            out += tool_response_block(_s(r.get("name") or "unknown"), r.get("response", MISSING))
        return out
    calls = message.get("tool_calls") or ()
    for follow in following:
        if follow.get("role") != "tool":
            break
        name = follow.get("name") or "unknown"
        for call in calls:
            if call.get("id") == follow.get("tool_call_id"):
                name = call["function"]["name"]
        body = follow.get("content")
        if "response" in follow:  # a JSON result, decoded by normalize_messages
            out += tool_response_block(_s(name), follow["response"])
        elif isinstance(body, list):
            text = "".join(p.get("text", "") for p in body if p.get("type") == "text")
            out += tool_response_block(_s(name), text)
            for part in body:
                if placeholder := _MEDIA.get(part.get("type")):
                    out += placeholder
                    media.setdefault(placeholder, []).append(part)
        else:
            out += tool_response_block(_s(name), body)
    return out


def _content(message: Mapping, model: bool, media: dict[str, list[dict]]) -> str:
    content = message.get("content")
    clean = strip_channels if model else str.strip
    if isinstance(content, str):
        return clean(content)
    out = ""
    if isinstance(content, list):
        for item in content:
            kind = item.get("type")
            if kind == "text":
                out += clean(item["text"])
            elif placeholder := _MEDIA.get(kind):
                out += placeholder
                media.setdefault(placeholder, []).append(item)
    return out


def _reasoning(message: Mapping) -> Any:
    """The thought to replay: `reasoning`, else the first of reasoning_content / thinking / reasoning
    that is set (transformers aliases those names before the template runs)."""
    names = ("reasoning_content", "thinking", "reasoning")
    first = next((message[k] for k in names if message.get(k) is not None), None)
    return message.get("reasoning") or first


def _system(messages: Sequence[Mapping], tools: Sequence[Mapping], thinking: bool) -> tuple[str, str | None, int]:
    """The system turn (thinking switch, system text, declarations): (text, last part's type, messages used)."""
    has_system = bool(messages) and messages[0].get("role") in ("system", "developer")
    if not (thinking or tools or has_system):
        return "", None, 0
    out, kind = "<|turn>system\n", None
    if thinking:
        out, kind = out + "<|think|>\n", "think"
    if has_system:
        content = messages[0].get("content")
        if isinstance(content, str):
            out += content.strip()
        elif isinstance(content, list):
            out += "".join(_s(item.get("text", MISSING)).strip() + " " for item in content)
    if tools:
        out += "".join("<|tool>" + format_declaration(t) + "<tool|>" for t in tools)
        kind = "tool"
    return out + "<turn|>\n", kind, 1 if has_system else 0


def render(
    messages: Sequence[Mapping],
    tools: Sequence[Mapping] | None = None,
    *,
    bos: str = "<bos>",
    empty_thought: bool = False,
    thinking: bool = False,
    add_generation_prompt: bool = True,
    preserve_thinking: bool = False,
) -> RenderedPrompt:
    """Render normalized messages (`normalize_messages`) and tools (`normalize_tools`) as the
    canonical template does. `empty_thought`: the 12B/26B/31B variant."""
    tools = list(tools or ())
    system, prev, skip = _system(messages, tools, thinking)
    loop = list(messages[skip:])
    parts = [bos, system]
    media: dict[str, list[dict]] = {}  # placeholder -> its items, in prompt order
    last_user = max((i for i, m in enumerate(loop) if m.get("role") == "user"), default=-1)
    prev_role = None
    for i, m in enumerate(loop):
        if m.get("role") == "tool":
            continue
        prev = None
        role = "model" if m["role"] == "assistant" else m["role"]
        if not (role == "model" and prev_role == "assistant"):
            parts.append(f"<|turn>{role}\n")
        thought = _reasoning(m)
        if thought and (i > last_user or (preserve_thinking and m.get("tool_calls"))):
            parts.append(f"{THOUGHT_OPEN}{thought}\n<channel|>")
        if m.get("tool_calls"):
            parts.extend(_tool_call(c) for c in m["tool_calls"])
            prev = "tool_call"
        results = _tool_results(m, loop[i + 1 :], media) if m.get("tool_calls") or m.get("tool_responses") else ""
        if results:
            parts.append(results)
            prev = "tool_response"
        content = _content(m, role == "model", media)
        parts.append(content)
        next_role = next((n["role"] for n in loop[i + 1 :] if n.get("role") != "tool"), None)
        if prev == "tool_call":
            parts.append("<|tool_response>")
        elif role == "model" and next_role == "assistant" and (not m.get("tool_calls") or results):
            pass  # the next assistant message continues this model turn
        elif not (results and not content.strip() and next_role is None):
            parts.append("<turn|>\n")
        prev_role = m["role"]
    ends_in_thought = False
    if add_generation_prompt:
        if prev not in ("tool_response", "tool_call"):
            parts.append("<|turn>model\n" + (EMPTY_THOUGHT if empty_thought and not thinking else ""))
        elif prev == "tool_response" and thinking:
            parts.append(THOUGHT_OPEN)
            ends_in_thought = True
    images, audio = tuple(media.get("<|image|>", ())), tuple(media.get("<|audio|>", ()))
    return RenderedPrompt("".join(parts), images, audio, ends_in_thought)


# --- requests in the OpenAI shape -> the template's input ---------------------------------------------

# What a tool name may be: the call format ends a name at "{"; MCP-style names use "-", "." and ":".
TOOL_NAME_CHARS = "letters, digits, '_', '-', '.' and ':'"


def is_tool_name_char(c: str) -> bool:
    return c.isalnum() or c in "_-.:"


def valid_tool_name(name: Any) -> bool:
    return isinstance(name, str) and bool(name) and all(is_tool_name_char(c) for c in name)


def uses_tools(messages: Sequence[Mapping], tools: Sequence[Mapping] | None) -> bool:
    """Whether a request needs the canonical format: tools declared, or tool calls/results in the history."""
    return bool(tools) or any(
        m.get("role") == "tool" or m.get("tool_calls") or m.get("tool_responses") for m in messages
    )


def normalize_tools(tools: Any) -> list[dict]:
    """An OpenAI `tools` list as the template reads it; raises ToolFormatError naming the bad tool.

    Accepts `{"type": "function", "function": {name, description?, parameters?}}` and the bare
    function object; the schema goes through `normalize_schema`."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise ToolFormatError(f"tools must be a list, got {type(tools).__name__}")
    out: list[dict] = []
    seen: set[str] = set()
    for i, tool in enumerate(tools, 1):
        where = f"tool {i}"
        if not isinstance(tool, dict):
            raise ToolFormatError(f"{where}: expected an object {{type, function}}, got {type(tool).__name__}")
        if tool.get("type", "function") != "function":
            raise ToolFormatError(f'{where}: type must be "function", got {tool.get("type")!r}')
        fn = tool.get("function", tool)
        if not isinstance(fn, dict):
            raise ToolFormatError(f"{where}: function must be an object, got {type(fn).__name__}")
        name = fn.get("name")
        if not isinstance(name, str) or not valid_tool_name(name):
            raise ToolFormatError(f"{where}: function.name must be a string of {TOOL_NAME_CHARS}, got {name!r}")
        if name in seen:
            raise ToolFormatError(f"{where}: a second tool named {name!r}")
        seen.add(name)
        clean: dict[str, Any] = {"name": name}
        if (description := fn.get("description")) is not None:
            if not isinstance(description, str):
                raise ToolFormatError(f"{where} ({name}): description must be a string")
            clean["description"] = description
        if (params := fn.get("parameters")) is not None:
            if not isinstance(params, dict):
                raise ToolFormatError(f"{where} ({name}): parameters must be a JSON schema object")
            clean["parameters"] = normalize_schema(params)
        if isinstance(fn.get("response"), dict):
            clean["response"] = fn["response"]
        out.append({"type": "function", "function": clean})
    return out


def normalize_schema(schema: Any) -> Any:
    """A JSON schema with the two forms the template cannot print rewritten: a list `type` and an
    `anyOf`/`oneOf` of one type and null both become that type with `nullable: true`."""
    if isinstance(schema, list):
        return [normalize_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: normalize_schema(v) for k, v in schema.items()}
    kind = out.get("type")
    if isinstance(kind, list):
        real = [t for t in kind if t != "null"]
        if real:
            out["type"] = real[0]
        if "null" in kind:
            out["nullable"] = True
    for key in ("anyOf", "oneOf"):
        options = out.get(key)
        if "type" in out or not isinstance(options, list) or not all(isinstance(o, dict) for o in options):
            continue
        real = [o for o in options if o.get("type") != "null"]
        if len(real) == 1 and len(real) < len(options):
            del out[key]
            out = {**real[0], **out, "nullable": True}
    return out


def _decode_arguments(args: Any, where: str) -> dict | None:
    if args is None or isinstance(args, dict):
        return args
    if not isinstance(args, str):
        raise ToolFormatError(f"{where}: arguments must be a JSON object or its JSON text, got {type(args).__name__}")
    if not args.strip():
        return None
    try:
        value = json.loads(args)
    except json.JSONDecodeError as e:
        raise ToolFormatError(f"{where}: arguments is not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(value, dict):
        raise ToolFormatError(f"{where}: arguments must be a JSON object, got {type(value).__name__}")
    return value


def _decode_result(content: str) -> Any:
    """A tool result's JSON object or array, else the text itself (a plain answer stays a string)."""
    text = content.strip()
    if not text or text[0] not in "{[":
        return content
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return content
    return value if isinstance(value, (dict, list)) else content


def normalize_messages(messages: Sequence[Mapping]) -> list[dict]:
    """Copies of chat messages as `render` reads them: OpenAI `tool_calls` with their JSON-string
    arguments decoded, and each `role: "tool"` message's JSON content decoded into `response`.
    Raises ToolFormatError naming the message and call."""
    out = []
    for i, m in enumerate(messages, 1):
        m = dict(m)
        if m.get("tool_calls"):
            calls = []
            for j, call in enumerate(m["tool_calls"], 1):
                where = f"message {i}, tool call {j}"
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not valid_tool_name(fn.get("name")):
                    raise ToolFormatError(f"{where}: needs function.name, a string of {TOOL_NAME_CHARS}")
                function = {"name": fn["name"], "arguments": _decode_arguments(fn.get("arguments"), where)}
                clean: dict[str, Any] = {"type": "function", "function": function}
                if "id" in call:
                    clean["id"] = call["id"]
                calls.append(clean)
            m["tool_calls"] = calls
        if m.get("role") == "tool" and isinstance(m.get("content"), str):
            decoded = _decode_result(m["content"])
            if decoded is not m["content"]:
                m["response"] = decoded
        out.append(m)
    return out
