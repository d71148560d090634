"""The small pieces behind issue 24's fixes, one at a time (the hostile cases themselves run as
processes in tests/e2e/test_*hostile*.py and tests/engine/test_hostile_engine.py)."""

from __future__ import annotations

import asyncio
import logging
import os

import pytest

from core.engine.remote import RemoteError, _event_lines, parse_server_url
from core.frontends.server import ApiError, ServerConfig, _OnceAMinute, host_name, refuse_unserved
from core.model.loader import CheckpointError, checkpoint_file, text_config_of, weight_index
from core.settings import GenerationSettings, check_temperature
from core.user.config import ConfigError, load_config


@pytest.mark.parametrize(
    "header, name",
    [
        ("127.0.0.1:8000", "127.0.0.1"),
        ("[::1]:8000", "::1"),
        ("LocalHost.", "localhost"),
        ("evil.example", "evil.example"),
    ],
)
def test_host_name_drops_the_port(header, name):
    assert host_name(header) == name


def test_loopback_and_configured_hosts_are_allowed():
    config = ServerConfig("m", allowed_hosts=("box.lan",))
    assert all(config.host_allowed(h) for h in ("127.0.0.1", "::1", "localhost", "box.lan"))
    assert not config.host_allowed("evil.example")
    assert ServerConfig("m", allowed_hosts=None).host_allowed("evil.example")  # a wildcard bind: the key decides


def test_accept_errors_are_one_line_a_minute():
    f = _OnceAMinute()

    def record(msg: str) -> logging.LogRecord:
        try:
            raise OSError(24, "Too many open files")
        except OSError:
            import sys

            return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, msg, (), sys.exc_info())

    first = record("socket.accept() out of system resource")
    assert f.filter(first) and first.exc_info is None and "file descriptors" in first.getMessage()
    assert not f.filter(record("socket.accept() out of system resource"))
    assert f.filter(record("something else"))


@pytest.mark.parametrize(
    "body",
    [
        {"function_call": "auto", "functions": [{"name": "f"}]},
        {"functions": [{"name": "f"}]},
        {"response_format": {"type": "json_schema"}},
    ],
)
def test_unserved_fields_are_refused(body):
    with pytest.raises(ApiError, match="not served"):
        refuse_unserved(body)


def test_fields_that_ask_for_nothing_pass():
    refuse_unserved({"logprobs": False, "tools": [], "tool_choice": "auto", "response_format": {"type": "text"}})


def test_server_url_credentials_are_kept_apart():
    url = parse_server_url("http://me:p%40ss@gpu-box:8000/v1")
    assert url.base == "http://gpu-box:8000" and url.shown == "http://gpu-box:8000/v1"
    assert url.credentials == ("me", "p@ss")
    for bad in ("http://h:99999", "http://h:abc", "http://::::", "http://:8000", "ftp://me:pw@h"):
        with pytest.raises(RemoteError) as e:
            parse_server_url(bad)
        assert "pw" not in str(e.value)


def test_event_lines_split_crlf_and_cap_a_line():
    class Resp:
        def __init__(self, chunks: list[bytes]) -> None:
            self.chunks = chunks

        async def aiter_bytes(self):
            for c in self.chunks:
                yield c

    async def lines(chunks: list[bytes]) -> list[str]:
        return [line async for line in _event_lines(Resp(chunks), "u")]

    assert asyncio.run(lines([b"data: a\r\n\r", b"\ndata: b", b"c\n"])) == ["data: a", "", "data: bc"]
    with pytest.raises(RemoteError, match="line of more than"):
        asyncio.run(lines([b"x" * (1 << 20)] * 5))


def test_checkpoint_file_only_regular_files_inside_the_folder(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert checkpoint_file(tmp_path, "config.json") == tmp_path / "config.json"
    assert checkpoint_file(tmp_path, "absent.json") is None
    for name in ("../x.safetensors", "/etc/passwd", "a/../../b"):
        with pytest.raises(CheckpointError, match="outside the checkpoint folder"):
            checkpoint_file(tmp_path, name)
    os.mkfifo(tmp_path / "fifo.json")
    with pytest.raises(CheckpointError, match="a FIFO, not a regular file"):
        checkpoint_file(tmp_path, "fifo.json")
    (tmp_path / "dangling.json").symlink_to(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match="broken link"):
        checkpoint_file(tmp_path, "dangling.json")


def test_weight_index_names_files_in_the_folder(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": {"a": "../out.safetensors"}}')
    with pytest.raises(CheckpointError, match="outside"):
        weight_index(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": {"a": "missing.safetensors"}}')
    with pytest.raises(CheckpointError, match="not in the folder"):
        weight_index(tmp_path)


@pytest.mark.parametrize(
    "text, words",
    [
        ({"num_attention_heads": 0}, "num_attention_heads must be an integer from 1"),
        ({"num_hidden_layers": 10**9}, "num_hidden_layers must be an integer from 1 to 1024"),
        ({"hidden_size": "big"}, "hidden_size must be"),
        ({"num_hidden_layers": 3, "layer_types": ["full_attention"]}, "1 entries for 3 layers"),
        ({"layer_types": ["global"]}, "layer_types must list"),
        ({"num_attention_heads": 6, "num_key_value_heads": 4}, "multiple of num_key_value_heads"),
        ({"num_hidden_layers": 4, "num_kv_shared_layers": 4}, "below num_hidden_layers"),
    ],
)
def test_text_config_numbers_are_checked(text, words):
    with pytest.raises(CheckpointError, match=words):
        text_config_of("config.json", {"text_config": text})


def test_text_config_null_and_flat_configs():
    with pytest.raises(CheckpointError, match="text_config must be an object"):
        text_config_of("config.json", {"text_config": None})
    assert text_config_of("config.json", {"hidden_size": 8})["hidden_size"] == 8  # a flat gemma4_text config
    assert text_config_of("d", {"text_config": {"num_hidden_layers": 4, "num_kv_shared_layers": 4}}, drafter=True)


def test_temperature_floor_is_one_rule():
    assert GenerationSettings(temperature=1e-39).temperature == 0.0
    assert GenerationSettings(temperature=1e-5).temperature == 1e-5
    assert check_temperature(1e-300) == 0.0 and check_temperature(0.7) == 0.7


def test_config_that_is_not_a_file_or_too_big(tmp_path):
    os.mkfifo(tmp_path / "fifo.toml")
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config(tmp_path / "fifo.toml")
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config(tmp_path)  # a folder
    (tmp_path / "big.toml").write_text("# " + "x" * (2 << 20))
    with pytest.raises(ConfigError, match="larger than 1 MiB"):
        load_config(tmp_path / "big.toml")


def test_read_only_config_is_not_saved(tmp_path):
    from core.user.config import save_config

    path = tmp_path / "config.toml"
    path.write_text('theme = "textual-light"\n')
    path.chmod(0o400)
    with pytest.raises(ConfigError, match="read-only"):
        save_config({"default_pairing": "demo"}, path)
    assert path.read_text() == 'theme = "textual-light"\n'
