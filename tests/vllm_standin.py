"""A scripted stand-in for a vLLM server (loopback, started by the tests): it replays the recorded
chat stream in tests/data/vllm/ and keeps vLLM's Prometheus speculative-decoding counters as a real
vLLM with MTP (num_speculative_tokens=1) would while it streams: one draft per decode step, one
draft token each, accepted when the step emitted two tokens.

`per_request="summary"|"detailed"` plays `vllm serve --per-request-spec-decode-metrics`: the last chunk
also carries the reply's own counts (`metrics.speculative_decoding`); `other_users` adds that many
drafts per step of other requests to the server-wide counters, as a busy server would.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from string import Template

from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

DATA = Path(__file__).parent / "data" / "vllm"
MODEL = "google/gemma-4-31B-it"


def recorded_events() -> list[str]:
    """The recorded stream's SSE events (comments and blank lines dropped), each 'data: ...'."""
    return [line for line in (DATA / "chat_stream.sse").read_text().splitlines() if line.startswith("data:")]


def recorded_steps() -> list[int]:
    """Tokens per content chunk, from the recorded usage counts (the first chunk is the prefill's)."""
    counts, last = [], 0
    for line in recorded_events():
        body = line[5:].strip()
        if body == "[DONE]":
            break
        chunk = json.loads(body)
        if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
            n = chunk["usage"]["completion_tokens"]
            counts.append(n - last)
            last = n
    return counts


class VllmStandIn:
    def __init__(
        self,
        chunk_delay_s: float = 0.02,
        spec_decode: bool = True,
        per_request: str | None = None,
        other_users: int = 0,
    ) -> None:
        self.chunk_delay_s = chunk_delay_s
        self.spec_decode = spec_decode
        self.per_request = per_request
        self.other_users = other_users
        self.metrics_requests = 0
        self.counters = {"drafts": 100, "draft_tokens": 100, "accepted": 70, "generation": 1000, "running": 0}
        self.requests: list[dict] = []

    def metrics_text(self) -> str:
        text = Template((DATA / "metrics.txt").read_text()).substitute({k: float(v) for k, v in self.counters.items()})
        if not self.spec_decode:
            text = "\n".join(line for line in text.splitlines() if "spec_decode" not in line)
        return text

    def reply_metrics(self) -> dict:
        """vLLM's per-request `metrics` of the recorded reply: one draft token per decode step."""
        steps = recorded_steps()[1:]  # the first content chunk is the prefill's token
        spec: dict = {
            "num_spec_steps": len(steps),
            "num_draft_tokens": len(steps),
            "num_accepted_draft_tokens": sum(n - 1 for n in steps),
            "draft_acceptance_rate": sum(n - 1 for n in steps) / len(steps),
            "mean_acceptance_length": 1 + sum(n - 1 for n in steps) / len(steps),
        }
        if self.per_request == "detailed":
            spec["acceptance_histogram"] = [sum(1 for n in steps if n == 1), sum(1 for n in steps if n == 2)]
            spec["per_step_drafted"] = [1] * len(steps)
            spec["per_step_accepted"] = [n - 1 for n in steps]
        return {"time_to_first_token_ms": 80.0, "speculative_decoding": spec}

    def app(self) -> Starlette:
        async def models(request):
            card = {
                "id": MODEL,
                "object": "model",
                "created": 1796000000,
                "owned_by": "vllm",
                "root": MODEL,
                "parent": None,
                "max_model_len": 8192,
                "permission": [],
            }
            return JSONResponse({"object": "list", "data": [card]})

        async def metrics(request):
            self.metrics_requests += 1
            return PlainTextResponse(self.metrics_text())

        async def chat(request):
            self.requests.append(await request.json())

            async def replay():
                self.counters["running"] = 1
                seen = 0
                events = recorded_events()
                last = max(i for i, e in enumerate(events) if e[5:].strip() != "[DONE]")
                try:
                    for i, line in enumerate(events):
                        await asyncio.sleep(self.chunk_delay_s)
                        body = line[5:].strip()
                        if body != "[DONE]":
                            chunk = json.loads(body)
                            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                                n = chunk["usage"]["completion_tokens"] - seen
                                seen += n
                                self.counters["generation"] += n
                                if seen > n and self.spec_decode:  # a decode step (not the prefill's token)
                                    self.counters["drafts"] += 1 + self.other_users
                                    self.counters["draft_tokens"] += 1 + self.other_users
                                    self.counters["accepted"] += n - 1 + self.other_users
                            if i == last and self.per_request and self.spec_decode:
                                line = "data: " + json.dumps({**chunk, "metrics": self.reply_metrics()})
                        yield (line + "\n\n").encode()
                finally:
                    self.counters["running"] = 0

            return StreamingResponse(replay(), media_type="text/event-stream")

        return Starlette(
            routes=[
                Route("/v1/models", models),
                Route("/metrics", metrics),
                Route("/v1/chat/completions", chat, methods=["POST"]),
            ]
        )
