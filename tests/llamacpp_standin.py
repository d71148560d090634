"""A scripted stand-in for llama.cpp's server (`llama-server`, loopback, started by the tests), in its
dialect: GET /v1/models lists the model `owned_by: "llamacpp"` with its `meta` (n_ctx ...); POST
/v1/chat/completions streams OpenAI chunks with no ids and no origins, and its last chunk (the one
with `finish_reason`, plus the usage chunk when `stream_options.include_usage` asks) carries
llama.cpp's `timings` object with the reply's own draft counters `draft_n` / `draft_n_accepted`
(present only when it drafted). It has no /metrics (llama-server serves it only with --metrics).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

MODEL = "gemma-4-31B-it-Q4_K_M.gguf"
# the reply as llama-server streams it: each piece one decode step (the first: the prompt's token)
PIECES = ["Speculative", " decoding", " lets", " a", " small", " model", " draft", "."]
STEP_TOKENS = [3, 1, 2, 1]  # the 7 tokens after the first, per decode step: its accepted drafts + 1
DRAFT_MAX = 3  # drafts per step (--draft-max 3)


class LlamaCppStandIn:
    def __init__(self, chunk_delay_s: float = 0.01, drafting: bool = True) -> None:
        self.chunk_delay_s = chunk_delay_s
        self.drafting = drafting
        self.requests: list[dict] = []
        self.paths: list[str] = []

    @property
    def tokens(self) -> int:
        return len(PIECES)

    def timings(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "prompt_n": 12,
            "prompt_ms": 40.5,
            "prompt_per_token_ms": 3.4,
            "prompt_per_second": 296.3,
            "predicted_n": self.tokens,
            "predicted_ms": 90.0,
            "predicted_per_token_ms": 11.25,
            "predicted_per_second": 88.9,
        }
        if self.drafting:  # llama.cpp leaves them out when it drafted nothing
            out["draft_n"] = DRAFT_MAX * len(STEP_TOKENS)
            out["draft_n_accepted"] = sum(n - 1 for n in STEP_TOKENS)
        return out

    def chunk(self, delta: dict, finish: str | None = None) -> dict[str, Any]:
        return {
            "choices": [{"finish_reason": finish, "index": 0, "delta": delta}],
            "created": 1796000000,
            "id": "chatcmpl-llamacpp",
            "model": MODEL,
            "system_fingerprint": "b9000-0123abcd",
            "object": "chat.completion.chunk",
        }

    def app(self) -> Starlette:
        async def models(request: Request) -> Response:
            self.paths.append(request.url.path)
            card = {
                "id": MODEL,
                "object": "model",
                "created": 1796000000,
                "owned_by": "llamacpp",
                "meta": {"vocab_type": 2, "n_vocab": 262144, "n_ctx": 16384, "n_ctx_train": 131072},
            }
            return JSONResponse({"object": "list", "data": [card]})

        async def chat(request: Request) -> Response:
            self.paths.append(request.url.path)
            body = await request.json()
            self.requests.append(body)
            usage = {"completion_tokens": self.tokens, "prompt_tokens": 12, "total_tokens": 12 + self.tokens}
            include_usage = (body.get("stream_options") or {}).get("include_usage")

            async def stream() -> Any:
                yield _sse(self.chunk({"role": "assistant", "content": None}))
                for piece in PIECES:
                    await asyncio.sleep(self.chunk_delay_s)
                    yield _sse(self.chunk({"content": piece}))
                last = self.chunk({}, "stop")
                if include_usage:
                    yield _sse(last)
                    yield _sse({**self.chunk({}), "choices": [], "usage": usage, "timings": self.timings()})
                else:
                    yield _sse({**last, "usage": usage, "timings": self.timings()})
                yield b"data: [DONE]\n\n"

            return StreamingResponse(stream(), media_type="text/event-stream")

        async def not_found(request: Request) -> Response:
            self.paths.append(request.url.path)
            return JSONResponse({"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}}, 404)

        return Starlette(
            routes=[
                Route("/v1/models", models),
                Route("/v1/chat/completions", chat, methods=["POST"]),
                Route("/metrics", not_found),
            ]
        )


def _sse(chunk: dict) -> bytes:
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"
