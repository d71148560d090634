"""The Textual chat UI. Imported only when the TUI runs (keeps `gemma-chat --help` light)."""
