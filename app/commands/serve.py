"""`gemma-chat serve`: load a pairing and serve it over the OpenAI-compatible API (core.frontends.server).

Binding to anything but loopback needs an API key ($GEMMA_CHAT_API_KEY, --api-key-file or --api-key): the
server runs a model on the user's machine, and with file: image URLs it would read the user's files.
Those file: URLs are refused on a non-loopback bind in any case. The limits against slow or hostile
clients (header and body timeouts, connections, body size) and against web pages (Host, Origin,
Content-Type) are core.frontends.server's; the options here only set them.

The address is taken before the model loads (`listen`): a port in use is said at once, not after the
seconds or minutes a real model takes to load. `--port 0` takes a free port; the "serving … at URL" line
(stderr) says which.
"""

from __future__ import annotations

import argparse
import errno
import re
import socket
import sys
from typing import TYPE_CHECKING

from app.commands.common import API_KEY_ENV, UsageError, api_key, pairing_from_args

if TYPE_CHECKING:
    from core.engine.contract import PairingSpec

MAX_PARALLEL = 64


def check_bind(host: str, api_key: str | None) -> str | None:
    """Why the server must not start on `host`, or None."""
    from core.frontends.server import is_loopback

    if not is_loopback(host) and not api_key:
        return (
            f"refusing to serve on {host} without an API key: anyone who can reach this machine could use it. "
            f"Set ${API_KEY_ENV} (or pass --api-key-file PATH), or bind to 127.0.0.1"
        )
    return None


def listen(host: str, port: int) -> socket.socket | str:
    """A socket bound to (host, port) for the server, or why it cannot be had, in words."""
    where = f"{host}:{port}"
    # the family from the address's form, as uvicorn binds: "localhost" is IPv4 even where it resolves
    # to ::1 first (macOS), so clients that ask 127.0.0.1 find the server
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        infos = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        return f"cannot listen on {where}: no such address ({e.strerror})"
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart need not wait out TIME_WAIT
        sock.bind(address)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            return f"cannot listen on {where}: the port is in use (another server?); stop it or pick another --port"
        if e.errno == errno.EACCES:
            return f"cannot listen on {where}: permission denied (ports below 1024 need privileges)"
        if e.errno == errno.EADDRNOTAVAIL:
            return f"cannot listen on {where}: no such address on this machine"
        return f"cannot listen on {where}: {e.strerror or e}"
    sock.set_inheritable(True)
    return sock


def allowed_hosts(host: str) -> tuple[str, ...] | None:
    """The Host names the server answers besides the loopback ones: the address it is bound to; None
    (any Host) on a wildcard bind, which is reached by whatever names the machine has (and needs a key)."""
    from core.frontends.server import host_name

    name = host_name(host)
    if name in ("", "0.0.0.0", "::"):
        return None
    return (name,)


def _limits_problem(args: argparse.Namespace) -> str | None:
    import resource

    if not 0 <= args.port < 65536:
        return f"--port must be 0..65535 (0: a free one), got {args.port}"
    if args.max_waiting < 0 or args.max_tokens < 1:
        return "--max-waiting must be >= 0 and --max-tokens >= 1"
    if not 1 <= args.parallel <= MAX_PARALLEL:
        return f"--parallel must be 1..{MAX_PARALLEL}, got {args.parallel}"
    if not (args.header_timeout > 0 and args.body_timeout > 0 and args.max_body_mb > 0):
        return "--header-timeout, --body-timeout and --max-body-mb must be > 0"
    # each connection is a file descriptor: the cap must leave room for the model's files and the engine
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    most = min(soft, 2048) - 64  # mlx-lm's import lowers the limit to 2048 after this check
    if not 1 <= args.max_connections <= most:
        return f"--max-connections must be 1..{most} (this process may open {min(soft, 2048)} files)"
    return None


def run(args: argparse.Namespace) -> int:
    try:
        key = api_key(args)
    except UsageError as e:
        print(f"gemma-chat serve: {e}", file=sys.stderr)
        return 2
    reason = check_bind(args.host, key) or _limits_problem(args)
    if reason:
        print(f"gemma-chat serve: {reason}", file=sys.stderr)
        return 2
    try:
        spec = pairing_from_args(args)
    except UsageError as e:
        print(f"gemma-chat serve: {e}", file=sys.stderr)
        return 2
    sock = listen(args.host, args.port)
    if isinstance(sock, str):
        print(f"gemma-chat serve: {sock}", file=sys.stderr)
        return 1
    args.port = sock.getsockname()[1]  # --port 0: the one the system chose, for the address said below
    try:
        return _serve(args, key, spec, sock)
    finally:
        sock.close()


def _serve(args: argparse.Namespace, key: str | None, spec: PairingSpec, sock: socket.socket) -> int:
    """Load the pairing and serve it on `sock` until Ctrl+C (or SIGTERM)."""
    import uvicorn

    from core.engine.contract import EngineError
    from core.engine.local import Engine
    from core.frontends.server import ServerConfig, create_app, is_loopback, uvicorn_config

    # a long-lived server: kernels built alongside the first requests
    engine = Engine(kernels="background", parallel=args.parallel)
    try:
        print(f"loading {spec.name} ...", file=sys.stderr, flush=True)
        try:
            engine.load(spec, None).result()
        except EngineError as e:
            print(f"gemma-chat serve: {e}", file=sys.stderr)
            return 1
        model_id = args.model_id or _model_id(spec.name)
        config = ServerConfig(
            model_id=model_id,
            api_key=key,
            max_waiting=args.max_waiting,
            allow_file_urls=is_loopback(args.host),
            max_tokens=args.max_tokens,
            allowed_hosts=allowed_hosts(args.host),
            max_body_bytes=int(args.max_body_mb * (1 << 20)),
            body_timeout_s=args.body_timeout,
            header_timeout_s=args.header_timeout,
            max_connections=args.max_connections,
        )
        app = create_app(engine, config)
        host = f"[{args.host}]" if ":" in args.host else args.host
        print(
            f"serving {model_id} at http://{host}:{args.port}/v1 "
            f"({'drafter on' if spec.drafter else 'no drafter'}; {'API key required' if key else 'no API key'}; "
            f"{args.parallel} at once, {args.max_waiting} waiting); "
            "Ctrl+C stops",
            file=sys.stderr,
            flush=True,
        )
        # Ctrl+C: replies still streaming get a second to finish, then are cancelled (engine included)
        server = uvicorn.Server(
            uvicorn_config(app, config, host=args.host, port=args.port, timeout_graceful_shutdown=1)
        )
        try:
            server.run(sockets=[sock])
        except OSError as e:
            print(f"gemma-chat serve: cannot listen on {args.host}:{args.port}: {e.strerror or e}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            pass
        if not server.started:
            print(f"gemma-chat serve: cannot listen on {args.host}:{args.port} (see above)", file=sys.stderr)
            return 1
        return 0
    finally:
        engine.close()


def _model_id(name: str) -> str:
    """A model name clients can type: 'demo (tiny trained model)' -> 'demo-tiny-trained-model'."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-").lower() or "gemma-chat"
