"""The user's config file (TOML): read with tomllib, validated, written back with tomlkit.

Every problem is reported with the file, the key and why, e.g.
  config.toml: [sampling].temperature must be a finite number >= 0, got "hot"
Unknown keys are errors too (a typo silently ignored is worse), with a "did you mean" hint.
Saving edits only the keys that changed, so the user's comments and layout survive.
"""

from __future__ import annotations

import os
import stat
import tempfile
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from difflib import get_close_matches
from pathlib import Path
from typing import Any

from core.limits import (
    DEFAULT_IMAGE_BUDGET,
    IMAGE_BUDGETS,  # noqa: F401  # re-exported: the settings screen reads it here
)
from core.settings import (
    SAMPLING_CHECKS,
    BadValue,
    GenerationSettings,
    check_block_size,
    check_image_budget,
)
from core.user import paths
from core.user.keymap import ACTION_NAMES, ACTIONS, DEFAULT_KEYS, KeymapError, resolve_keys, split_keys, suggest
from core.user.mcp_config import McpServerConfig, default_servers, parse_mcp


@dataclass
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy, which also gives the drafter its best acceptance
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_tokens: int = 2048
    seed: int | None = None


@dataclass
class Config:
    default_pairing: str | None = None  # a catalogue name or "demo"; None: the first start opens the models screen
    block_size: int | str = "auto"  # core.limits: 1..16 or "auto"
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    system_prompt: str | None = None
    thinking: bool = False
    theme: str = "textual-dark"  # a Textual theme name; the UI checks it exists
    offline: bool = False
    image_budget: int = DEFAULT_IMAGE_BUDGET
    export_dir: str | None = None  # where Ctrl+S writes chats; None = the user's documents folder
    keys: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_KEYS))  # every action, overrides applied
    key_overrides: dict[str, str] = field(default_factory=dict)  # just what the file's [keys] says
    # [mcp.servers.NAME]: the chat's tool servers (core.user.mcp_config), the time server by default
    mcp_servers: dict[str, McpServerConfig] = field(default_factory=default_servers)
    path: Path | None = None  # the file this came from (it need not exist)

    def export_path(self) -> Path:
        """Where exports go: export_dir (~ expanded), else the user's documents folder."""
        return Path(self.export_dir).expanduser() if self.export_dir else paths.documents_dir()

    def generation_settings(self) -> GenerationSettings:
        s = self.sampling
        return GenerationSettings(
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            seed=s.seed,
            block_size=self.block_size,
            thinking=self.thinking,
            system_prompt=self.system_prompt,
            image_budget=self.image_budget,
        )


class ConfigError(ValueError):
    def __init__(self, path: Path | str, problems: list[str]) -> None:
        self.path = Path(path)
        self.problems = problems
        super().__init__("\n".join(f"{path}: {p}" for p in problems))


# --- validation ---------------------------------------------------------------------------------
def _show(value: Any) -> str:
    """A value the way it looks in TOML, for error messages."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return str(value)


_Bad = BadValue  # the checks below raise it with `why`


def _string(v: Any) -> str:
    if not isinstance(v, str):
        raise _Bad("must be a string")
    return v


def _name(v: Any) -> str:
    if not isinstance(v, str) or not v.strip():
        raise _Bad("must be a non-empty string")
    return v.strip()


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise _Bad("must be true or false")
    return v


# one set of checks for the config, the command line and the TUI (core.settings)
_block_size = check_block_size
_image_budget = check_image_budget


def _system_prompt(v: Any) -> str | None:
    return _string(v) or None


def _directory(v: Any) -> str | None:
    return _string(v).strip() or None


TOP_LEVEL: dict[str, Callable[[Any], Any]] = {
    "default_pairing": _name,
    "block_size": _block_size,
    "system_prompt": _system_prompt,
    "thinking": _bool,
    "theme": _name,
    "offline": _bool,
    "image_budget": _image_budget,
    "export_dir": _directory,
}
SAMPLING: dict[str, Callable[[Any], Any]] = SAMPLING_CHECKS
TABLES = ("sampling", "keys", "mcp")
ALL_KEYS = (*TOP_LEVEL, *(f"[sampling].{k}" for k in SAMPLING), *(f"[keys].{a}" for a in ACTION_NAMES))


def _unknown(where: str, key: str, known: list[str]) -> str:
    hint = suggest(key, known)
    if not hint:  # a key in the wrong place: `temperature = 0.7` at the top level
        leaves = {k.split(".")[-1]: k for k in ALL_KEYS if k.split(".")[-1] not in known}
        match = get_close_matches(key, list(leaves), n=1, cutoff=0.75)
        if match:
            hint = f" (did you mean {leaves[match[0]]}?)"
    return f"unknown key {where}{key}{hint}"


def validate(data: Mapping[str, Any], path: Path | str = paths.CONFIG_FILENAME) -> Config:
    """A parsed TOML document -> Config; raises ConfigError listing every problem."""
    problems: list[str] = []
    config = Config(path=Path(path))
    for key, value in data.items():
        if key in TABLES:
            if not isinstance(value, dict):
                problems.append(f"[{key}] must be a table, got {_show(value)}")
            continue
        check = TOP_LEVEL.get(key)
        if check is None:
            problems.append(_unknown("", key, [*TOP_LEVEL, *TABLES]))
            continue
        try:
            setattr(config, key, check(value))
        except _Bad as bad:
            problems.append(f"{key} {bad.why}, got {_show(value)}")

    sampling = data.get("sampling", {})
    if isinstance(sampling, dict):
        for key, value in sampling.items():
            check = SAMPLING.get(key)
            if check is None:
                problems.append(_unknown("[sampling].", key, list(SAMPLING)))
                continue
            try:
                setattr(config.sampling, key, check(value))
            except _Bad as bad:
                problems.append(f"[sampling].{key} {bad.why}, got {_show(value)}")

    config.mcp_servers = parse_mcp(data.get("mcp"), problems)
    keys = data.get("keys", {})
    if isinstance(keys, dict):
        good: dict[str, str] = {}
        for action, value in keys.items():
            if action not in DEFAULT_KEYS:
                problems.append(_unknown("[keys].", action, list(ACTION_NAMES)))
            elif not isinstance(value, str):
                problems.append(f'[keys].{action} must be a key string like "ctrl+r", got {_show(value)}')
            else:
                try:
                    split_keys(value)
                    good[action] = value
                except KeymapError as e:
                    problems.append(f"[keys].{action}: {e}")
        config.key_overrides = dict(keys) if isinstance(keys, dict) else {}
        if not problems:
            try:
                config.keys = resolve_keys(good)
            except KeymapError as e:  # two actions on one key
                problems.append(f"[keys]: {e}")
    if problems:
        raise ConfigError(path, problems)
    return config


# --- files --------------------------------------------------------------------------------------
CONFIG_MAX_BYTES = 1 << 20  # a settings file; a 200 MB system_prompt would freeze the app before it draws


def read_config_text(path: Path) -> str | None:
    """The config file's text, None when there is none. A regular file only (a FIFO would hang the app
    before it draws, /dev/zero never ends), at most CONFIG_MAX_BYTES, UTF-8."""
    try:
        # O_NONBLOCK: opening a FIFO would otherwise wait for a writer forever
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ConfigError(path, [f"cannot read: {e.strerror or e}"]) from e
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # before fdopen, which refuses a folder with its own error
        os.close(fd)
        raise ConfigError(path, ["is not a regular file (a FIFO, a device or a folder): point it at a file"])
    with os.fdopen(fd, "rb") as f:
        try:
            raw = f.read(CONFIG_MAX_BYTES + 1)
        except OSError as e:
            raise ConfigError(path, [f"cannot read: {e.strerror or e}"]) from e
    if len(raw) > CONFIG_MAX_BYTES:
        raise ConfigError(path, [f"is larger than {CONFIG_MAX_BYTES >> 20} MiB, too large for a settings file"])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(path, ["not UTF-8 text"]) from e


def _parse(text: str, path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(path, [f"not valid TOML: {e}"]) from e
    except RecursionError:
        raise ConfigError(path, ["nests tables or arrays too deeply to be a settings file"]) from None


def load_config(path: str | Path | None = None) -> Config:
    """Read and validate the config file; a missing file gives the defaults."""
    path = Path(path) if path is not None else paths.config_file()
    text = read_config_text(path)
    if text is None:
        return Config(path=path)
    return validate(_parse(text, path), path)


def _flatten(changes: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """{"sampling": {"top_k": 5}} and {"sampling.top_k": 5} both -> [(("sampling", "top_k"), 5)]."""
    out: list[tuple[tuple[str, ...], Any]] = []
    for key, value in changes.items():
        parts = (*prefix, *key.split(".")) if isinstance(key, str) and "." in key else (*prefix, key)
        if isinstance(value, Mapping):
            out.extend(_flatten(value, parts))
        else:
            out.append((parts, value))
    return out


def save_config(changes: Mapping[str, Any], path: str | Path | None = None) -> Config:
    """Apply `changes` to the file and write it back, touching only those keys (comments survive).
    Keys nest ({"sampling": {"temperature": 0.7}}) or use dots ({"sampling.temperature": 0.7});
    a value of None removes the key (back to the default). Nothing is written if the result would
    not validate. Returns the new Config."""
    import tomlkit  # only saving needs it

    path = Path(path) if path is not None else paths.config_file()
    text = read_config_text(path)
    if text is None:
        text = DEFAULT_CONFIG_TEXT  # a first save writes the commented template around the change
    else:
        _parse(text, path)  # its faults as load_config says them (tomlkit's parser would recurse too)
        check_writable(path)
    try:
        doc = tomlkit.parse(text)
    except Exception as e:  # tomlkit's ParseError; the message has the line and column
        raise ConfigError(path, [f"not valid TOML: {e}"]) from e

    for parts, value in _flatten(changes):
        if len(parts) > 2:
            raise ConfigError(path, [f"unknown key {'.'.join(parts)}"])
        table: Any = doc
        if len(parts) == 2:
            section, key = parts
            if section not in doc:
                if value is None:
                    continue
                doc[section] = tomlkit.table()
            table = doc[section]
        else:
            (key,) = parts
        if value is None:
            if key in table:
                del table[key]
        else:
            table[key] = value

    new_text = tomlkit.dumps(doc)
    config = validate(_parse(new_text, path), path)
    paths.ensure_dir(path.parent)
    # write-then-rename: a crash mid-save leaves the old file, never half of one
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(new_text)
            f.flush()
            os.fsync(f.fileno())
        # the user's own file: mkstemp made it 0600; an existing file keeps only its owner's bits
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o700 or 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return config


def check_writable(path: Path) -> None:
    """A config file its owner made read-only (no owner write bit) is theirs to keep as it is: saving would
    replace it (write-then-rename works in a writable folder) and drop the mode. Root included."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    if not mode & stat.S_IWUSR:
        raise ConfigError(path, [f"is read-only (mode {stat.S_IMODE(mode):04o}), so it was left as it is"])


def _keys_template() -> str:
    lines = ["[keys]", "# Every action and its default key; uncomment a line and change the key to rebind it."]
    for action in ACTIONS:
        lines.append(f"# {action.name} = {action.key!r}".replace("'", '"') + f"   # {action.description}")
    return "\n".join(lines) + "\n"


DEFAULT_CONFIG_TEXT = """\
# gemma-chat settings. Every key is here with its default; delete a line to get the default back.

# default_pairing = "demo"       # the pairing a plain `gemma-chat` opens ("demo", or a name from
                                 # `gemma-chat models list`, where * marks it); unset: the first start
                                 # shows the models screen. Choosing a pairing by name sets it.
block_size = "auto"              # tokens verified per round (drafts + 1): 1..16, or "auto"
thinking = false                 # let the model think before answering (where it can)
theme = "textual-dark"
offline = false                  # never touch the network
image_budget = 280               # soft tokens per image: 70, 140, 280, 560 or 1120
# system_prompt = "You are a helpful assistant."
# export_dir = "~/Documents"     # where Ctrl+S writes chats as Markdown (default: your documents folder)

[sampling]
temperature = 0.0                # 0 = greedy
top_p = 1.0
top_k = 0                        # 0 = off
max_tokens = 2048
# seed = 0


# Tool servers (MCP) the chat offers the model; it asks before each call unless the server is trusted.
# The time server (pip package mcp-server-time) is there by default. Add others like this:
# [mcp.servers.files]
# command = "npx"
# args = ["-y", "@modelcontextprotocol/server-filesystem", "/home/me/notes"]
# env = { }
# trusted = false                # true: run its tools without asking
# timeout = 30                   # seconds a call may take
# [mcp.servers.remote]
# url = "http://127.0.0.1:8931/mcp"   # a streamable HTTP server
# headers = { Authorization = "Bearer ..." }
# [mcp.servers.time]
# enabled = false                # turn the default time server off

""" + _keys_template()


def write_default_config(path: str | Path | None = None) -> Path:
    """Write the commented template if there is no config file yet; returns the path."""
    path = Path(path) if path is not None else paths.config_file()
    if not path.exists():
        paths.ensure_dir(path.parent)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(DEFAULT_CONFIG_TEXT)
    return path
