"""`gemma-chat generate`: one turn, headless.

Plain mode streams the answer to stdout and ends with a one-line summary on stderr (tokens, tok/s,
acceptance, tokens per round). `--json` prints one JSON object per line on stdout, flushed as each
token is decided ({"id", "text", "from_draft", "round"}), then {"stats": {...}}; a failure is
{"error": "..."} with exit status 1.

`--image PATH` (repeatable) puts the images before the prompt text in the user message, at
`--image-budget` soft tokens each (default: the checkpoint's). `--drafter-position` and
`--drafter-window` pick the drafter's conventions (core.drafter; they change acceptance only).
"""

from __future__ import annotations

import json
import sys


class _UsageError(Exception):
    pass


def _pairing(args):
    """(PairingSpec fields) from --demo / --model [--drafter] / --pairing."""
    from core.loader import CheckpointError, resolve_checkpoint

    no_draft = getattr(args, "no_draft", False)
    if getattr(args, "demo", False):
        from core.demo import DEMO_NAME, ensure_demo_pairing

        try:
            target, drafter = ensure_demo_pairing()
        except RuntimeError as e:  # DemoIntegrityError: a damaged install
            raise _UsageError(str(e)) from e
        return DEMO_NAME, str(target), None if no_draft else str(drafter), True
    if getattr(args, "model", None):
        try:
            target = resolve_checkpoint(args.model)
            drafter = resolve_checkpoint(args.drafter) if args.drafter and not no_draft else None
        except CheckpointError as e:
            raise _UsageError(str(e)) from e
        return target.name, str(target), str(drafter) if drafter else None, False
    if getattr(args, "pairing", None):
        from core.catalog import PairingNotLocal, resolve_pairing

        try:
            p = resolve_pairing(args.pairing)
        except (KeyError, PairingNotLocal) as e:
            raise _UsageError(str(e).strip("'\"")) from e
        return p.name, str(p.target_path), None if no_draft else str(p.drafter_path), False
    raise _UsageError("say which model to run: --model PATH [--drafter PATH], --pairing NAME or --demo")


def _messages(args) -> list[dict]:
    if args.messages:
        try:
            with open(args.messages, encoding="utf-8") as f:
                messages = json.load(f)
        except (OSError, ValueError) as e:
            raise _UsageError(f"cannot read --messages {args.messages}: {e}") from e
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise _UsageError("--messages must hold a JSON list of {role, content} objects")
    else:
        messages = [{"role": "user", "content": args.prompt if args.prompt is not None else ""}]
    if args.image:
        last = messages[-1] if messages and messages[-1].get("role") == "user" else None
        if last is None:
            last = {"role": "user", "content": ""}
            messages.append(last)
        content = last["content"]
        items = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
        last["content"] = [{"type": "image", "path": p} for p in args.image] + items
    return messages


def _summary(stats: dict, n_tokens: int) -> str:
    parts = [
        f"{n_tokens} tokens",
        f"{stats['decode_tps']:.1f} tok/s",
        f"prefill {stats['prefill_tokens']} tok in {stats['prefill_s']:.2f}s",
        f"ttft {stats['ttft_s']:.2f}s",
    ]
    if stats["drafted"]:
        parts.append(f"acceptance {stats['acceptance']:.0%}")
    parts.append(f"{stats['tokens_per_round']:.2f} tokens/round")
    parts.append(f"stop: {stats['stop_reason']}")
    return " | ".join(parts)


def run(args) -> int:
    from core.engine import Engine, EngineError, PairingSpec
    from core.events import TokenEvent
    from core.settings import GenerationSettings

    as_json = args.json
    out = sys.stdout

    def fail(message: str) -> int:
        if as_json:
            out.write(json.dumps({"error": message}) + "\n")
            out.flush()
        else:
            print(f"error: {message}", file=sys.stderr)
        return 1

    settings = GenerationSettings(
        max_tokens=args.max_tokens,
        temperature=args.temp,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        block_size=args.block_size,
        drafter_enabled=not args.no_draft,
        ignore_eos=args.ignore_eos,
        thinking=args.thinking,
        system_prompt=args.system,
        image_budget=getattr(args, "image_budget", None),
    )
    try:
        settings.validate()
        name, target, drafter, demo = _pairing(args)
        messages = None if args.no_template else _messages(args)
    except (_UsageError, ValueError) as e:
        return fail(str(e))
    if args.no_template and (args.messages or args.image):
        return fail("--no-template takes --prompt text only (no --messages or --image)")

    def on_event(e) -> None:
        if not isinstance(e, TokenEvent):
            return
        if as_json:
            out.write(json.dumps({"id": e.id, "text": e.text, "from_draft": e.from_draft, "round": e.round}) + "\n")
        else:
            out.write(e.text)
        out.flush()

    engine = Engine()
    try:
        try:
            spec = PairingSpec(
                name,
                target,
                drafter,
                demo,
                args.dtype,
                drafter_position=getattr(args, "drafter_position", "P-1"),
                drafter_window=getattr(args, "drafter_window", "W"),
            )
            engine.load(spec, None).result()
        except EngineError as e:
            return fail(str(e))
        if args.no_template:
            future = engine.complete(args.prompt or "", settings, on_event)
        else:
            future = engine.chat(messages, settings, on_event)
        try:
            done = future.result()
        except KeyboardInterrupt:
            engine.cancel()
            future.result(timeout=30)
            raise
        if done.error:
            if not as_json:
                out.write("\n")
            return fail(done.error)
        stats = done.stats.as_dict()
        if as_json:
            out.write(json.dumps({"stats": stats}) + "\n")
            out.flush()
        else:
            out.write("\n")
            out.flush()
            print(_summary(stats, len(done.token_ids)), file=sys.stderr)
        return 0
    finally:
        engine.close()
