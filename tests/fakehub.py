"""A tiny local stand-in for the Hugging Face Hub, enough for huggingface_hub 2.4's downloads.

It serves, on 127.0.0.1, the endpoints `snapshot_download` (normal and dry run) and `model_info` use:

  GET  /api/models/{org}/{name}/revision/{rev}     repo info (id, sha)
  GET  /api/models/{org}/{name}/tree/{rev}         recursive file listing
  HEAD /{org}/{name}/resolve/{rev}/{file}          metadata: X-Repo-Commit, ETag, Content-Length
  GET  /{org}/{name}/resolve/{rev}/{file}          bytes, with `Range: bytes=N-` support (206)

It never sends xet headers, so the client always takes the plain HTTP path. Failure modes a test
can switch on: gated (403 + X-Error-Code GatedRepo), bad credentials (401), a connection dropped
mid-file once, and a slow (throttled) body so a download can be cancelled while it runs. Every
request is recorded in `hub.requests` as (method, path, range header).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


@dataclass
class FakeRepo:
    files: dict[str, bytes]
    commit: str = ""
    gated: bool = False
    bad_auth: bool = False

    def __post_init__(self):
        if not self.commit:
            digest = hashlib.sha1(b"".join(self.files[k] for k in sorted(self.files)))
            self.commit = digest.hexdigest()


@dataclass
class FakeHub:
    repos: dict[str, FakeRepo] = field(default_factory=dict)
    chunk: int = 64 * 1024
    throttle_s: float = 0.0  # sleep between body chunks
    drop_once: dict[str, int] = field(default_factory=dict)  # filename -> bytes sent before the first GET is cut
    cdn_redirect: bool = False  # *.safetensors: 302 to another host, like the Hub's LFS/CDN files
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    with_auth: list[str] = field(default_factory=list)  # paths of requests that carried an Authorization header

    def __post_init__(self):
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeHub:
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- helpers for tests -------------------------------------------------------------------
    def file_gets(self, filename: str) -> list[str | None]:
        """Range headers of every GET of `filename` (None for a plain GET)."""
        return [rng for method, path, rng in self.requests if method == "GET" and path.endswith("/" + filename)]


def etag_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub
    protocol_version = "HTTP/1.0"

    def log_message(self, *args) -> None:  # keep test output quiet
        pass

    # -- routing -----------------------------------------------------------------------------
    def do_HEAD(self) -> None:
        self._route("HEAD")

    def do_GET(self) -> None:
        self._route("GET")

    def _route(self, method: str) -> None:
        path = unquote(urlsplit(self.path).path)
        self.hub.requests.append((method, path, self.headers.get("Range")))
        if self.headers.get("Authorization"):
            self.hub.with_auth.append(path)
        parts = path.strip("/").split("/")
        if parts[0] == "cdn" and len(parts) >= 5:  # /cdn/{org}/{name}/{sha256}/{file}
            repo = self.hub.repos.get("/".join(parts[1:3]))
            filename = "/".join(parts[4:])
            if repo is None or filename not in repo.files or etag_of(repo.files[filename]) != parts[3]:
                return self._error(404, None, "Not found")
            return self._file(method, repo, filename)
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
            repo_id = "/".join(parts[2:4])
            repo = self._repo_or_error(repo_id, parts[5])
            if repo is None:
                return
            if parts[4] == "revision":
                siblings = [{"rfilename": name} for name in sorted(repo.files)]
                return self._json({"id": repo_id, "sha": repo.commit, "siblings": siblings})
            tree = [
                {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                for name, data in sorted(repo.files.items())
            ]
            return self._json(tree)
        if len(parts) >= 5 and parts[2] == "resolve":
            repo_id = "/".join(parts[:2])
            repo = self._repo_or_error(repo_id, parts[3])
            if repo is None:
                return
            filename = "/".join(parts[4:])
            if filename not in repo.files:
                return self._error(404, "EntryNotFound", "Entry not found", commit=repo.commit)
            if self.hub.cdn_redirect and filename.endswith(".safetensors"):
                return self._redirect_to_cdn(repo_id, repo, filename)
            return self._file(method, repo, filename)
        self._error(404, None, "Not found")

    def _repo_or_error(self, repo_id: str, revision: str) -> FakeRepo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
            return None
        if repo.gated:
            self._error(403, "GatedRepo", "Access to model is restricted: you must accept the conditions")
            return None
        if repo.bad_auth:
            self._error(401, None, "Invalid credentials in Authorization header")
            return None
        if revision not in ("main", repo.commit):
            self._error(404, "RevisionNotFound", "Revision not found")
            return None
        return repo

    # -- responses ---------------------------------------------------------------------------
    def _json(self, payload) -> None:
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, code: str | None, message: str, commit: str | None = None) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        if commit:
            self.send_header("X-Repo-Commit", commit)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _redirect_to_cdn(self, repo_id: str, repo: FakeRepo, filename: str) -> None:
        """What the Hub does for LFS files: metadata on the 302 itself, bytes on another host."""
        data = repo.files[filename]
        port = self.server.server_address[1]
        self.send_response(302)
        self.send_header("X-Repo-Commit", repo.commit)
        self.send_header("X-Linked-Etag", f'"{etag_of(data)}"')
        self.send_header("X-Linked-Size", str(len(data)))
        self.send_header("ETag", '"git-pointer-oid"')
        self.send_header("Location", f"http://localhost:{port}/cdn/{repo_id}/{etag_of(data)}/{filename}")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _file(self, method: str, repo: FakeRepo, filename: str) -> None:
        data = repo.files[filename]
        start = 0
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            start = int(rng[len("bytes=") :].split("-")[0] or 0)
        status = 206 if start else 200
        if start > len(data):
            return self._error(416, None, "Range not satisfiable")
        self.send_response(status)
        self.send_header("X-Repo-Commit", repo.commit)
        self.send_header("ETag", f'"{etag_of(data)}"')
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(len(data) - start))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if method == "HEAD":
            return
        cut = self.hub.drop_once.pop(filename, None)
        body = data[start:]
        sent = 0
        try:
            while sent < len(body):
                if cut is not None and sent >= cut:
                    return  # close the connection mid-body (the handler ends; HTTP/1.0 closes)
                piece = body[sent : sent + self.hub.chunk]
                self.wfile.write(piece)
                self.wfile.flush()
                sent += len(piece)
                if self.hub.throttle_s:
                    time.sleep(self.hub.throttle_s)
        except (BrokenPipeError, ConnectionResetError):
            pass


def tiny_disk(path: str) -> int:
    """A free-space function for tests: a disk with 1 kB free (picklable, so it reaches a child)."""
    return 1000


def put_in_cache(cache_dir, repo_id: str, files: dict[str, bytes], commit: str = "a" * 40, complete: bool = True):
    """Lay out `repo_id` in an HF cache folder the way huggingface_hub does (blobs, snapshot links, refs).

    complete=False leaves the largest file as an unfinished `<etag>.incomplete` blob instead.
    Returns the snapshot directory.
    """
    from pathlib import Path

    root = Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))
    blobs, snap = root / "blobs", root / "snapshots" / commit
    blobs.mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    largest = max(files, key=lambda k: len(files[k]))
    for name, data in files.items():
        blob = blobs / etag_of(data)
        if not complete and name == largest:
            blob.with_name(blob.name + ".incomplete").write_bytes(data[: len(data) // 2])
            continue
        blob.write_bytes(data)
        link = snap / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return snap
