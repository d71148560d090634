"""Hostile input on the command line (issue 15): every fault is one clear line and a non-zero exit,
never a traceback, a hang or a silently wrong answer. In-process through `app.cli.main`, except
where the fault is a hang (a FIFO, /dev/zero): those run in a subprocess with a timeout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import main

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMA_CHAT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("GEMMA_CHAT_CONFIG", str(tmp_path / "config.toml"))
    monkeypatch.setenv("GEMMA_CHAT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


@pytest.fixture
def pairing(factory_checkpoints):
    return factory_checkpoints.pairing("e-style")


def copy_checkpoint(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines, "no message at all"
    assert "Traceback" not in err
    return lines[-1]


# --- 2. corrupt or truncated weights ------------------------------------------------------------------
@pytest.mark.parametrize("which", ["target", "drafter"])
def test_truncated_safetensors_is_one_error_line(dirs, pairing, capsys, which):
    target, drafter = pairing
    if which == "target":
        target = copy_checkpoint(target, dirs / "t")
        os.truncate(target / "model.safetensors", 1_000_000)
    else:
        drafter = copy_checkpoint(drafter, dirs / "d")
        os.truncate(drafter / "model.safetensors", 100_000)
    rc, out, err = run_cli(capsys, "generate", "--model", str(target), "--drafter", str(drafter), "--prompt", "hi")
    assert rc == 1
    line = one_error_line(err)
    assert "truncated or corrupt" in line and "download" in line


def test_truncated_safetensors_json_error(dirs, pairing, capsys):
    target = copy_checkpoint(pairing[0], dirs / "t")
    os.truncate(target / "model.safetensors", 1_000_000)
    rc, out, err = run_cli(capsys, "generate", "--json", "--model", str(target), "--prompt", "hi")
    assert rc == 1
    assert "truncated or corrupt" in json.loads(out.strip().splitlines()[-1])["error"]


def test_garbage_safetensors_in_bench(dirs, pairing, capsys):
    target = copy_checkpoint(pairing[0], dirs / "t")
    (target / "model.safetensors").write_bytes(os.urandom(5000))
    rc, out, err = run_cli(capsys, "bench", "--model", str(target), "--max-tokens", "4", "--repeats", "1")
    assert rc == 1
    assert "truncated or corrupt" in one_error_line(err)


# --- 3. the demo and an unusable cache dir ------------------------------------------------------------------
def test_demo_needs_no_cache_dir(dirs, monkeypatch, capsys):
    # the trained demo ships in the package: nothing is built, so a cache dir that is a file cannot stop it
    (dirs / "a-file").write_text("x")
    monkeypatch.setenv("GEMMA_CHAT_CACHE_DIR", str(dirs / "a-file"))
    rc, out, err = run_cli(capsys, "generate", "--demo", "--prompt", "hi", "--max-tokens", "2")
    assert rc == 0, err


# --- 5. sampling values ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, message",
    [
        (["--temp", "nan"], "temperature must be a finite number >= 0, got nan"),
        (["--temp", "inf"], "temperature must be a finite number >= 0, got inf"),
        (["--temp", "0.7", "--seed", "-1"], "seed must be an integer from 0 to 2**64-1"),
        (["--temp", "0.7", "--seed", str(2**64)], "seed must be an integer from 0 to 2**64-1"),
        (["--temp", "0.7", "--top-p", "nan"], "top_p must be a number > 0 and <= 1"),
    ],
)
def test_bad_sampling_values_are_refused_up_front(dirs, pairing, capsys, args, message):
    target, drafter = pairing
    rc, out, err = run_cli(
        capsys, "generate", "--model", str(target), "--drafter", str(drafter), "--prompt", "hi", *args
    )
    assert rc == 1
    assert message in one_error_line(err)


def test_config_refuses_a_seed_the_engine_cannot_use(tmp_path):
    from core.user.config import ConfigError, load_config

    path = tmp_path / "config.toml"
    for bad in ("-1", "inf", "nan"):
        key = "seed" if bad == "-1" else "temperature"
        path.write_text(f"[sampling]\n{key} = {bad}\n")
        with pytest.raises(ConfigError) as e:
            load_config(path)
        assert f"[sampling].{key} must be" in str(e.value)


def test_tui_fields_share_the_checks():
    from app.tui.screens.chat_params import FieldError, parse_field

    for name, text in (("temperature", "nan"), ("seed", "-1"), ("seed", str(2**64)), ("top_p", "inf")):
        with pytest.raises(FieldError):
            parse_field(name, text)
    assert parse_field("seed", str(2**64 - 1)) == 2**64 - 1


# --- 6. --messages ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "content, message",
    [
        ([{"role": "user", "content": 123}], "message 1: content must be a string or a list of items, got int"),
        ([{"role": "bot", "content": "hi"}], "message 1: role must be one of system, user, assistant, tool, got 'bot'"),
        ([{"role": "user"}], "message 1: has no content"),
        ([{"role": "user", "content": None}], "message 1: has no content"),
        ([{"role": "user", "content": "a"}, "x"], "message 2: expected an object"),
        ([{"role": "user", "content": [{"type": "video"}]}], "message 1, item 1: type must be text, image or audio"),
        ([{"role": "user", "content": [{"type": "image"}]}], "message 1, item 1: an image item needs"),
        ([{"role": "user", "content": [{"type": "text", "text": 5}]}], "message 1, item 1: a text item needs"),
        ({"role": "user", "content": "hi"}, "expected a list of messages, got dict"),
        ([], "the message list is empty"),
    ],
)
def test_messages_schema_names_the_bad_item(dirs, pairing, capsys, content, message):
    path = dirs / "m.json"
    path.write_text(json.dumps(content))
    rc, out, err = run_cli(capsys, "generate", "--model", str(pairing[0]), "--messages", str(path))
    assert rc == 1
    assert message in one_error_line(err)


def test_messages_deep_nesting(dirs, pairing, capsys):
    path = dirs / "m.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    rc, out, err = run_cli(capsys, "generate", "--model", str(pairing[0]), "--messages", str(path))
    assert rc == 1
    assert "nests brackets too deeply" in one_error_line(err)


def test_messages_that_is_a_folder_is_one_line(dirs, pairing, capsys):
    rc, out, err = run_cli(capsys, "generate", "--model", str(pairing[0]), "--messages", str(dirs))
    assert rc == 1
    assert "is not a regular file" in one_error_line(err)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_messages_from_a_stream_never_blocks(dirs, pairing, kind):
    if kind == "fifo":
        source = dirs / "fifo"
        os.mkfifo(source)
    else:
        source = Path("/dev/zero")
    env = {**os.environ, "GEMMA_CHAT_CACHE_DIR": str(dirs / "cache")}
    p = subprocess.run(
        [sys.executable, "-m", "app", "generate", "--model", str(pairing[0]), "--messages", str(source)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert p.returncode == 1
    assert "is not a regular file" in one_error_line(p.stderr)


# --- wrong or silent results ------------------------------------------------------------------------------------
def test_checkpoint_without_tokenizer_json(dirs, pairing, capsys):
    target = copy_checkpoint(pairing[0], dirs / "t")
    (target / "tokenizer.json").unlink()
    rc, out, err = run_cli(capsys, "generate", "--model", str(target), "--prompt", "hi", "--max-tokens", "3")
    assert rc == 1
    assert "has no tokenizer.json" in one_error_line(err)


def test_empty_config_json_is_not_reported_missing(dirs, pairing, capsys):
    target = copy_checkpoint(pairing[0], dirs / "t")
    (target / "config.json").write_text("{}")
    rc, out, err = run_cli(capsys, "generate", "--model", str(target), "--prompt", "hi")
    assert rc == 1
    line = one_error_line(err)
    assert "config.json is empty" in line and "has no config.json" not in line


def test_nan_weights_are_refused(dirs, pairing, capsys):
    import mlx.core as mx

    target = copy_checkpoint(pairing[0], dirs / "t")
    weights = mx.load(str(target / "model.safetensors"))
    name = next(k for k in weights if "language_model" in k and k.endswith("embed_tokens.weight"))
    weights[name] = weights[name] * float("nan")
    mx.save_safetensors(str(target / "model.safetensors"), weights)
    rc, out, err = run_cli(capsys, "generate", "--model", str(target), "--prompt", "hi", "--max-tokens", "3")
    assert rc == 1
    assert "holds NaN or infinite values" in one_error_line(err)


def test_bench_empty_block_sizes(dirs, pairing, capsys):
    rc, out, err = run_cli(capsys, "bench", "--model", str(pairing[0]), "--block-sizes", "")
    assert rc == 1
    assert "no block size given" in one_error_line(err)


def test_context_full_is_not_reported_as_max_tokens(dirs, pairing, capsys):
    target = copy_checkpoint(pairing[0], dirs / "t")
    config = json.loads((target / "config.json").read_text())
    config["text_config"]["max_position_embeddings"] = 24
    (target / "config.json").write_text(json.dumps(config))
    rc, out, err = run_cli(
        capsys, "generate", "--model", str(target), "--prompt", "hi", "--max-tokens", "200", "--ignore-eos", "--json"
    )
    assert rc == 0, err
    lines = [json.loads(ln) for ln in out.splitlines() if ln.strip()]
    assert lines[-1]["stats"]["stop_reason"] == "context_full"
    assert len(lines) - 1 < 200


# --- 4. a stalled or impostor hub ---------------------------------------------------------------------------
@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    cache = tmp_path / "hf" / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    for name in ("HF_ENDPOINT", "HF_HUB_OFFLINE", "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return cache


class LoopbackServer:
    """127.0.0.1 server that accepts connections and then: says nothing ("silent"), trickles a byte a
    second after the headers ("trickle"), or answers every request with a login page ("portal")."""

    PORTAL = b"<html><body>Please log in to the hotel wifi</body></html>"

    def __init__(self, mode: str):
        import socket
        import threading

        self.mode = mode
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns: list = []
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import threading

        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn) -> None:
        import socket
        import time

        try:
            if self.mode == "silent":
                return
            request = b""
            while b"\r\n\r\n" not in request:  # the whole head: unread bytes at close() reset the connection
                chunk = conn.recv(65536)
                if not chunk:
                    return
                request += chunk
            if self.mode == "portal":
                head = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n" % len(self.PORTAL)
                conn.sendall(head + b"Connection: close\r\n\r\n" + self.PORTAL)
                conn.shutdown(socket.SHUT_WR)  # a clean end of the answer, not a reset
                conn.settimeout(2)
                while conn.recv(65536):  # let the client close first
                    pass
                conn.close()
                return
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
            while not self.stop.is_set():
                conn.sendall(b" ")
                time.sleep(1)
        except OSError:
            pass

    def close(self) -> None:
        self.stop.set()
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.mark.parametrize("mode", ["silent", "trickle"])
def test_stalled_hub_times_out_with_a_clear_message(hf_cache, monkeypatch, capsys, mode):
    import time

    server = LoopbackServer(mode)
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("GEMMA_CHAT_HUB_TIMEOUT", "3")
    try:
        t0 = time.monotonic()
        rc, out, err = run_cli(capsys, "models", "download", "owner/name")
        elapsed = time.monotonic() - t0
    finally:
        server.close()
    assert rc == 1
    line = one_error_line(err)
    assert f"the server at {server.url} accepted the connection but sent nothing" in line
    assert elapsed < 40


def test_captive_portal_says_what_the_server_sent(hf_cache, monkeypatch, capsys):
    server = LoopbackServer("portal")
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    try:
        rc, out, err = run_cli(capsys, "models", "download", "owner/name")
    finally:
        server.close()
    assert rc == 1
    line = one_error_line(err)
    assert "did not answer like the Hugging Face Hub" in line and "Please log in to the hotel wifi" in line
    assert "JSONDecodeError" not in err


def test_models_rm_takes_a_repo_id_like_download(hf_cache, capsys):
    from fakehub import put_in_cache

    put_in_cache(hf_cache, "owner/name", {"config.json": b"{}", "model.safetensors": b"w" * 1000})
    assert any(hf_cache.glob("models--owner--name"))
    rc, out, err = run_cli(capsys, "models", "rm", "owner/name", "--yes")
    assert rc == 0, err
    assert "removed owner/name" in err
    assert not any(hf_cache.glob("models--owner--name"))
    rc, out, err = run_cli(capsys, "models", "rm", "owner/name", "--yes")
    assert rc == 0 and "nothing to remove" in err


# --- attachments are checked by their header before they are read ------------------------------------------
@pytest.mark.parametrize("size_mb", [200, 2048])
def test_a_huge_non_image_is_refused_unread(tmp_path, size_mb):
    import tracemalloc

    from core.model.image import ImageError, load_image

    path = tmp_path / "big.png"
    with open(path, "wb") as f:  # sparse: a PNG signature, then nothing
        f.write(b"\x89PNG\r\n\x1a\n")
        f.truncate(size_mb << 20)
    tracemalloc.start()
    try:
        with pytest.raises(ImageError) as e:
            load_image(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"read {peak / 2**20:.0f} MiB to refuse it"
    assert "big.png" in str(e.value)


# --- terminal escape sequences in printed paths and model text ------------------------------------------------
def test_paths_with_escape_sequences_are_printed_inert(dirs, capsys):
    rc, out, err = run_cli(capsys, "generate", "--model", str(dirs / "no\x1b]0;pwned\x07\x1b[31mred"), "--prompt", "hi")
    assert rc == 1
    assert "\x1b" not in err and "\x07" not in err
    assert "no\\x1b]0;pwned\\x07\\x1b[31mred" in one_error_line(err)


def test_model_text_cannot_drive_the_terminal(dirs, pairing, capsys, monkeypatch):
    from core.decode.detok import Detokenizer

    real_add = Detokenizer.add

    def hostile_add(self, tok):  # as if the model wrote an escape sequence
        return real_add(self, tok) + "\x1b[2J\x1b]52;c;AAAA\x07"

    monkeypatch.setattr(Detokenizer, "add", hostile_add)
    rc, out, err = run_cli(capsys, "generate", "--model", str(pairing[0]), "--prompt", "hi", "--max-tokens", "3")
    assert rc == 0, err
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b[2J" in out


def test_a_damaged_demo_is_one_error_line(dirs, monkeypatch, capsys, tmp_path):
    # a truncated or altered shipped demo file (on a copy: never touch the package's own) is named, not loaded
    import shutil

    from core.hub import demo

    copy = tmp_path / "demo"
    shutil.copytree(demo.DEMO_DIR, copy)
    monkeypatch.setattr(demo, "DEMO_DIR", copy)
    weights = copy / "target" / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    rc, out, err = run_cli(capsys, "generate", "--demo", "--prompt", "hi", "--max-tokens", "2")
    assert rc == 1
    line = one_error_line(err)
    assert "demo pairing is damaged" in line and "model.safetensors" in line
