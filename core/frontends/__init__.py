"""Front ends over a `ChatEngine` other than the app: the OpenAI-compatible HTTP server (`server`) and
the benchmark (`bench`)."""
