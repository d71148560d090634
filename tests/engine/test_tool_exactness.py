"""Speculative decoding stays exact through tool-call tokens.

Prompts rendered by core.decode.chat_format with tool declarations, a past call and its result, and
then cut anywhere inside a new call (after `<|tool_call>`, inside the name, inside a `<|"|>` string,
after `<tool_call|>`): greedy decoding with the drafter, and with an oracle drafter whose every draft
is accepted (so K-token verifies run over the tool-call context), must equal the target alone, in
float32, on the reference pack's trained pairings and on the factory's random-weight ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.tools import GET_CURRENT_TIME as TIME

from core.decode import chat_format
from core.decode.prompt import stop_ids
from core.decode.spec import Decoder, Prompt
from core.model.drafter import load_drafter
from core.model.target import load_target
from core.settings import GenerationSettings

PACK = Path("tests/data/pack/models")
CALL = '<|tool_call>call:get_current_time{timezone:<|"|>Europe/Paris<|"|>}<tool_call|><|tool_response>'


class OracleDrafter:
    """Proposes the known continuation: every draft is accepted."""

    def __init__(self, sequence: list[int]):
        self.sequence = sequence

    def draft(self, target, cache, bonus, hidden, n, **kw):
        import mlx.core as mx

        P = cache.offset
        assert self.sequence[P] == int(bonus.item())
        return mx.array(self.sequence[P + 1 : P + 1 + n], dtype=mx.uint32), None


@pytest.fixture(scope="module")
def tokenizer():
    from mlx_lm.tokenizer_utils import load

    return load(PACK / "tokenizer")


def tool_prompt(tokenizer, empty_thought: bool) -> tuple[list[int], list[int]]:
    """(prompt ids up to the generation prompt, the ids of a call the model could write next)."""
    messages = [
        {"role": "system", "content": "You can tell the time."},
        {"role": "user", "content": "What time is it in Tokyo?"},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "c1", "function": {"name": "get_current_time", "arguments": '{"timezone": "Asia/Tokyo"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"timezone": "Asia/Tokyo", "datetime": "21:04"}'},
        {"role": "assistant", "content": "It is 21:04 in Tokyo."},
        {"role": "user", "content": "And in Paris?"},
    ]
    text = chat_format.render(
        chat_format.normalize_messages(messages),
        chat_format.normalize_tools([TIME]),
        bos=tokenizer.bos_token,
        empty_thought=empty_thought,
    ).text
    hf = tokenizer._tokenizer
    return hf.encode(text, add_special_tokens=False), hf.encode(CALL, add_special_tokens=False)


def _greedy(tg, dr, ids, n, block):
    settings = GenerationSettings(max_tokens=n, ignore_eos=True, block_size=block, drafter_enabled=dr is not None)
    return Decoder(tg, dr, None, frozenset()).run(tg.make_cache(), Prompt(list(ids)), settings, lambda e: None)


def _check_cuts(tg, dr, prompt, call, cuts, n=8):
    for k in cuts:
        ids = prompt + call[:k]
        plain = _greedy(tg, None, ids, n, 1)
        drafted = _greedy(tg, dr, ids, n, 3)
        oracle = _greedy(tg, OracleDrafter(ids + plain.token_ids + [0] * 8), ids, n, 6)
        assert drafted.token_ids == plain.token_ids, f"cut {k}"
        assert oracle.token_ids == plain.token_ids, f"cut {k}"
        assert oracle.stats.accepted == oracle.stats.drafted > 0


@pytest.mark.parametrize("family", ["e-style", "moe-style", "dense-style", "unified-style"])
def test_pack_pairings_are_exact_anywhere_inside_a_call(tokenizer, family):
    tg = load_target(PACK / f"{family}-target")
    dr = load_drafter(PACK / f"{family}-assistant")
    assert tg.dtype.__str__().endswith("float32")
    prompt, call = tool_prompt(tokenizer, empty_thought=family != "e-style")
    assert len(prompt) > 4 * tg.window  # the sliding window has rolled over the declarations
    markers = {tokenizer._tokenizer.convert_tokens_to_ids(t) for t in ("<|tool_call>", '<|"|>', "<tool_call|>")}
    assert markers <= set(prompt) and markers <= set(call)
    # on the E-series pair (KV sharing, centroid head) a cut at and just after every marker, inside the name
    # and inside the string; a spread of them on the others (CPU time: each cut is three whole prefills)
    at_markers = {i + d for i, t in enumerate(call) if t in markers for d in (0, 1)}
    cuts = sorted({1, 5, len(call) - 1, *at_markers} & set(range(len(call)))) if family == "e-style" else None
    cuts = cuts or [1, 7, len(call) // 2, len(call) - 1]
    _check_cuts(tg, dr, prompt, call, cuts)


@pytest.mark.parametrize("variant", ["e-style", "moe-style"])
def test_factory_pairings_are_exact_inside_a_call(factory_checkpoints, tokenizer, variant):
    target_dir, drafter_dir = factory_checkpoints.pairing(variant, dtype="float32")
    tg, dr = load_target(target_dir), load_drafter(drafter_dir)
    prompt, call = tool_prompt(tokenizer, empty_thought=variant != "e-style")
    assert json.loads((Path(target_dir) / "tokenizer_config.json").read_text())["extra_special_tokens"]["stc_token"]
    _check_cuts(tg, dr, prompt, call, [2, len(call) // 2, len(call) - 1], n=6)


def test_tool_response_is_a_stop_id_read_from_the_checkpoint(tokenizer):
    """The stop set holds <|tool_response> from generation_config.json, at this tokenizer's id (not 50)."""
    want = tokenizer._tokenizer.convert_tokens_to_ids("<|tool_response>")
    assert want != 50
    for family in ("e-style", "dense-style"):
        assert want in stop_ids(PACK / f"{family}-target", tokenizer)


def _demo_calls_tools() -> bool:
    from core.hub import demo

    template = demo.DEMO_DIR / "target" / "chat_template.jinja"
    return template.is_file() and "<|tool_call>" in template.read_text(encoding="utf-8")


@pytest.mark.skipif(not _demo_calls_tools(), reason="the shipped demo is not trained to call tools yet")
def test_the_demo_calls_the_time_tool_and_drafting_stays_exact():
    """The demo is trained on mcp-server-time's get_current_time: its call, and its answer to the
    result, are the same tokens with the drafter (fixed and auto block size) as without."""
    from core.engine.contract import PairingSpec
    from core.engine.local import Engine
    from core.hub import demo

    target, drafter = demo.ensure_demo_pairing()
    # both of mcp-server-time's tools, as its tools/list gives them (captured): what the chat offers and
    # what the demo was trained with (with get_current_time alone it answers in prose)
    captured = json.loads((Path(__file__).parents[1] / "data" / "mcp_server_time" / "captured.json").read_text())
    tools = [
        {
            "type": "function",
            "function": {"name": t["name"], "description": t["description"], "parameters": t["inputSchema"]},
        }
        for t in captured["tools"]
    ]
    ask = [{"role": "user", "content": "What time is it in Paris?"}]
    runs = {}
    for name, with_drafter, block in [("plain", False, 1), ("K=3", True, 3), ("auto", True, "auto")]:
        eng = Engine()
        try:
            eng.load(PairingSpec("demo", str(target), str(drafter) if with_drafter else None), None).result(600)
            settings = GenerationSettings(max_tokens=64, block_size=block)
            call_turn = eng.chat(ask, settings, None, tools=tools).result(600)
            assert call_turn.error is None and call_turn.stats.stop_reason == "tool_calls", call_turn
            [call] = call_turn.tool_calls
            assert call.name == "get_current_time" and isinstance(call.arguments.get("timezone"), str)
            history = ask + [
                {"role": "assistant", "content": None, "tool_calls": [call.openai()]},
                {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"timezone": "Europe/Paris"})},
            ]
            answer = eng.chat(history, settings, None, tools=tools).result(600)
        finally:
            eng.close()
        runs[name] = (call_turn.token_ids, answer.token_ids)
    assert runs["K=3"] == runs["plain"] and runs["auto"] == runs["plain"]
