"""Downloads against a local fake hub (tests/fakehub.py): never the network."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

import pytest
from fakehub import FakeHub, FakeRepo, etag_of, tiny_disk

from core.hub import download as dl

BIG = 4 * 1024 * 1024


def _repo(big: int = BIG, **kw) -> FakeRepo:
    return FakeRepo(
        {
            "config.json": b'{"model_type": "gemma4"}',
            "model.safetensors": os.urandom(big),
            "tokenizer.json": b'{"version": "1.0"}',
            "README.md": b"# not needed by the engine",
        },
        **kw,
    )


@pytest.fixture(autouse=True)
def _isolated_hf(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # read by the child at import
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


def _run(hub: FakeHub, cache: Path, repo="org/model", **kw):
    handle = dl.start_download([repo], cache_dir=cache, endpoint=hub.url, **kw)
    events = list(handle.events(timeout=60))
    return handle, events


def test_full_download_reports_plan_progress_and_lands_in_the_hf_cache(tmp_path):
    repo = _repo()
    with FakeHub(repos={"org/model": repo}) as hub:
        handle, events = _run(hub, tmp_path)
    assert isinstance(events[0], dl.DownloadPlanned)
    plan = events[0]
    names = [f.filename for f in plan.repos[0].files]
    assert names == ["config.json", "model.safetensors", "tokenizer.json"]  # README.md filtered out
    assert plan.to_download_bytes == sum(len(repo.files[n]) for n in names)
    progress = [e for e in events if isinstance(e, dl.DownloadProgress)]
    assert progress, "no progress events"
    assert all(a.done_bytes <= b.done_bytes for a, b in zip(progress, progress[1:]))
    assert progress[-1].done_bytes == progress[-1].total_bytes == plan.to_download_bytes
    assert progress[-1].files_done == progress[-1].files_total == 3
    assert isinstance(events[-1], dl.DownloadFinished) and events[-1] is handle.result
    snap = Path(events[-1].paths["org/model"])
    assert snap.is_relative_to(tmp_path / "models--org--model" / "snapshots")
    assert (snap / "model.safetensors").read_bytes() == repo.files["model.safetensors"]
    assert not (snap / "README.md").exists()
    assert not list((tmp_path / "models--org--model" / "blobs").glob("*.incomplete"))
    # Nothing is copied outside the cache: the snapshot entries point at blobs.
    assert (snap / "model.safetensors").resolve().parent.name == "blobs"


def test_already_cached_touches_no_network(tmp_path):
    with FakeHub(repos={"org/model": _repo(1000)}) as hub:
        _run(hub, tmp_path)
        before = len(hub.requests)
        handle, events = _run(hub, tmp_path)
        assert len(hub.requests) == before
    assert len(events) == 1 and isinstance(events[0], dl.DownloadFinished) and events[0].from_cache


def test_offline_without_a_cached_copy_refuses_without_network(tmp_path):
    with FakeHub(repos={"org/model": _repo(1000)}) as hub:
        _, events = _run(hub, tmp_path, offline=True)
        assert hub.requests == []
    assert isinstance(events[-1], dl.DownloadFailed) and events[-1].kind == "offline"
    assert "org/model" in events[-1].message


def test_offline_with_a_cached_copy_works_and_local_snapshot_finds_it(tmp_path):
    with FakeHub(repos={"org/model": _repo(1000)}) as hub:
        _run(hub, tmp_path)
        n = len(hub.requests)
        _, events = _run(hub, tmp_path, offline=True)
        assert len(hub.requests) == n
    assert isinstance(events[-1], dl.DownloadFinished) and events[-1].from_cache
    assert dl.local_snapshot("org/model", cache_dir=tmp_path) == Path(events[-1].paths["org/model"])
    assert dl.local_snapshot("org/other", cache_dir=tmp_path) is None


def test_cancel_mid_file_then_resume_from_the_partial_bytes(tmp_path):
    repo = _repo()
    hub = FakeHub(repos={"org/model": repo}, throttle_s=0.03)  # ~2 MB/s: slow enough to cancel mid-file
    with hub:
        handle = dl.start_download(["org/model"], cache_dir=tmp_path, endpoint=hub.url)
        events = []
        for ev in handle.events(timeout=60):
            events.append(ev)
            if (
                isinstance(ev, dl.DownloadProgress)
                and ev.filename == "model.safetensors"
                and ev.file_done >= 2 * dl.CHUNK_BYTES
            ):
                # (progress counts a chunk just before writing it: the first one is on disk by now)
                handle.cancel()
        assert isinstance(handle.result, dl.DownloadCancelled) and events[-1] is handle.result
        moving = [e for e in events if isinstance(e, dl.DownloadProgress) and e.rate_bps > 0]
        assert moving and all(e.eta_s is not None and e.eta_s >= 0 for e in moving)
        assert not handle.running
        partials = list((tmp_path / "models--org--model" / "blobs").glob("*.incomplete"))
        assert len(partials) == 1
        kept = partials[0].stat().st_size
        assert dl.CHUNK_BYTES <= kept < BIG
        assert partials[0].read_bytes() == repo.files["model.safetensors"][:kept]

        hub.throttle_s = 0.0
        _, events = _run(hub, tmp_path)
        assert isinstance(events[-1], dl.DownloadFinished)
        assert events[0].repos[0].partial_bytes == kept
        assert events[0].needed_bytes == events[0].to_download_bytes - kept
        # The second run asked only for the missing tail.
        assert hub.file_gets("model.safetensors")[-1] == f"bytes={kept}-"
    snap = Path(events[-1].paths["org/model"])
    assert (snap / "model.safetensors").read_bytes() == repo.files["model.safetensors"]


def test_connection_dropped_mid_file_resumes_in_place(tmp_path):
    repo = _repo()
    with FakeHub(repos={"org/model": repo}, drop_once={"model.safetensors": BIG // 2}) as hub:
        _, events = _run(hub, tmp_path)
        ranges = hub.file_gets("model.safetensors")
    assert isinstance(events[-1], dl.DownloadFinished)
    assert ranges[0] is None and ranges[1] is not None and ranges[1].startswith("bytes=")
    snap = Path(events[-1].paths["org/model"])
    assert (snap / "model.safetensors").read_bytes() == repo.files["model.safetensors"]


def test_not_enough_disk_is_refused_with_numbers_before_any_byte(tmp_path):
    with FakeHub(repos={"org/model": _repo()}) as hub:
        _, events = _run(hub, tmp_path, free_bytes_fn=tiny_disk)
        assert hub.file_gets("model.safetensors") == []
    final = events[-1]
    assert isinstance(final, dl.DownloadFailed) and final.kind == "disk_space"
    assert "1.0 KB is free" in final.message and "4.2 MB" in final.message


def test_check_disk_space_counts_partial_bytes_and_margin():
    plan = dl.RepoPlan(
        "o/m",
        "c" * 40,
        (dl.FilePlan("a.safetensors", 10 * 10**9, False), dl.FilePlan("b.json", 5, True)),
        partial_bytes=4 * 10**9,
    )
    needed, free = dl.check_disk_space([plan], "/x", lambda p: 7 * 10**9)
    assert needed == 6 * 10**9 and free == 7 * 10**9
    with pytest.raises(dl.DownloadError) as err:
        dl.check_disk_space([plan], "/x", lambda p: 6 * 10**9)
    assert err.value.kind == "disk_space" and "6.0 GB" in err.value.message


@pytest.mark.parametrize(
    "repos, kind, words",
    [
        ({}, "not_found", "was not found"),
        ({"org/model": _repo(100, gated=True)}, "gated", "is gated"),
        ({"org/model": _repo(100, bad_auth=True)}, "auth", "token"),
    ],
    ids=["missing-repo", "gated", "bad-token"],
)
def test_hub_errors_become_one_clear_message(tmp_path, repos, kind, words):
    with FakeHub(repos=repos) as hub:
        _, events = _run(hub, tmp_path)
    final = events[-1]
    assert isinstance(final, dl.DownloadFailed), final
    assert final.kind == kind and words in final.message and "org/model" in final.message


def test_no_network_is_reported_as_such(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    handle = dl.start_download(["org/model"], cache_dir=tmp_path, endpoint=f"http://127.0.0.1:{port}")
    final = handle.wait(timeout=60)
    assert isinstance(final, dl.DownloadFailed) and final.kind == "network"
    assert "cannot reach" in final.message


def test_disk_full_while_writing_is_classified():
    err = dl.classify_error(OSError(errno.ENOSPC, "No space left on device"), "org/model")
    assert err.kind == "disk_full" and "org/model" in err.message


def test_blocking_download_returns_paths_and_raises_typed_errors(tmp_path):
    seen = []
    with FakeHub(repos={"org/model": _repo(1000)}) as hub:
        paths = dl.download(["org/model"], on_event=seen.append, cache_dir=tmp_path, endpoint=hub.url)
        assert Path(paths["org/model"]).is_dir() and isinstance(seen[-1], dl.DownloadFinished)
        with pytest.raises(dl.DownloadError) as err:
            dl.download(["org/absent"], cache_dir=tmp_path, endpoint=hub.url)
    assert err.value.kind == "not_found"


def test_lfs_files_redirected_to_a_cdn_use_the_linked_etag_and_never_leak_the_token(tmp_path):
    repo = _repo(BIG // 4)
    with FakeHub(repos={"org/model": repo}, cdn_redirect=True) as hub:
        _, events = _run(hub, tmp_path, token="hf_test_token")
        cdn = [(m, p, r) for m, p, r in hub.requests if p.startswith("/cdn/")]
        assert cdn and all(p not in hub.with_auth for _, p, _ in cdn)
        assert any(p.startswith("/api/") for p in hub.with_auth)  # the Hub itself did get the token
    assert isinstance(events[-1], dl.DownloadFinished)
    blob = tmp_path / "models--org--model" / "blobs" / etag_of(repo.files["model.safetensors"])
    assert blob.read_bytes() == repo.files["model.safetensors"]
    snap = Path(events[-1].paths["org/model"])
    assert (snap / "model.safetensors").resolve() == blob.resolve()


def test_hf_hub_offline_env_in_the_child_is_reported_as_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # read by huggingface_hub at import, i.e. in the child
    with FakeHub(repos={"org/model": _repo(1000)}) as hub:
        _, events = _run(hub, tmp_path)
        assert hub.requests == []
    assert isinstance(events[-1], dl.DownloadFailed) and events[-1].kind == "offline"
    assert "HF_HUB_OFFLINE" in events[-1].message


def test_the_branch_ref_is_recorded_by_the_download_itself(tmp_path):
    """huggingface_hub 2.5 writes no refs/main in the plan's dry run (2.4 did), and the finalize step
    downloads by commit, which writes none: without our own ref a finished download was not found offline."""
    storage = tmp_path / "models--org--model"
    dl._record_ref(storage, "main", "a" * 40)
    assert (storage / "refs" / "main").read_text() == "a" * 40
    dl._record_ref(storage, "main", "b" * 40)  # the branch moved on
    assert (storage / "refs" / "main").read_text() == "b" * 40
    dl._record_ref(storage, "c" * 40, "c" * 40)  # asked by commit: no ref
    assert sorted(p.name for p in (storage / "refs").iterdir()) == ["main"]


def test_a_finished_download_is_found_offline_by_branch(tmp_path):
    with FakeHub(repos={"org/model": _repo(1000)}) as hub:
        _, events = _run(hub, tmp_path)
    snapshot = Path(events[-1].paths["org/model"])
    assert (tmp_path / "models--org--model" / "refs" / "main").read_text() == snapshot.name
    assert dl.local_snapshot("org/model", cache_dir=tmp_path) == snapshot
