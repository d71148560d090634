"""Text fields whose editing keys apply in the order the keys came.

A key a text field binds (Backspace, Ctrl+U, Ctrl+W, the arrows, Enter in an `Input`) is run by Textual
once the key has bubbled up to the app's check of bindings, while the characters typed behind it are
handled by the field at once. Keys that come faster than the app reads them (quick typing, a paste a
terminal sends as keys, tmux send-keys) were then applied out of order: "ab", Backspace, "c" gave
"abc"; Ctrl+U then a retyped line cleared the retyped line. Both fields run their own bindings where
the key arrives instead."""

from __future__ import annotations

from textual import events
from textual.widget import Widget
from textual.widgets import Input, TextArea


async def run_own_binding(widget: Widget, event: events.Key) -> bool:
    """Run the widget's own (non-priority) binding for this key now, as the app would have; whether one
    took it (an action that skips, e.g. Up on a first line, leaves the key to bubble on)."""
    for binding in widget._bindings.key_to_bindings.get(event.key, ()):
        if not binding.priority and await widget.app.run_action(binding.action, widget):
            event.stop()
            event.prevent_default()
            return True
    return False


class OrderedInput(Input):
    """An `Input` whose editing keys apply in the order the keys came (see the module docstring)."""

    async def _on_key(self, event: events.Key) -> None:
        if not event.is_printable and await run_own_binding(self, event):
            return
        await super()._on_key(event)


class OrderedTextArea(TextArea):
    """A `TextArea` whose editing keys apply in the order the keys came (see the module docstring)."""

    async def _on_key(self, event: events.Key) -> None:
        if not event.is_printable and await run_own_binding(self, event):
            return
        await super()._on_key(event)
