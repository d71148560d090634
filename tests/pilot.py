"""Shared helpers for Textual pilot tests."""

from __future__ import annotations

import time


async def until(pilot, predicate, timeout: float = 5.0) -> None:
    """Let the app run until `predicate()` holds; fail with a clear message after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the screen")
        await pilot.pause(0.02)


async def ready(pilot, app) -> None:
    """Wait until the session's pairing has loaded and the screens have taken the news."""
    await until(pilot, lambda: app.session.loaded)
    await pilot.pause()


def make_app(
    engine=None,
    *,
    name: str = "fake",
    demo: bool = False,
    spec=None,
    settings=None,
    history=None,
    config=None,
    models_options=None,
    first_run: bool = False,
    blink: bool = True,
    tools_hub=None,
    **engine_kwargs,
):
    """THE way a test builds the app: a GemmaChatApp over a scripted FakeEngine (`app.engine`).

    engine: a FakeEngine (or the real core.engine.local.Engine), else a FakeEngine made from `engine_kwargs`
    (replies=[...], step=True, ...).
    spec: the pairing to open, else a fake one named `name` ("demo (random weights)" with demo=True)
    with directories that need not exist (the fake engine never reads them).
    settings / history / config / tools_hub: as GemmaChatApp takes them. models_options / first_run: the models
    screen's Hub and cache (app.tui.screens.models.ModelsOptions) and whether it opens at start.
    blink=False stops the prompt's cursor blinking, so SVG snapshots do not depend on timing.
    """
    from support.fake_engine import FakeEngine, PairingSpec

    from app.tui.app import GemmaChatApp

    if engine is None:
        engine = FakeEngine(**engine_kwargs)
    elif engine_kwargs:
        raise TypeError(f"make_app: pass either an engine or its options, not both ({sorted(engine_kwargs)})")
    if spec is None:
        spec = PairingSpec("demo (random weights)" if demo else name, "target-dir", "drafter-dir", demo=demo)
    app = GemmaChatApp(engine, spec, settings, history=history, config=config, tools_hub=tools_hub)
    if models_options is not None:
        app.models_options = models_options
    app.first_run = first_run
    if not blink:
        app.chat.prompt.cursor_blink = False
    return app


async def turn(pilot, text: str) -> None:
    """Send `text` from the prompt once the chat is idle, and wait for its reply to finish."""
    app = pilot.app
    await until(pilot, lambda: app.session.loaded and not app.chat.generating)
    n = len(app.chat.history)
    app.chat.prompt.focus()
    app.chat.prompt.text = text
    await pilot.press("enter")
    await until(pilot, lambda: len(app.chat.history) == n + 2)


def texts(app) -> list[str]:
    """The conversation as shown: "U:<user message>" and "A:<reply>" in order."""
    from app.tui.widgets.conversation import ReplyView, UserMessage

    out = []
    for w in app.chat.conversation.children:
        if isinstance(w, UserMessage):
            out.append("U:" + w.message_text)
        elif isinstance(w, ReplyView):
            out.append("A:" + w.plain)
    return out
