"""Kernel preparation (core.engine.kernels, issue 23 §1): on a machine without the pairing's compiled kernels
the engine answers at once, uncompiled, while a child process builds them; progress comes as events; once
the child is done compilation is switched on before the next request and the compiled functions are
traced between requests; the marker makes the next load compiled from the start; closing the engine ends
the child. The child here is a stub (the real one, core.engine.warmup, builds ~50 kernels: minutes, run
by the tmux test); the warm-up steps themselves run for real."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import mlx.core as mx
import pytest

from core.engine import kernels as kernels_mod
from core.engine.local import Engine
from core.engine.pairings import demo_spec
from core.events import KernelProgress, TokenEvent, TurnDone
from core.settings import GenerationSettings
from core.user import kernel_cache

# prints progress, waits until RELEASE exists, writes the marker, says done; or ends on stdin EOF
STUB = """
import json, os, sys, threading, time
from pathlib import Path
threading.Thread(target=lambda: (sys.stdin.read(), os._exit(3)), daemon=True).start()
print(json.dumps({"fraction": 0.25}), flush=True)
release = Path(sys.argv[1])
while not release.exists():
    time.sleep(0.02)
from core.user import kernel_cache
cache = kernel_cache.KernelCache(Path(sys.argv[2]))
kernel_cache.write_marker(cache, sys.argv[3])
print(json.dumps({"fraction": 1.0}), flush=True)
print(json.dumps({"done": True}), flush=True)
"""


@pytest.fixture
def cold(tmp_path, monkeypatch):
    """A fresh private kernel folder, a stub child, and the compile switches and traces recorded."""
    folder = tmp_path / "kernels"
    folder.mkdir(mode=0o700)
    monkeypatch.setattr(kernel_cache, "_active", kernel_cache.KernelCache(folder))
    monkeypatch.delenv("MLX_DISABLE_COMPILE", raising=False)
    release = tmp_path / "release"
    calls: list[str] = []
    monkeypatch.setattr(
        kernels_mod.KernelPreparer,
        "command",
        lambda self: [sys.executable, "-c", STUB, str(release), str(folder), self.signature],
    )
    # switching off is real (the replies stay quick); switching on is only recorded: the stub built nothing
    real_enable, real_disable = mx.enable_compile, mx.disable_compile
    monkeypatch.setattr(mx, "enable_compile", lambda: calls.append("enable"))
    monkeypatch.setattr(mx, "disable_compile", lambda: (calls.append("disable"), real_disable()))
    traced: list[str] = []

    def trace_next(self, plan, preempted=bool):
        if self._traces is None:
            self._traces = plan()
        if self._traces:
            traced.append(self._traces.pop(0)[0])

    monkeypatch.setattr(kernels_mod.KernelPreparer, "trace_next", trace_next)
    yield folder, release, calls, traced
    real_enable()


def until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def hello(eng: Engine) -> TurnDone:
    return eng.chat([{"role": "user", "content": "Hello"}], GenerationSettings(max_tokens=8), lambda e: None).result(60)


def test_a_cold_pairing_answers_uncompiled_then_switches_to_compiled_kernels(cold):
    folder, release, calls, traced = cold
    events: list[object] = []
    eng = Engine(kernels="background")
    try:
        eng.load(demo_spec(), events.append).result(60)
        progress = [e for e in events if isinstance(e, KernelProgress)]
        assert progress and progress[0].fraction == 0.0 and not progress[0].done
        assert calls == ["disable"]  # the reply below runs uncompiled
        assert hello(eng).stats.stop_reason in ("eos", "max_tokens")
        assert calls == ["disable"] and traced == []
        until(lambda: any(isinstance(e, KernelProgress) and e.fraction == 0.25 for e in events))
        release.touch()
        until(lambda: any(isinstance(e, KernelProgress) and e.done for e in events))
        done = [e for e in events if isinstance(e, KernelProgress) and e.done]
        assert done[-1].error is None
        # between requests: compilation switched on, then every warm-up step traced in this process
        until(lambda: bool(traced) and not eng._kernels.busy)
        assert calls == ["disable", "enable"]
        assert traced[:2] == ["first token", "plain decoding"] and "second turn" in traced
        assert hello(eng).stats.stop_reason in ("eos", "max_tokens")
        # the marker: the next load of the pairing is compiled from the start, no child
        assert list((folder / "prepared").glob("*.json"))
        events.clear()
        eng.load(demo_spec(), events.append).result(60)
        assert not [e for e in events if isinstance(e, KernelProgress)]
        assert calls[-1] == "enable" and eng._kernels.state == "ready"
    finally:
        eng.close()


def test_uncompiled_and_compiled_rounds_keep_their_block_costs_apart(cold, tmp_path, monkeypatch):
    """Uncompiled, every op is dispatched on its own, so a round's cost against a plain step differs from a
    compiled one's (on the demo a plain step takes 1.7x as long, a round of 8 costs 2.0 plain steps against
    2.3 compiled).
    Kept in one file, each way's costs would mislead the other's sessions: auto block size keeps them apart
    and switches when the kernels get ready, carrying over what it learnt of acceptance."""
    _folder, release, calls, _ = cold
    monkeypatch.setenv("GEMMA_CHAT_CACHE_DIR", str(tmp_path / "cache"))
    kept = tmp_path / "cache" / "autoblock"
    events: list[object] = []
    settings = GenerationSettings(max_tokens=48)
    question = [{"role": "user", "content": "Why is drafting faster?"}]
    eng = Engine(kernels="background")
    try:
        eng.load(demo_spec(), events.append).result(60)
        assert eng.chat(question, settings, lambda e: None).result(60).stats.accepted > 0
        (uncompiled,) = list(kept.glob("*.json"))
        before = uncompiled.read_text()
        assert '"ratios"' in before and '"acceptance"' in before
        release.touch()
        until(lambda: any(isinstance(e, KernelProgress) and e.done for e in events))
        assert eng.chat(question, settings, lambda e: None).result(60).stats.accepted > 0
        assert calls[-1] == "enable"
        files = sorted(kept.glob("*.json"))
        assert len(files) == 2 and uncompiled.read_text() == before  # the compiled rounds went elsewhere
        (compiled,) = [f for f in files if f != uncompiled]
        assert '"acceptance"' in compiled.read_text()
    finally:
        eng.close()


def test_the_target_alone_runs_on_the_kernels_its_pairing_built(cold):
    """`--no-draft` (the demo without its drafter) runs a subset of what its pairing's warm-up built: once
    the pairing is prepared, it runs compiled too, not uncompiled as on a machine without kernels."""
    _folder, release, _calls, _ = cold
    release.touch()
    events: list[object] = []
    eng = Engine(kernels="background")
    try:
        eng.load(demo_spec(), events.append).result(60)
        until(lambda: any(isinstance(e, KernelProgress) and e.done for e in events))
    finally:
        eng.close()
    one_shot = Engine(kernels="eager-if-cold")
    try:
        # the stub child wrote the pairing's marker only, as a pairing prepared before this rule was
        one_shot.load(demo_spec(drafter=False), None).result(60)
        assert one_shot._kernels.state == "eager"
        one_shot.load(demo_spec(), None).result(60)  # prepared: it marks the target alone too
        assert one_shot._kernels.state == "ready"
        one_shot.load(demo_spec(drafter=False), None).result(60)
        assert one_shot._kernels.state == "ready"
    finally:
        one_shot.close()


def test_the_child_marks_the_pairing_and_the_target_alone(tmp_path, monkeypatch, capsys):
    from core.engine import warmup

    folder = tmp_path / "kernels"
    folder.mkdir(mode=0o700)
    cache = kernel_cache.KernelCache(folder)
    monkeypatch.setattr(warmup, "use_private_kernel_cache", lambda: cache)
    monkeypatch.setattr(warmup, "_die_with_parent", lambda: None)
    monkeypatch.setattr(warmup, "_exit_on_eof", lambda: None)
    built = folder / "mlx" / "k.so"
    monkeypatch.setattr(warmup, "_prepare", lambda fields: (built.parent.mkdir(), built.write_bytes(b"")))
    assert warmup.main(["{}", "pairing-sig", "target-sig"]) == 0
    assert kernel_cache.is_prepared(cache, "pairing-sig") and kernel_cache.is_prepared(cache, "target-sig")
    assert '"done": true' in capsys.readouterr().out
    spec = demo_spec()
    preparer = kernels_mod.preparer("background", spec, Path(spec.target), Path(spec.drafter or ""), None)
    alone = kernels_mod.signature(spec, Path(spec.target), None)
    assert preparer.command()[-2:] == [preparer.signature, alone] and preparer.also == (alone,)


def test_closing_the_engine_ends_the_child_and_eager_if_cold_starts_none(cold):
    _folder, _release, calls, _ = cold
    eng = Engine(kernels="background")
    eng.load(demo_spec(), None).result(60)
    child = eng._kernels._child
    assert child is not None and child.poll() is None
    eng.close()
    assert child.wait(5) is not None
    assert not eng.kernels_missing  # they were being built
    one_shot = Engine(kernels="eager-if-cold")
    try:
        one_shot.load(demo_spec(), None).result(60)
        assert one_shot._kernels._child is None and one_shot._kernels.state == "eager" and calls[-1] == "disable"
        assert one_shot.kernels_missing  # what `generate` reads to say how to build them
    finally:
        one_shot.close()


def test_build_first_loads_once_the_kernels_are_built_and_runs_compiled(cold):
    """`generate --build-kernels`: the load waits for the child (its progress comes meanwhile), then the
    reply runs compiled; the marker makes the next one-shot load compiled from the start."""
    folder, release, calls, _ = cold
    events: list[object] = []
    eng = Engine(kernels="build-first")
    try:
        loading = eng.load(demo_spec(), events.append)
        until(lambda: any(isinstance(e, KernelProgress) and e.fraction == 0.25 for e in events))
        time.sleep(0.3)
        assert not loading.done()  # still waiting for the child
        release.touch()
        loading.result(60)
        done = [e for e in events if isinstance(e, KernelProgress) and e.done]
        assert len(done) == 1 and done[0].error is None
        assert "disable" not in calls and calls[-1] == "enable" and not eng.kernels_missing
        assert hello(eng).stats.stop_reason in ("eos", "max_tokens")
    finally:
        eng.close()
    assert list((folder / "prepared").glob("*.json"))
    later = Engine(kernels="eager-if-cold")
    try:
        later.load(demo_spec(), None).result(60)
        assert later._kernels.state == "ready" and not later.kernels_missing and calls[-1] == "enable"
    finally:
        later.close()


def test_closing_the_engine_while_build_first_waits_ends_the_child_at_once(cold):
    _folder, _release, calls, _ = cold
    events: list[object] = []
    eng = Engine(kernels="build-first")
    loading = eng.load(demo_spec(), events.append)
    until(lambda: any(isinstance(e, KernelProgress) and e.fraction == 0.25 for e in events))
    assert not loading.done()  # the load waits for the child
    child = eng._kernels._child
    t0 = time.monotonic()
    eng.close()
    assert time.monotonic() - t0 < 5 and child.poll() is not None
    assert loading.done()
    done = [e for e in events if isinstance(e, KernelProgress) and e.done]
    assert done and done[-1].error  # not built: that session stays uncompiled
    assert calls[-1] == "disable"


def test_generate_says_a_reply_ran_uncompiled_and_build_kernels_builds_them(cold, capsys):
    """One-shot `generate` on a machine without the pairing's kernels answers uncompiled and says how to
    build them; `--build-kernels` builds them first (its progress on stderr), after which nothing is said."""
    from app.cli import main

    _folder, release, calls, _ = cold
    args = ["generate", "--demo", "--prompt", "Hello", "--max-tokens", "4"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "this reply ran uncompiled" in err and "--build-kernels" in err
    assert calls[-1] == "disable"
    release.touch()  # the stub child finishes at once
    assert main([*args, "--build-kernels"]) == 0
    err = capsys.readouterr().err
    assert "building the compiled kernels for demo" in err and "built the compiled kernels for demo" in err
    assert "ran uncompiled" not in err and calls[-1] == "enable"
    assert main(args) == 0  # built: compiled from the start, nothing to say
    err = capsys.readouterr().err
    assert "uncompiled" not in err and "building" not in err and calls[-1] == "enable"
    assert main(["generate", "--connect", "http://127.0.0.1:9", "--prompt", "Hi", "--build-kernels"]) == 1
    assert "--build-kernels is local only" in capsys.readouterr().err


def test_the_child_ends_itself_when_its_engine_is_gone(cold):
    """The child watches its stdin: when the process that started it dies, the pipe closes."""
    _folder, _release, _calls, _ = cold
    eng = Engine(kernels="background")
    eng.load(demo_spec(), None).result(60)
    child = eng._kernels._child
    assert child is not None and child.stdin is not None
    child.stdin.close()  # what the engine's process dying does to it
    assert child.wait(5) == 3
    eng.close()


def test_the_warm_up_steps_run_on_a_scratch_cache():
    """The real steps (as the child runs them, here uncompiled: quick): each runs, the steps are counted from
    0 of n to n of n, an image turn is among them (the demo takes images), and the conversation's cache, its
    images and its auto block size are not touched."""
    eng = Engine()
    try:
        eng.load(demo_spec(), None).result(60)
        st = eng._state
        offset, learned = st.cache.offset, st.decoder.auto.rounds
        names = [name for name, _ in eng._warmup_steps(st)]
        assert names[-1] == "image" and "second turn" in names
        counted: list[tuple[int, int]] = []
        mx.disable_compile()
        try:
            eng.warm_up(lambda done, steps: counted.append((done, steps))).result(300)
        finally:
            mx.enable_compile()
        n = len(names)
        assert n >= 20 and counted == [(i, n) for i in range(n + 1)]
        assert st.cache.offset == offset and st.decoder.auto.rounds == learned and st.token_log.ids == []
        assert not st.soft_tokens
    finally:
        eng.close()


# says a step count, then kernels as they are built, then a step done; waits until RELEASE exists
COUNTING_STUB = """
import json, sys, time
from pathlib import Path
for msg in ({"fraction": 0.0, "step": 0, "steps": 4}, {"kernels": 1}, {"kernels": 2},
            {"fraction": 0.25, "step": 1, "steps": 4}, {"kernels": 5}):
    print(json.dumps(msg), flush=True)
release = Path(sys.argv[1])
while not release.exists():
    time.sleep(0.02)
"""


def test_progress_says_the_steps_and_every_kernel_built_as_the_child_counts_them(cold, monkeypatch):
    """A step can build dozens of kernels (minutes on a loaded machine): the events move with each kernel
    the child counts, between its steps, with the counts it said (no estimate)."""
    _folder, release, _calls, _ = cold
    monkeypatch.setattr(
        kernels_mod.KernelPreparer, "command", lambda self: [sys.executable, "-c", COUNTING_STUB, str(release)]
    )
    events: list[object] = []
    eng = Engine(kernels="background")
    try:
        eng.load(demo_spec(), events.append).result(60)
        until(lambda: sum(isinstance(e, KernelProgress) for e in events) >= 6)
        got = [(e.fraction, e.steps_done, e.steps, e.kernels) for e in events if isinstance(e, KernelProgress)]
        assert got[:6] == [
            (0.0, 0, 0, 0),  # at the spawn: the child is loading the pairing
            (0.0, 0, 4, 0),
            (0.0, 0, 4, 1),
            (0.0, 0, 4, 2),
            (0.25, 1, 4, 2),
            (0.25, 1, 4, 5),
        ]
        release.touch()
        until(lambda: any(isinstance(e, KernelProgress) and e.done for e in events))
    finally:
        eng.close()


def _state(pid: int) -> str:
    """The process state letter from /proc (T: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the child is paused on Linux only")
def test_a_reply_stops_the_kernel_building_child_until_it_is_done(cold):
    """A real request preempts the preparation: while a reply runs the child (and so its next C++ compile)
    is stopped; it goes on after the reply, and closing the engine still ends it."""
    _folder, release, _calls, _ = cold
    eng = Engine(kernels="background")
    try:
        eng.load(demo_spec(), None).result(60)
        child = eng._kernels._child
        assert child is not None and _state(child.pid) != "T"
        during: list[str] = []

        def on_event(e: object) -> None:
            if isinstance(e, TokenEvent) and not during:
                during.append(_state(child.pid))

        msgs = [{"role": "user", "content": "Hello"}]
        done = eng.chat(msgs, GenerationSettings(max_tokens=8), on_event).result(60)
        assert done.stats.stop_reason in ("eos", "max_tokens")
        assert during == ["T"]
        until(lambda: _state(child.pid) != "T", 5)
        assert eng._kernels.state == "preparing"
    finally:
        eng.close()
    assert child.wait(5) is not None


PARENT = """
import os, signal, subprocess, sys, time
env = {**os.environ, "GEMMA_CHAT_KERNELS_PARENT": str(os.getpid())}
code = "from core.engine.warmup import _die_with_parent as d; d(); print('ready', flush=True); time.sleep(60)"
code = "import time; " + code
child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
child.stdout.readline()
os.kill(child.pid, signal.SIGSTOP)  # as KernelPreparer.pause does during a reply
print(child.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_stopped_child_dies_with_its_parent():
    """A paused child cannot read its stdin's EOF: when the app is killed mid-reply it must still go
    (a stopped orphan would hold the build lock and every later preparation would wait for it)."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True, cwd=root)
    pid = 0
    try:
        pid = int(parent.stdout.readline())
        until(lambda: _state(pid) == "T", 5)
        parent.kill()
        parent.wait(5)
        until(lambda: not Path(f"/proc/{pid}").exists() or _state(pid) == "Z", 5)
    finally:
        parent.kill()
        if pid and Path(f"/proc/{pid}").exists():
            os.kill(pid, signal.SIGKILL)  # this test's own child, left stopped when the test fails


def test_the_kernel_counter_says_each_new_kernel(tmp_path):
    from core.engine.warmup import watch_kernels

    (tmp_path / "old.so").write_bytes(b"")  # built before: not counted
    said: list[dict] = []
    stop = watch_kernels(tmp_path, lambda **msg: said.append(msg), every_s=0.02)
    try:
        (tmp_path / "a.so").write_bytes(b"")
        until(lambda: said == [{"kernels": 1}], 5)
        (tmp_path / "mlx" / "cpu").mkdir(parents=True)
        (tmp_path / "mlx" / "cpu" / "b.so").write_bytes(b"")
        (tmp_path / "b.cpp").write_text("")  # the source MLX writes first is not a kernel
        until(lambda: said == [{"kernels": 1}, {"kernels": 2}], 5)
    finally:
        stop()


def test_a_request_cuts_short_a_warm_up_step_at_idle_time(tmp_path, monkeypatch):
    """Once the kernels are ready the engine traces the warm-up steps between requests (one can take seconds
    on a loaded machine: a block size of 15 runs 32 tokens): a request that comes meanwhile ends the step at
    its next round instead of waiting for it, and the step runs again at the next idle moment."""
    folder = tmp_path / "kernels"
    folder.mkdir(mode=0o700)
    monkeypatch.setattr(kernel_cache, "_active", kernel_cache.KernelCache(folder))
    monkeypatch.setattr(kernel_cache, "is_prepared", lambda cache, sig: True)  # compiled, traced at idle time
    monkeypatch.setattr(mx, "enable_compile", lambda: None)  # the demo stays uncompiled here: quick
    monkeypatch.delenv("MLX_DISABLE_COMPILE", raising=False)
    ran: list[str] = []
    started = __import__("threading").Event()

    def slow(eng: Engine) -> None:
        ran.append("slow")
        if len(ran) == 1:  # the first time: long, until a request cuts it short (each round checks)
            started.set()
            eng._warm_cancel.wait(60)

    def steps(self, st):
        return [("slow", lambda: slow(self)), ("after", lambda: ran.append("after"))]

    monkeypatch.setattr(Engine, "_warmup_steps", steps)
    mx.disable_compile()
    eng = Engine(kernels="background")
    try:
        eng.load(demo_spec(), None).result(60)
        assert eng._kernels.state == "ready"
        assert started.wait(30)
        t0 = time.monotonic()
        assert hello(eng).stats.stop_reason in ("eos", "max_tokens")
        assert time.monotonic() - t0 < 30  # not the step's 60 s
        decoder = eng._state.decoder
        assert not decoder.traced_ahead and decoder.auto.first_draft_cost > 0  # that reply's first drafts trace
        until(lambda: not eng._kernels.busy)
        assert ran == ["slow", "slow", "after"]  # cut short, then again in full
        # every size traced at idle time: a reply's first drafting round is no dearer than the next
        assert hello(eng).stats.stop_reason in ("eos", "max_tokens")
        assert decoder.traced_ahead and decoder.auto.first_draft_cost == 0.0
    finally:
        eng.close()
        mx.enable_compile()


def test_closing_the_engine_cuts_short_a_warm_up_step_at_idle_time(tmp_path, monkeypatch):
    """Ctrl+C on `serve` while a warm-up step runs at idle time: close() ends the step at its next round, so
    the process stops within its grace period instead of after the step (it once took over 30 s under load)."""
    folder = tmp_path / "kernels"
    folder.mkdir(mode=0o700)
    monkeypatch.setattr(kernel_cache, "_active", kernel_cache.KernelCache(folder))
    monkeypatch.setattr(kernel_cache, "is_prepared", lambda cache, sig: True)
    monkeypatch.setattr(mx, "enable_compile", lambda: None)
    monkeypatch.delenv("MLX_DISABLE_COMPILE", raising=False)
    started = __import__("threading").Event()

    def steps(self, st):
        return [("slow", lambda: (started.set(), self._warm_cancel.wait(60)))]

    monkeypatch.setattr(Engine, "_warmup_steps", steps)
    mx.disable_compile()
    eng = Engine(kernels="background")
    try:
        eng.load(demo_spec(), None).result(60)
        assert started.wait(30)
        t0 = time.monotonic()
        eng.close()
        assert eng._stopped.is_set() and time.monotonic() - t0 < 10  # not the step's 60 s
    finally:
        eng.close()
        mx.enable_compile()
