"""Config file (TOML) and keymap: defaults, validation messages, overrides, saving with comments."""

from __future__ import annotations

import asyncio
import tomllib
from pathlib import Path

import pytest

from core.settings import GenerationSettings
from core.user import paths
from core.user.config import (
    DEFAULT_CONFIG_TEXT,
    Config,
    ConfigError,
    load_config,
    save_config,
    write_default_config,
)
from core.user.keymap import ACTIONS, CHAR_NAMES, DEFAULT_KEYS, SCOPES, KeymapError, normalize_key, resolve_keys


@pytest.fixture(autouse=True)
def _private_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv(paths.CONFIG_ENV, str(tmp_path / "cfg" / "config.toml"))
    monkeypatch.setenv(paths.DATA_DIR_ENV, str(tmp_path / "data"))
    monkeypatch.setenv(paths.CACHE_DIR_ENV, str(tmp_path / "cache"))


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "config.toml"
    p.write_text(text, encoding="utf-8")
    return p


def error_of(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return str(info.value)


# --- paths --------------------------------------------------------------------------------------
def test_paths_follow_env(tmp_path, monkeypatch):
    assert paths.config_file() == tmp_path / "cfg" / "config.toml"
    assert paths.config_dir() == tmp_path / "cfg"
    assert paths.data_dir() == tmp_path / "data"
    assert paths.cache_dir() == tmp_path / "cache"
    assert paths.history_db() == tmp_path / "data" / "history.sqlite3"
    monkeypatch.delenv(paths.DATA_DIR_ENV)
    monkeypatch.setenv(paths.CONFIG_ENV, "")
    assert paths.data_dir().name == "gemma-chat"  # platformdirs' per-user place, named for the app
    assert paths.config_file().name == "config.toml" and paths.config_file().parent.name == "gemma-chat"
    assert not paths.data_dir().exists() or paths.data_dir() != tmp_path  # nothing created just by asking


# --- loading ------------------------------------------------------------------------------------
def test_missing_file_gives_defaults(tmp_path):
    config = load_config()
    assert config.path == tmp_path / "cfg" / "config.toml"
    assert config.block_size == "auto" and config.image_budget == 280 and not config.thinking
    assert config.keys == DEFAULT_KEYS
    assert not (tmp_path / "cfg").exists()


def test_full_file(tmp_path):
    p = write(
        tmp_path,
        """
default_pairing = "E4B"
block_size = 5
system_prompt = "Answer in French."
thinking = true
theme = "nord"
offline = true
image_budget = 560
[sampling]
temperature = 1
top_p = 0.95
top_k = 64
max_tokens = 300
seed = 7
[keys]
block_size_up = "ctrl+up"
quit = "Ctrl+X"
""",
    )
    config = load_config(p)
    assert (config.default_pairing, config.block_size, config.system_prompt) == ("E4B", 5, "Answer in French.")
    assert config.thinking and config.offline and config.theme == "nord" and config.image_budget == 560
    assert config.sampling.temperature == 1.0 and isinstance(config.sampling.temperature, float)
    assert (config.sampling.top_p, config.sampling.top_k, config.sampling.max_tokens, config.sampling.seed) == (
        0.95,
        64,
        300,
        7,
    )
    assert config.keys["block_size_up"] == "ctrl+up"
    assert config.keys["quit"] == "ctrl+x"
    assert config.keys["send"] == DEFAULT_KEYS["send"]
    assert config.key_overrides == {"block_size_up": "ctrl+up", "quit": "Ctrl+X"}
    settings = config.generation_settings()
    assert settings == GenerationSettings(
        max_tokens=300,
        temperature=1.0,
        top_p=0.95,
        top_k=64,
        seed=7,
        block_size=5,
        thinking=True,
        system_prompt="Answer in French.",
        image_budget=560,
    )
    settings.validate()


@pytest.mark.parametrize(
    "text, message",
    [
        ('[sampling]\ntemperature = "hot"', '[sampling].temperature must be a finite number >= 0, got "hot"'),
        ("[sampling]\ntemperature = -0.5", "[sampling].temperature must be a finite number >= 0, got -0.5"),
        ("[sampling]\ntop_p = 1.5", "[sampling].top_p must be a number > 0 and <= 1, got 1.5"),
        ("[sampling]\ntop_k = 2.5", "[sampling].top_k must be an integer >= 0"),
        ("[sampling]\nmax_tokens = 0", "[sampling].max_tokens must be an integer >= 1, got 0"),
        ("[sampling]\nseed = true", "[sampling].seed must be an integer from 0 to 2**64-1"),
        ("block_size = 17", 'block_size must be an integer 1..16 or "auto", got 17'),
        ('block_size = "fast"', 'block_size must be an integer 1..16 or "auto", got "fast"'),
        ("block_size = true", 'block_size must be an integer 1..16 or "auto", got true'),
        ("image_budget = 300", "image_budget must be one of 70, 140, 280, 560, 1120, got 300"),
        ('thinking = "yes"', 'thinking must be true or false, got "yes"'),
        ('default_pairing = ""', 'default_pairing must be a non-empty string, got ""'),
        ("system_prompt = 3", "system_prompt must be a string, got 3"),
        ("sampling = 3", "[sampling] must be a table, got 3"),
        ("temprature = 1", "unknown key temprature (did you mean [sampling].temperature?)"),
        ("thems = 'x'", "unknown key thems (did you mean 'theme'?)"),
        ("[sampling]\ntopp = 1", "unknown key [sampling].topp (did you mean 'top_p'?)"),
        ("[sampling]\nwhatever = 1", "unknown key [sampling].whatever"),
        ('[keys]\nblock_size_upp = "x"', "unknown key [keys].block_size_upp (did you mean 'block_size_up'?)"),
        ("[keys]\nquit = 5", '[keys].quit must be a key string like "ctrl+r", got 5'),
        ('[keys]\nquit = "hyperx+q"', "[keys].quit: 'hyperx+q': unknown modifier 'hyperx'"),
        ('[keys]\nregenerate = "ctrl+n"', "'ctrl+n' is bound to both 'regenerate' and 'new_chat'"),
        ('[keys]\nmodels = "ctrl+m"', "'enter' is bound to both 'send' and 'models'"),  # ctrl+m IS enter
        ("theme = ", "not valid TOML"),
    ],
)
def test_errors_name_the_key_and_why(tmp_path, text, message):
    p = write(tmp_path, text + "\n")
    err = error_of(p)
    assert err.startswith(f"{p}: ")
    assert message in err


def test_all_problems_reported_at_once(tmp_path):
    p = write(tmp_path, 'theme = 1\n[sampling]\ntemperature = "hot"\ntop_k = -1\n')
    with pytest.raises(ConfigError) as info:
        load_config(p)
    assert len(info.value.problems) == 3
    assert len(str(info.value).splitlines()) == 3


def test_env_var_picks_the_file(tmp_path, monkeypatch):
    p = write(tmp_path, 'theme = "dracula"\n')
    monkeypatch.setenv(paths.CONFIG_ENV, str(p))
    assert load_config().theme == "dracula"


def test_default_template_is_valid_and_matches_defaults(tmp_path):
    p = write_default_config()
    assert p == tmp_path / "cfg" / "config.toml" and p.read_text() == DEFAULT_CONFIG_TEXT
    loaded = load_config()
    assert loaded == Config(path=p)
    p.write_text("theme = 'mine'\n")
    write_default_config()  # never overwrites
    assert load_config().theme == "mine"


# --- saving -------------------------------------------------------------------------------------
USER_FILE = """\
# My gemma-chat setup
theme = "nord"   # easy on the eyes

[sampling]
# warm but not silly
temperature = 0.7  # tuned by hand
top_k = 40

[keys]
quit = "ctrl+x"  # muscle memory
"""


def test_save_keeps_comments_and_changes_only_given_keys(tmp_path):
    p = write(tmp_path, USER_FILE)
    config = save_config({"sampling": {"temperature": 0.3}, "block_size": 4, "keys.stop": "ctrl+g"}, p)
    text = p.read_text()
    for comment in (
        "# My gemma-chat setup",
        "# easy on the eyes",
        "# warm but not silly",
        "# tuned by hand",
        "# muscle memory",
    ):
        assert comment in text
    assert "temperature = 0.3  # tuned by hand" in text
    assert 'theme = "nord"   # easy on the eyes' in text
    assert config.sampling.temperature == 0.3 and config.sampling.top_k == 40 and config.block_size == 4
    assert config.keys["stop"] == "ctrl+g" and config.keys["quit"] == "ctrl+x"
    data = tomllib.loads(text)
    assert data["block_size"] == 4 and "block_size" not in data["sampling"]  # top level, not inside a table
    assert load_config(p) == config


def test_save_none_removes_and_creates_missing_file(tmp_path):
    p = tmp_path / "new" / "config.toml"
    config = save_config({"sampling": {"seed": 3}, "thinking": True}, p)
    assert config.sampling.seed == 3 and config.thinking
    config = save_config({"sampling.seed": None, "theme": None}, p)
    assert config.sampling.seed is None
    # the key is gone; the template's commented line for it stays
    assert "seed =" not in p.read_text().replace("# seed =", "") and "theme =" not in p.read_text()


def test_save_refuses_invalid_result_and_leaves_file(tmp_path):
    p = write(tmp_path, USER_FILE)
    for bad in ({"sampling": {"temperature": "hot"}}, {"keys": {"regenerate": "ctrl+x"}}, {"colour": "red"}):
        with pytest.raises(ConfigError):
            save_config(bad, p)
    assert p.read_text() == USER_FILE
    assert [f.name for f in tmp_path.iterdir()] == ["config.toml"]  # no temp files left behind


def test_save_defaults_to_env_path(tmp_path):
    save_config({"offline": True})
    assert load_config(tmp_path / "cfg" / "config.toml").offline


# --- keymap -------------------------------------------------------------------------------------
def test_default_keymap_is_consistent():
    names = [a.name for a in ACTIONS]
    assert len(names) == len(set(names))
    for required in (
        "send",
        "newline",
        "stop",
        "regenerate",
        "toggle_view",
        "block_size_up",
        "block_size_down",
        "toggle_auto",
        "toggle_drafter",
        "help",
        "palette",
        "quit",
        "attach_image",
        "models",
        "chats",
        "settings",
    ):
        assert required in DEFAULT_KEYS
    assert (DEFAULT_KEYS["block_size_up"], DEFAULT_KEYS["block_size_down"]) == ("plus", "minus")
    assert (DEFAULT_KEYS["toggle_auto"], DEFAULT_KEYS["toggle_drafter"], DEFAULT_KEYS["help"]) == ("a", "d", "f1")
    assert (DEFAULT_KEYS["quit"], DEFAULT_KEYS["attach_image"]) == ("ctrl+q", "ctrl+o")
    assert resolve_keys() == DEFAULT_KEYS  # defaults are normalized and conflict-free
    assert all(a.description for a in ACTIONS) and set(SCOPES.values()) <= {"app", "chat"}
    # single printable keys would type into the prompt box: they must not be app-wide
    for a in ACTIONS:
        if len(a.key) == 1 or a.key in CHAR_NAMES.values():
            assert a.scope == "chat", a.name


def test_override_changes_binding_and_normalizes():
    keys = resolve_keys({"block_size_up": "ctrl+up", "block_size_down": "Ctrl+Down", "toggle_auto": "+"})
    assert keys["block_size_up"] == "ctrl+up" and keys["block_size_down"] == "ctrl+down"
    assert keys["toggle_auto"] == "plus"  # "+" freed by the override of block_size_up
    assert normalize_key("shift+ctrl+a") == "ctrl+shift+a"
    assert normalize_key("ctrl++") == "ctrl+plus"
    assert normalize_key("ctrl+,") == "ctrl+comma"
    assert normalize_key("Esc") == "escape"
    assert resolve_keys({"newline": "ctrl+j, shift+enter"})["newline"] == "ctrl+j,shift+enter"
    with pytest.raises(KeymapError, match="'plus' is bound to both 'block_size_up' and 'toggle_auto'"):
        resolve_keys({"toggle_auto": "+"})
    with pytest.raises(KeymapError, match="unknown action 'stopp'.*did you mean 'stop'"):
        resolve_keys({"stopp": "x"})
    with pytest.raises(KeymapError, match="not a key name"):
        resolve_keys({"stop": "ctrl+&&"})


def test_char_names_match_textual():
    from textual.keys import _character_to_key

    for char, name in CHAR_NAMES.items():
        assert _character_to_key(char) == name, char


def test_textual_delivers_every_default_binding():
    """Each resolved key, pressed in a real Textual app, runs its action."""
    from textual.app import App
    from textual.binding import Binding

    keys = resolve_keys()
    fired: list[str] = []

    class KeyApp(App):
        BINDINGS = [Binding(k, f"hit('{action}')", priority=True) for action, k in keys.items()]

        def action_hit(self, action: str) -> None:
            fired.append(action)

    async def main():
        app = KeyApp()
        async with app.run_test() as pilot:
            for k in keys.values():
                for one in k.split(","):
                    await pilot.press(one)
            await pilot.pause()

    asyncio.run(main())
    expected = [action for action, k in keys.items() for _ in k.split(",")]
    assert fired == expected


def test_data_layer_imports_stay_light():
    """The UI imports these at start-up; none may pull in textual, mlx or tomlkit (only saving needs it)."""
    import subprocess
    import sys

    code = (
        "import sys, core.user.paths, core.user.store, core.user.config, "
        "core.user.keymap, core.user.export, core.user.clipboard; "
        "print(sorted(m for m in ('textual', 'mlx', 'tomlkit', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_default_theme_is_a_textual_theme():
    from textual.theme import BUILTIN_THEMES

    assert Config().theme in BUILTIN_THEMES


def test_template_lists_every_key_and_a_first_save_writes_it(tmp_path):
    for action in ACTIONS:  # [keys] can be discovered in the file itself
        assert f'# {action.name} = "{action.key}"' in DEFAULT_CONFIG_TEXT
    assert "# export_dir" in DEFAULT_CONFIG_TEXT and "# default_pairing" in DEFAULT_CONFIG_TEXT
    path = tmp_path / "fresh" / "config.toml"
    config = save_config({"default_pairing": "demo"}, path)
    text = path.read_text()
    assert config.default_pairing == "demo" and '# quit = "ctrl+q"' in text and "[sampling]" in text


def test_exports_go_to_export_dir_or_the_documents_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "documents_dir", lambda: tmp_path / "Documents")
    assert Config().export_path() == tmp_path / "Documents"
    p = write(tmp_path, 'export_dir = "~/chats"\n')
    monkeypatch.setenv("HOME", str(tmp_path))
    assert load_config(p).export_path() == tmp_path / "chats"


def test_tui_command_line_takes_the_usual_sampling_flags():
    from app.cli import build_parser
    from app.commands.tui import cli_settings

    args = build_parser().parse_args(["--temp", "0.7", "--system", "Be brief.", "--top-p", "0.9", "--block-size", "3"])
    s = cli_settings(args, GenerationSettings(max_tokens=99))
    assert (s.temperature, s.system_prompt, s.top_p, s.block_size, s.max_tokens) == (0.7, "Be brief.", 0.9, 3, 99)
    args = build_parser().parse_args(["--system-prompt", "Hi", "--max-tokens", "12", "--seed", "4", "--top-k", "5"])
    s = cli_settings(args, GenerationSettings())
    assert (s.system_prompt, s.max_tokens, s.seed, s.top_k) == ("Hi", 12, 4, 5)
    with pytest.raises(ValueError, match="temperature"):
        cli_settings(build_parser().parse_args(["--temp", "-1"]), GenerationSettings())
