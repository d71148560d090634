"""A chat as Markdown, and code blocks out of a reply (for "copy code")."""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.events import reply_tokens
from core.units import format_duration
from core.user.store import TOOL_ERRORS, TOOL_RESULTS, Chat, Message, tool_calls_of


# --- code blocks --------------------------------------------------------------------------------
@dataclass(frozen=True)
class CodeBlock:
    lang: str  # the info string's first word, "" if none
    code: str  # without the fences and without the final newline
    closed: bool  # False: the reply ended (or was stopped) inside the block


_FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})(.*)$")


def code_blocks(text: str) -> list[CodeBlock]:
    """Fenced code blocks (``` or ~~~), CommonMark's way: a block closes on a fence of the same
    character at least as long; an unclosed block runs to the end of the text."""
    blocks: list[CodeBlock] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m or (m.group(2)[0] == "`" and "`" in m.group(3)):
            i += 1
            continue
        indent, fence, info = len(m.group(1)), m.group(2), m.group(3).strip()
        body: list[str] = []
        i += 1
        closed = False
        while i < len(lines):
            close = _FENCE.match(lines[i])
            if (
                close
                and close.group(2)[0] == fence[0]
                and len(close.group(2)) >= len(fence)
                and not close.group(3).strip()
            ):
                closed = True
                i += 1
                break
            line = lines[i]
            # content lines lose up to the opening fence's indent
            strip = len(line) - len(line.lstrip(" "))
            body.append(line[min(indent, strip) :])
            i += 1
        blocks.append(CodeBlock(lang=info.split()[0] if info else "", code="\n".join(body), closed=closed))
    return blocks


def last_code_block(text: str) -> str | None:
    """The code of the last fenced block in `text`, or None if there is none."""
    blocks = code_blocks(text)
    return blocks[-1].code if blocks else None


# --- Markdown -----------------------------------------------------------------------------------
ROLE_HEADINGS = {"system": "System", "user": "User", "assistant": "Assistant"}


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(ts))


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "none"
    return str(v)


def _link_target(path: str) -> str:
    # <...> keeps paths with spaces or parentheses one link destination (CommonMark)
    return f"<{path}>" if any(c in path for c in " ()<>") else path


# A reply's record may carry, next to TurnStats.as_dict(), the drafter switches made while it streamed
# (the live A/B): [[token, on], ...], `token` being the first token (1-based, as `tokens` counts) of
# the first round that ran with the new setting.
DRAFTER_SWITCHES = "drafter_switches"


def switches_text(switches: Any) -> str:
    """'drafter on from token 31', 'drafter off from token 12, on from token 40' ("" for anything else:
    a damaged record shows without it)."""
    try:
        steps = [f"{'on' if on else 'off'} from token {int(token)}" for token, on in switches]
    except (TypeError, ValueError):
        return ""
    return "drafter " + ", ".join(steps) if steps else ""


def stats_line(stats: dict) -> str:
    """'42 tokens · 31.5 tok/s · TTFT 0.21 s · acceptance 72% · 2.40 tokens/round' from TurnStats.as_dict()
    (and the drafter switches of a live A/B, DRAFTER_SWITCHES)."""
    parts: list[str] = []
    if "tokens" in stats or "decode_tokens" in stats:
        parts.append(f"{reply_tokens(stats)} tokens")
    if stats.get("decode_tps"):
        parts.append(f"{stats['decode_tps']:.1f} tok/s")
    if stats.get("ttft_s"):
        parts.append(f"TTFT {stats['ttft_s']:.2f} s")
    switches = stats.get(DRAFTER_SWITCHES) or []
    if (switches or stats.get("drafter_enabled", True)) and stats.get("drafted"):
        parts.append(f"acceptance {stats.get('acceptance', 0.0):.0%}")
        if stats.get("tokens_per_round"):
            parts.append(f"{stats['tokens_per_round']:.2f} tokens/round")
    if switches_text(switches):
        parts.append(switches_text(switches))
    elif stats.get("drafter_enabled") is False:
        parts.append("drafter off")
    if stats.get("stop_reason") and stats["stop_reason"] not in ("eos", "cancelled"):
        parts.append(f"stop: {stats['stop_reason']}")
    return " · ".join(parts)


def _message_markdown(m: Message, include_stats: bool, include_thinking: bool) -> list[str]:
    out = [f"## {ROLE_HEADINGS.get(m.role, m.role.title())}", ""]
    if include_thinking and m.thinking:
        out += ["<details><summary>Thinking</summary>", "", m.thinking.strip("\n"), "", "</details>", ""]
    if m.content:
        out += [m.content.strip("\n"), ""]
    for a in m.attachments:
        if a.kind == "audio":  # a link to the clip (Markdown has no audio), with its length when readable
            length = _clip_length(a.path)
            out += [f"[audio: {Path(a.path).name}{', ' + length if length else ''}]({_link_target(a.path)})", ""]
        else:
            out += [f"![{Path(a.path).name}]({_link_target(a.path)})", ""]
    out += _tool_lines(m)
    if m.stopped:
        out += ["*(stopped)*", ""]
    if include_stats and m.stats:
        line = stats_line(m.stats)
        if line:
            out += [f"*{line}*", ""]
    return out


def _clip_length(path: str) -> str | None:
    """'3.7 s' or '1:05' from the audio file's header, None when it is gone or unreadable."""
    try:
        import soundfile

        seconds = float(soundfile.info(path).duration)
    except Exception:  # the clip was moved, or is not audio any more: the link alone
        return None
    return format_duration(seconds)


def _tool_lines(m: Message) -> list[str]:
    """A reply's tool calls with their arguments, each result in a collapsed <details>; a call the model
    wrote that could not be decoded, with what was wrong and its text."""
    results = {r.get("tool_call_id"): r for r in (m.stats or {}).get(TOOL_RESULTS) or () if isinstance(r, dict)}
    out: list[str] = []
    for e in (m.stats or {}).get(TOOL_ERRORS) or ():
        if isinstance(e, dict):
            raw = str(e.get("raw", ""))
            fence = "````" if "```" in raw else "```"
            out += [f"**Malformed tool call**: {e.get('message', '')}", "", fence, raw, fence, ""]
    for call in tool_calls_of(m):
        fn = call.get("function") or {}
        out += [f"**Tool call** `{fn.get('name')}`", "", "```json", str(fn.get("arguments", "")), "```", ""]
        r = results.get(call.get("id"))
        if r is not None:
            content = str(r.get("content", ""))
            fence = "````" if "```" in content else "```"
            summary = f"Result ({r.get('shown', '')})" if r.get("shown") not in (None, "done") else "Result"
            out += [f"<details><summary>{summary}</summary>", "", fence, content, fence, "", "</details>", ""]
    return out


def chat_to_markdown(chat: Chat, *, include_stats: bool = True, include_thinking: bool = False) -> str:
    out = [f"# {chat.title}", ""]
    meta: list[str] = []
    if chat.pairing or chat.target_id:
        pairing = chat.pairing or ""
        models = [f"target `{chat.target_id}`"] if chat.target_id else []
        if chat.drafter_id:
            models.append(f"drafter `{chat.drafter_id}`")
        meta.append(f"- Pairing: {pairing}{' (' + ', '.join(models) + ')' if models else ''}".rstrip())
    meta.append(f"- Started: {_when(chat.created_at)}")
    if chat.params:
        meta.append("- Parameters: " + ", ".join(f"{k}={_value(v)}" for k, v in sorted(chat.params.items())))
    out += meta + [""]
    if chat.system_prompt:
        out += ["## System", "", chat.system_prompt.strip("\n"), ""]
    for m in chat.messages:
        out += _message_markdown(m, include_stats, include_thinking)
    return "\n".join(out).rstrip("\n") + "\n"


def _slug(title: str) -> str:
    slug = re.sub(r"[^\w]+", "-", title.lower(), flags=re.UNICODE).strip("-")
    return slug[:50].strip("-") or "chat"


def export_chat(chat: Chat, directory: str | Path | None = None, **options: Any) -> Path:
    """Write the chat as `<title-slug>-<date>.md` in `directory` (default: the current directory),
    never overwriting an existing file; returns the path written."""
    directory = Path(directory) if directory is not None else Path.cwd()
    # private like the history it comes from (0600 in 0700); a folder that exists keeps its own mode
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    stem = f"{_slug(chat.title)}-{time.strftime('%Y%m%d-%H%M', time.gmtime(chat.created_at))}"
    text = chat_to_markdown(chat, **options)
    n = 1
    while True:
        path = directory / (f"{stem}.md" if n == 1 else f"{stem}-{n}.md")
        try:  # O_EXCL: never clobber, even in a race
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            n += 1
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        return path
