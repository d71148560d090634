"""gemma-chat's terminal UI and command line. Talks to the engine only through `core`."""

__version__ = "0.1.0"
