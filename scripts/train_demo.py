"""Train the offline demo pairing that ships in core/data/demo/.

    .venv/bin/python scripts/train_demo.py --target-steps N --drafter-steps 0 --out A        (stage 1: target)
    .venv/bin/python scripts/train_demo.py --continue-drafter A --drafter-steps N --out B     (stage 2: drafter)
    .venv/bin/python scripts/train_demo.py --continue-drafter B --on-policy --drafter-steps N --lr L --out OUT

The shipped weights (wave 8, 2026-12-07) are wave 7's (below) trained two stages further, on wave 7's
corpus plus wave 8's drills (demo_corpus.tool_drills(off_topic=True, denied=True): a third of the drills'
turns off-topic questions with the time tools declared, OFF_TOPIC_TOOLS and OFF_TOPIC_PLACES among them,
and one turn in sixteen a call the user denied, answered with DENIED_REPLY):
    --continue-target core/data/demo --replay 1600,600 --tool-drills 2000 --more-off-topic --off-topic-drills
        --denied-drills --target-steps 200 --drafter-steps 0 --lr 7e-4 --out A   (409 s)
    --continue-drafter A --on-policy (the same corpus flags) --drafter-steps 300 --lr 2e-3 --out AD   (615 s),
        copied to core/data/demo
  Nine stages in all, about 1 h 50 min of one core. Why: with the time tools declared, as the app declares
  them by default, wave 7 answered 4 of its 40 off-topic questions with a time call for a made-up zone
  ("What's 5 + 5?" -> Asia/Dubai), and after a denied call it made up a time. Measured with
  measure_demo.py --repeats 1 --in-process (a third twenty off-topic questions, written before these runs
  and kept out of the corpus, added to OFF_TOPIC_HELD_OUT):
      pairing                    held-out   off-topic   off-topic, tools   time tools (+2 denied)   checks
      wave 7 (shipped before)    53/58      40/40       54/60 (36/40)      32/38 (denied: not measured)
      A (wave 7's drafter)       54/58      60/60       60/60              31/38 + 2/2              15/15
      B: 300 steps at 1e-3       53/58      60/60       60/60              31/38 + 2/2              15/15
  B's on-policy drafter (BD) drafted only 35.5 % of the tokens of the off-topic replies with tools (AD 75.4 %),
  so A shipped. AD, shipped (measure_demo.py --set all, a fresh auto-block cache): on topic 9/9 of the speed
  set, 54/58 held out, 60/60 off-topic with and without the tools, 33/40 tools; tokens from accepted drafts
  78.2 % speed set, 77.0 % held out, 78.5 % off-topic, 74.2 % tools, 72.4 % off-topic with tools. Twenty
  more off-topic questions typed afterwards (none in the corpus or measure_demo.py): 20/20 without and with the
  tools (wave 7: 20/20, 18/20: "What's the weather in Tokyo?" and "What's 100 - 37?" became time calls).
  The time-tool misses are wave 7's: "How late is it in Moscow?" and "What's the hour in
  Dubai?" get the off-topic reply, the two conversions name one zone twice, the two zones kept out of the
  corpus are misspelled, and after Sofia's misspelled zone's error it does not give TIME_ERROR_REPLY.

Wave 7 (shipped 2026-12-07 until wave 8) came from these runs, two at a time on an otherwise idle 2-core
machine (one OpenBLAS thread each; seconds as the manifest records them):
    --replay 1400,600 --tool-drills 500 --target-steps 1200 --drafter-steps 0 --lr 4e-3 --out T
                                                           2455 s: wave 6's first stage on wave 7's wide corpus
                                                           (demo_corpus.WIDE_PHRASINGS and OFF_TOPIC_WIDE, every
                                                           held-out turn kept out of every conversation)
    --continue-target T --replay 1400,600 --tool-drills 1500 --target-steps 300 --lr 1e-3 --drafter-steps 0
                                                           --out TF   (619 s)
    --continue-drafter TF --replay 1400,600 --tool-drills 500 --drafter-steps 400 --lr 3e-3 --out TFD   (536 s)
    --continue-drafter TFD --on-policy --replay 1400,600 --tool-drills 500 --drafter-steps 300 --lr 2e-3
                                                           --out TFD2   (488 s)
    --continue-target TFD2 --replay 1400,600 --tool-drills 1500 --more-off-topic --target-steps 250 --lr 1e-3
                                                           --drafter-steps 0 --out TF2   (529 s)
    --continue-target TF2 --replay 1600,600 --tool-drills 2000 --more-off-topic --target-steps 200 --lr 7e-4
                                                           --drafter-steps 0 --out TF3   (416 s)
    --continue-drafter TF3 --on-policy --replay 1600,600 --tool-drills 2000 --more-off-topic --drafter-steps 300
                                                           --lr 2e-3 --out TF3D   (393 s), wave 7
  Measured (measure_demo.py --set all --repeats 1 --in-process; each target with the drafter it had then):
      target (drafter)   held-out on topic   off-topic reply   time tools   suite's demo checks
      T (random)         56/58 = 97 %        19/20             21/38        -
      TF (random)        53/58 = 91 %        19/20             30/38        10/11 ("what time is it in tokyo"
                                                                                  -> Asia/Shanghai)
      TF2 (TFD2's)       55/58 = 95 %        19/20             31/38        11/11
      TF3 (TFD2's)       53/58 = 91 %        20/20             32/38        11/11
      TF3 (TF3D), wave 7: on topic 9/9 of the speed set, 53/58 held out, 20/20, 32/38, 11/11; tokens from
      accepted drafts 75.7 % on the speed set, 75.6 % held out, 81.8 % off-topic, 70.0 % with tools.
  20 more off-topic questions written afterwards, none in the corpus ("Who wrote The Odyssey?", "How do I write
  a loop in Perl?", "What's 7 * 6?", ...: the second twenty of measure_demo.py's OFF_TOPIC_HELD_OUT): TF3
  20/20, TF2 20/20, wave 6 19/20 (the Perl loop got the Python loop's reply). The same 40 with the time tools
  declared, as the app declares them by default (measure_demo.py --set off-topic-tools): 36/40, the other 4
  a time call for a made-up zone ("Tell me about the Eiffel Tower." -> Pacific/fateer); wave 6 32/40 (5
  time calls, 3 Python replies). The time-tool misses: "How
  late is it in Moscow?" and "What's the hour in Dubai?" get the off-topic reply, the two conversions name
  the source zone twice, and the two zones kept out of the corpus are misspelled (wave 6 got the first four
  right).
  Wave 6 (the demo this replaced) read 46/58 = 79 %, 19/20 and 37/40, but 12 of its corpus's 2400
  conversations had one of the held-out turns (a paraphrased opening such as "What's a drafter?", or a later
  turn: the corpus then dropped only conversations that STARTED like a held-out one), so its held-out figure
  was not quite held out. Wave 7's corpus drops any conversation with a held-out turn anywhere, compared
  with case and punctuation folded (demo_corpus.held_out_turns; measure_demo.py refuses to measure a
  pairing whose recorded corpus has one). What moved held-out from 79 % to 91-97 % is WIDE_PHRASINGS: 67
  more phrasings of the nine topics wave 6 missed (why drafting is faster, exactness, auto, model choice,
  MLX, keys, greetings, what it can do, speculative decoding). Two ways to the off-topic reply were tried
  in parallel: C, a from-scratch target on a corpus with the 91 OFF_TOPIC_MORE questions in it (same
  recipe, --replay 1600,600), read 52/58, 19/20 and 26/39 (even Paris's call named Europe/London: from
  scratch, how well the copying forms varies from run to run, as T's 21/38 shows too); a first run
  continued from wave 6 itself (300 steps at 1e-3 on wave 7's corpus) read 52/58 but 17/20 and inherited
  wave 6's leaked turns, so neither shipped.
  Every off-topic miss along the way was a different question (French lessons, dreams, the Eiffel Tower):
  the 20/20 holds for these 20, not for every question a user can ask.

Wave 6 (shipped 2026-12-06 until wave 7) came from these runs, on an otherwise idle 2-core machine:
    --replay 1300,600 --tool-drills 500 --target-steps 1200 --drafter-steps 0 --lr 4e-3 --out T
                                                           2330 s (1.9 s a step), loss 8.1 -> 0.02-0.2 by
                                                           batch; the q/k norms start at head_dim ** -0.25
                                                           (`soften_attention`: wave 5's recipe otherwise,
                                                           with 1200 steps instead of 1600)
    --continue-drafter T --replay 1300,600 --tool-drills 500 --drafter-steps 400 --lr 3e-3 --out D   (443 s)
    --continue-drafter D --on-policy --replay 1300,600 --tool-drills 500 --drafter-steps 300 --lr 2e-3
                                                           --out D2   (403 s with the on-policy replies),
                                                           copied to core/data/demo
  Measured (measure_demo.py --set all --repeats 1 --in-process, the demo it replaced, "E", in brackets, run
  the same hour): on topic 9/9 of the speed set (9/9), 46/58 = 79 % held out (38/58 = 66 %), the
  off-topic reply 19/20 (18/20), time tools 37/40 (6/39: the call names the asked city's zone, the answer
  copies the result's time; the misses are the two zones kept out of the corpus, typed as written, and one
  answer after them); tokens from accepted drafts 78.5 % on the speed set (60.6 %), 70.3 % held out
  (72.8 %), 73.4 % with tools (59.0 %). Speed-up, drafter on against off, medians of the speed set, two
  interleaved `--set speed --repeats 3` runs each: 1.34x and 1.17x (E 1.31x and 1.29x): the same, within
  this machine's noise.
  Waves 3-5 (below) had shown that more data and more steps did not teach the copying; a teacher-forced
  probe of the call's zone (24 of the corpus's cities and 4 questions with no place, the call's zone tokens
  scored given the ones before) said why: E got 3 of 28 calls right, and 200 further steps of drills
  alone 8 of 28. scripts/induction_check.py then showed that these shapes learn to copy at all only late
  when the q/k norms start at 1.0 (Gemma 4's attention scale is 1.0, so the logits' spread is
  ~sqrt(head_dim)). With the softer start the same probe read 0/28 at step 250, 9/28 at 500, 22/28 at
  700 and 24/28 at 850.

Stages A-E (the demo shipped before wave 6; seconds on the shared 2-core machine, heavily loaded by other
test runs):
    --target-steps 1400 --drafter-steps 0 --out A          stopped at step 550 (4006 s, loss 8.2 -> ~0.2)
    --target-steps 780 --resume ...; then --target-steps 750 --resume --out A
                                                           steps 551-750 (1650 s): the rest of the cosine
                                                           schedule compressed to end at 780, stopped at 750
    --continue-drafter A --drafter-steps 50 --out B        (242 s once resumed at step 10)
    --continue-drafter B --drafter-steps 85 --lr 3e-3 --out C   (358 s)
    --continue-drafter C --drafter-steps 130 --lr 3e-3 --out D
                                                           stopped at step 110, resumed with --drafter-steps 110
                                                           (~900 s)
    --continue-drafter D --drafter-steps 200 --lr 2e-3 --out core/data/demo   (375 s, the machine quieter; "E")
The default corpus (`demo_corpus.conversations(0)`) is the one stages A-E trained on. Wave 3 tried
a further target stage on the wide corpus (`--replay`: `conversations(wide=True)`, paraphrased openings,
the tz database's 442 Region/City zones as places, more time phrasings) plus `tool_drills` (1-3 time
exchanges per chat), to teach copying the asked zone into the call and the result's time and zone into
the answer (not shipped: it made the demo worse):
    --continue-target E --replay 1300,400 --tool-drills 700 --target-steps 300 --batch-tokens 1024 --lr 2e-3
                                                           stopped at step 110 (1226 s): at that learning rate
                                                           every call named one zone (America/Sao_Paulo)
    same with --target-steps 210 --lr 1e-3 --resume        steps 111-180 (~680 s), stopped at 180: calls
                                                           name a real zone, mostly not the one asked
                                                           (Paris right, Tokyo -> Asia/Shanghai), answers
                                                           copy the time but not the zone; held-out on topic
                                                           57 % (E: 66 %), drafts 40 % with E's drafter
Wave 4 trained a target FROM SCRATCH on the wide corpus plus drills (not shipped: see below), in one
--state folder, changing the schedule's length twice as the machine's load (2 shared cores, load 5-7:
4 to 12 s a step) moved the time it could take:
    --replay 1300,600 --tool-drills 500 --target-steps 700 --drafter-steps 0 --lr 4e-3 --save-every 25
                                                           (2400 conversations, 761389 tokens) stopped at
                                                           step 100 (475 s of steps, loss 8.1 -> 2.4)
    same with --target-steps 900 --resume                  steps 101-250 (1079 s), stopped at 250 (loss ~1.5)
    same with --target-steps 650 --resume                  steps 251-600 (2651 s), stopped at 600 (loss
                                                           0.4-0.7 by batch; A reached ~0.2 on its corpus)
    same with --target-steps 600 --drafter-steps 300 --batch-tokens 1024 --resume
                                                           the target written at 600 (cosine lr at 0.11 of
                                                           its peak), then its drafter from the factory's
                                                           (352 s, loss 19.5 -> 0.5-3 by batch)
  Its greedy samples already missed corpus prompts that E answers ("Hello / What is speculative
  decoding?" -> a logging docstring; "What are the keys of this app?" -> the off-topic reply) and called
  Asia/Shanghai for Paris: 600 steps over a corpus 1.6x A's (1.6 epochs, A had 3.2) do not fit it.
  Measured (scripts/measure_demo.py --repeats 1, --model/--drafter on it; E in brackets): held-out on
  topic 1/58 = 2 % (E 38/58 = 66 %; 43 of its 57 misses are the off-topic reply, mostly the with-tools
  one, 36 of 43, although no tools were declared), tokens from accepted drafts 76.1 % (E 67.9 %): its drafter
  distils fine, its target does not know the corpus yet. Off-topic 20/20 (E 18/20: it says so to nearly
  everything). Tools 15/40 (E 6/39): no call names the asked zone (most "Asia/UTC"), but 13 of the 19
  answers copy the given result's time and zone exactly (E: 1), so the drills do teach that copying.
  A from-scratch wide run needs the ~3 epochs A had (~1200 steps, 2-3 hours on this machine when it is
  shared; the --state at step 600 was not kept).
Wave 5 ran wave 4's recipe to the ~4 epochs it lacked, uninterrupted, on an idle machine (about 2.8 s a step;
not shipped: barely better than E, see below):
    --replay 1300,600 --tool-drills 500 --target-steps 1600 --drafter-steps 0 --lr 4e-3 --out T
                                                           4581 s, loss 8.1 -> 0.07-0.7 by batch
    --continue-drafter T --replay 1300,600 --tool-drills 500 --drafter-steps 400 --lr 3e-3 --out D
                                                           484 s; centroid-routed greedy == full greedy at
                                                           2092/2100 positions
  Its greedy samples answer the corpus prompts sampled (second turns, "What are the keys of this app?",
  json.dumps) and answer a given result in its shape ("It is 09:57 in Europe/Paris."), but call
  Etc/UTC for Paris and give "Why is the sky blue?" the legend's reply. Measured (measure_demo.py --set all
  --repeats 1 --in-process, E in brackets, measured right after it): speed set 9/9 on topic (9/9), 61.2 % of
  tokens from accepted drafts (79.1 %); held-out on topic 40/58 = 69 % (38/58 = 66 %), drafts 61.7 % (78.1 %),
  speed-up median 1.29x (1.71x); off-topic 17/20 (18/20); tools 6/38 (7/39): calls name a real zone but
  not the one asked (Havana -> "America/Mamaica": pieces of the name begin to be copied), answers copy the
  result's zone but not its time. So ~4 epochs of the wide corpus do not reach the 80 % held-out target at
  these shapes either; what is left to try is a larger target (the package has ~3.5 MB of room under 20 MB)
  or a corpus with many more phrasings per topic.
A rerun reproduces them only with the same stops and resumes (a resumed stage's schedule follows the
--target-steps / --drafter-steps / --lr it is resumed with).

STAGES

1. Writes a random-weight E-style pairing with the checkpoint factory, in the demo's shapes
   (`DEMO_SHAPES`): the real on-disk layout (HF names, config.json, tokenizer, chat template). Then
   replaces the factory's tokenizer with the demo's own (scripts/demo_tokenizer.py, trained on the
   corpus: same special ids, digits and punctuation as single pieces) and its simplified chat template
   with the canonical Gemma 4 E2B/E4B template (scripts/gemma4_e2b_chat_template.jinja, published
   2026-07-09), in the target and in the drafter.
2. Renders every corpus conversation (scripts/demo_corpus.py: multi-turn chats, off-topic questions,
   time-tool calls and results) with that template, exactly as a chat client renders it (tools through
   `tools=`, results as the template writes them), tokenises it once, and trains the target's text
   model on every token the model generates (replies, `<turn|>`, tool calls up to `<|tool_response>`),
   weight 1, the rest of the prompt weight 0.1 and tool results 0 (they are the server's, not the
   model's). Each generation point's prompt is checked to tokenise to exactly the ids before it,
   so what the model learns is what it sees when the engine renders that prompt alone.
3. Freezes the target and distils the centroid-head `gemma4_assistant` drafter against it: for
   every generated position q the drafter starts from the target's post-norm hidden at q and the token
   at q + 1, reads the target's producer-layer K/V of [0, q] (the round's query position P - 1), and
   is unrolled `DRAFT_STEPS` steps, each matching the target's next-token distribution at q + j
   (soft + hard cross-entropy on the vocabulary, soft cross-entropy on the centroid head's clusters).
   The centroid head's `token_ordering` groups the tokens by how often the model generates them.
   `--on-policy` adds the target's own greedy replies to `demo_corpus.on_policy_conversations()`.
4. Writes the trained tensors back under their on-disk names (vision tower untouched: random),
   checks that the engine's MLX forward picks the same greedy tokens as the trained model and that
   the written drafter's centroid routing reproduces its full-vocabulary choice
   (`check_drafter_routes`), and writes the manifest `gemma_chat_demo.json` with every file's sha256
   (checked by `core.hub.demo`).

The arithmetic runs in numpy with autograd (scripts/demo_numpy.py): MLX's CPU matmul measured
~1 GFLOP/s here against OpenBLAS's ~20. Float32, fixed seeds (factory seed 0, corpus seed 0, data order
seed 0), one OpenBLAS thread: on one machine a rerun gives the same weights; other CPUs may differ in
the last bits. A long stage can be stopped and resumed (`--resume`: it saves its state every
`--save-every` steps next to `--out`).
"""

from __future__ import annotations

import os

# OpenBLAS's thread pool spins against other processes on a shared machine (40 s instead of 3 s
# for a forward here): one thread per matmul is fastest.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import autograd.numpy as anp  # noqa: E402
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from autograd import value_and_grad  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the checkpoint factory and the fake engine (tests/support)
sys.path.insert(0, str(ROOT / "scripts"))
from core.user.kernel_cache import use_private_kernel_cache  # noqa: E402

use_private_kernel_cache()  # before mlx runs anything: its compiled kernels go to gemma-chat's private folder

import demo_corpus  # noqa: E402
import demo_numpy as dn  # noqa: E402
import demo_tokenizer  # noqa: E402
from support import factory  # noqa: E402
from support.factory.specs import F, S  # noqa: E402
from support.factory.writer import DiskTensor, write_safetensors  # noqa: E402

from core.model.drafter import load_drafter  # noqa: E402
from core.model.loader import load_target_model, load_tokenizer  # noqa: E402

SEED = 0
DRAFT_STEPS = 4  # drafter steps unrolled in training (block size 5)
TARGET_LAYERS = 16
TEMPLATE = ROOT / "scripts" / "gemma4_e2b_chat_template.jinja"
LABEL = "demo: tiny model trained on gemma-chat's notes, Python docstrings and time-tool calls"


def _layer_types(n: int) -> list[str]:
    types = [F if i % 4 == 3 else S for i in range(n)]
    types[-1] = F
    return types


# Why these shapes: on a CPU a tiny model's decode step costs about a fixed amount per layer
# (kernel launch and Python overhead, not arithmetic), and a K-token verify costs about one
# step. The drafter always has 4 (query-only) layers, so a target of 16 layers makes a draft step
# about a quarter of a target step, and drafting pays. 128 wide holds the multi-turn chats, the
# off-topic rule and the copying of tool results; the weights still ship in ~15 MB. The sliding
# window covers the longest corpus conversation (the two tool declarations alone are ~300 tokens).
DEMO_SHAPES = {
    "text_config": {
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": TARGET_LAYERS,
        "layer_types": _layer_types(TARGET_LAYERS),
        "num_kv_shared_layers": 6,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "global_head_dim": 128,
        "hidden_size_per_layer_input": 8,
        "use_double_wide_mlp": True,
        "sliding_window": 1024,
    },
    "drafter": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 2,
        "use_ordered_embeddings": True,
        "num_centroids": 32,
        "centroid_intermediate_top_k": 8,
    },
}


# -- data ------------------------------------------------------------------------------------


def _hf(tokenizer):
    return getattr(tokenizer, "_tokenizer", tokenizer)


def render(tokenizer, template: str, conv: demo_corpus.Conversation, generation_prompt: bool) -> str:
    messages, tools = demo_corpus.render_conversation(conv)
    text = _hf(tokenizer).apply_chat_template(
        messages,
        tools=tools,
        tokenize=False,
        add_generation_prompt=generation_prompt,
        chat_template=template,
        enable_thinking=False,
    )
    assert isinstance(text, str)
    return text


def generation_spans(tokenizer, template: str, conv: demo_corpus.Conversation):
    """(full text, [(start, end, prompt text)] of what the model generates, [(start, end)] of tool results).

    A reply is its text and `<turn|>`; a tool call is `<|tool_call>...<tool_call|><|tool_response>`
    (generation stops at `<|tool_response>`); each starts where the template's generation prompt for
    the conversation so far ends."""
    full = render(tokenizer, template, conv, False)
    spans = []
    for i, ev in enumerate(conv.events):
        if ev[0] not in ("reply", "call"):
            continue
        prompt = render(tokenizer, template, dataclasses.replace(conv, events=conv.events[:i]), True)
        upto = render(tokenizer, template, dataclasses.replace(conv, events=conv.events[: i + 1]), False)
        if not upto.startswith(prompt):
            raise RuntimeError(f"the template's prompt is not a prefix of the rendered turn: {prompt[-80:]!r}")
        gen = upto[len(prompt) :]
        if ev[0] == "reply":
            gen = gen[: gen.index("<turn|>") + len("<turn|>")]
        elif not gen.endswith("<|tool_response>"):
            raise RuntimeError(f"a tool call must end with <|tool_response>: {gen!r}")
        if not full.startswith(prompt + gen):
            raise RuntimeError(f"the conversation does not continue the turn's prompt: {gen!r}")
        kind = ev[0] if ev[0] == "call" or i == 0 or conv.events[i - 1][0] != "result" else "answer"
        spans.append((len(prompt), len(prompt) + len(gen), prompt, kind))
    results = []
    at = 0
    while (i := full.find("<|tool_response>response:", at)) >= 0:
        end = full.index("<tool_response|>", i) + len("<tool_response|>")
        results.append((i + len("<|tool_response>"), end))
        at = end
    return full, spans, results


# Where a reply is decided: its first tokens choose among the corpus's replies (the rest follows from
# them), a call's argument values carry the zone or the time, an answer after a result copies it.
# Those tokens weigh DECISION_WEIGHT in the loss, the rest of what the model generates 1.
DECISION_TOKENS = 6
DECISION_WEIGHT = 3.0
_STRING = re.compile(r'<\|"\|>(.*?)<\|"\|>', re.S)


def encode_conversation(tokenizer, template: str, conv, max_len: int):
    """(ids, weights) or None when longer than `max_len`: weight 1 on generated tokens (DECISION_WEIGHT
    on the deciding ones), 0 on tool results, 0.1 on the rest of the prompt."""
    hf = _hf(tokenizer)
    full, spans, results = generation_spans(tokenizer, template, conv)
    enc = hf(full, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), list(enc["offset_mapping"])
    end = spans[-1][1]
    n = sum(1 for a, _ in offsets if a < end)
    if n > max_len:
        return None
    ids, offsets = ids[:n], offsets[:n]
    starts = {a: k for k, (a, _) in enumerate(offsets)}
    weights = np.full(n, 0.1, np.float32)
    for a, b, prompt, kind in spans:
        k = starts.get(a)
        if k is None or list(hf.encode(prompt, add_special_tokens=False)) != ids[:k]:
            raise RuntimeError(f"the prompt does not tokenise to the ids before its reply: {prompt[-60:]!r}")
        values = [(a + m.start(1), a + m.end(1)) for m in _STRING.finditer(full[a:b])] if kind == "call" else []
        for t in range(k, n):
            at = offsets[t][0]
            if at >= b:
                break
            deciding = kind == "answer" or t - k < DECISION_TOKENS or any(u <= at < v for u, v in values)
            weights[t] = DECISION_WEIGHT if deciding else 1.0
    for a, b in results:
        for t, (s, _) in enumerate(offsets):
            if a <= s < b:
                weights[t] = 0.0
    return ids, weights


def encode_corpus(tokenizer, template: str, convs, max_len: int, log) -> list[tuple[list[int], np.ndarray]]:
    t0 = time.perf_counter()
    out = [e for e in (encode_conversation(tokenizer, template, c, max_len) for c in convs) if e is not None]
    log(
        f"encoded {len(out)}/{len(convs)} conversations ({len(convs) - len(out)} over {max_len} tokens), "
        f"{sum(len(i) for i, _ in out)} tokens, {sum(int((w >= 0.5).sum()) for _, w in out)} generated "
        f"({time.perf_counter() - t0:.0f}s)"
    )
    return out


def batches(examples, batch_tokens: int, rng: random.Random):
    """Length-bucketed batches (inputs [B, T], targets [B, T], loss weights [B, T]) in a shuffled order."""
    order = sorted(range(len(examples)), key=lambda i: (len(examples[i][0]), rng.random()))
    groups, cur = [], []
    for i in order:
        cur.append(i)
        if len(cur) * len(examples[i][0]) >= batch_tokens:
            groups.append(cur)
            cur = []
    if cur:
        groups.append(cur)
    rng.shuffle(groups)
    for g in groups:
        T = max(len(examples[i][0]) for i in g) - 1
        x = np.zeros((len(g), T), np.int32)
        y = np.zeros((len(g), T), np.int32)
        w = np.zeros((len(g), T), np.float32)
        for r, i in enumerate(g):
            ids, weights = examples[i]
            n = len(ids) - 1
            x[r, :n] = ids[:-1]
            y[r, :n] = ids[1:]
            w[r, :n] = weights[1:]  # position t predicts token t + 1
        yield x, y, w


def cosine_lr(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


# -- resumable training loop -------------------------------------------------------------------


class Saver:
    """Params and Adam moments every `every` steps to `path` (an .npz), so a stopped stage resumes."""

    def __init__(self, path: Path | None, every: int):
        self.path, self.every = path, every

    def load(self, params: dict, opt: dn.Adam) -> int:
        if self.path is None or not self.path.is_file():
            return 0
        data = np.load(self.path)
        for k in params:
            params[k] = data["p/" + k]
            opt.m[k], opt.v[k] = data["m/" + k], data["v/" + k]
        opt.t = int(data["t"])
        return int(data["step"])

    def save(self, params: dict, opt: dn.Adam, step: int) -> None:
        if self.path is None or not self.every or step % self.every:
            return
        arrays = {"step": np.array(step), "t": np.array(opt.t)}
        for k in params:
            arrays["p/" + k], arrays["m/" + k], arrays["v/" + k] = params[k], opt.m[k], opt.v[k]
        tmp = self.path.with_suffix(".tmp.npz")
        np.savez(tmp, **arrays)
        tmp.replace(self.path)


def run_steps(name: str, grad_fn, params: dict, make_batches, steps: int, lr: float, saver: Saver, log, prepare=None):
    """Adam with a cosine schedule over `steps` batches of `make_batches(epoch)` (each passed through
    `prepare`); a resumed run skips the batches its saved state already trained on."""
    opt = dn.Adam(params)
    done = saver.load(params, opt)
    if done:
        log(f"{name}: resumed at step {done}")
    step, seen, epoch, t0 = done, 0, 0, time.perf_counter()
    while step < steps:
        for batch in make_batches(epoch):
            seen += 1
            if seen <= done:
                continue
            loss, grads = grad_fn(params, *(prepare(*batch) if prepare else batch))
            opt.update(params, grads, cosine_lr(step, steps, lr, 10))
            step += 1
            saver.save(params, opt, step)
            if step % 10 == 0 or step == steps or step <= 2:
                log(f"{name} step {step}/{steps} loss {float(loss):.4f} ({time.perf_counter() - t0:.0f}s)")
            if step >= steps:
                break
        epoch += 1


# -- target ----------------------------------------------------------------------------------


def train_target(p: dict, spec, examples, steps: int, batch_tokens: int, lr: float, saver: Saver, log) -> None:
    def loss_fn(params, x, y, w):
        logits, _, _ = dn.target_forward(params, spec, x)
        return anp.sum(dn.cross_entropy(logits, y) * w) / np.sum(w)

    def make_batches(epoch: int):
        return batches(examples, batch_tokens, random.Random(SEED * 1000 + epoch))

    run_steps("target", value_and_grad(loss_fn), p, make_batches, steps, lr, saver, log)


# -- drafter ---------------------------------------------------------------------------------


def gather_queries(m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Query positions worth unrolling the drafter from: q with a generated token among q+1..q+K.
    Returns (idx [B, Q] padded with the row's last query, present [B, Q])."""
    B, T = m.shape
    useful = np.zeros((B, T), bool)
    for j in range(1, DRAFT_STEPS + 1):
        useful[:, : T - j] |= m[:, j:] > 0.5
    rows = [np.flatnonzero(r) for r in useful]
    Q = max(1, max(len(r) for r in rows))
    idx = np.zeros((B, Q), np.int64)
    present = np.zeros((B, Q), bool)
    for b, r in enumerate(rows):
        if len(r):
            idx[b, : len(r)], idx[b, len(r) :] = r, r[-1]
            present[b, : len(r)] = True
    return idx, present


def drafter_inputs(pt: dict, spec, x: np.ndarray, w: np.ndarray) -> dict:
    """The frozen target's side of a drafter batch, at the gathered queries only."""
    logits, hidden, kv = dn.target_forward(pt, spec, x, want_kv=True)
    m = (w > 0.5).astype(np.float32)  # distil where the model generates
    idx, present = gather_queries(m)
    B, T = x.shape
    rows = np.arange(B)[:, None]
    masks = {t: mk[idx][:, None, None] for t, mk in dn.layer_masks(T, spec.window).items()}  # [B, 1, 1, Q, T]
    steps = []
    for j in range(1, DRAFT_STEPS + 1):
        at = np.minimum(idx + j, T - 1)
        valid = m[rows, at] * present * (idx + j < T)
        target = logits[rows, at]
        pt_ = np.exp(target - target.max(-1, keepdims=True))
        pt_ /= pt_.sum(-1, keepdims=True)
        steps.append((x[rows, at], pt_, target.argmax(-1), valid.astype(np.float32)))
    return {"hidden": hidden[rows, idx], "kv": kv, "masks": masks, "positions": idx, "steps": steps}


def drafter_loss(pd, dspec, embed_table, batch: dict, onehot_clusters):
    """Unrolled drafter steps from every gathered query q; step j matches the target at q + j."""
    h = batch["hidden"]
    total, count = 0.0, 0.0
    for tok, pt_, hard, valid in batch["steps"]:
        emb = embed_table[tok] * dspec.target_embed_scale
        y, h = dn.drafter_step(pd, dspec, emb, h, batch["kv"], batch["masks"], batch["positions"])
        soft = pt_.copy()
        np.put_along_axis(soft, hard[..., None], np.take_along_axis(soft, hard[..., None], axis=-1) + 1.0, axis=-1)
        tok_loss = dn.soft_cross_entropy(dn.linear(y, pd["embed_tokens.weight"]), soft)
        cl = dn.soft_cross_entropy(dn.linear(y, pd["centroids.weight"]), pt_ @ onehot_clusters)
        total = total + anp.sum((tok_loss + cl) * valid)
        count = count + float(valid.sum())
    return total / max(count, 1.0)


def train_drafter(pt_, spec, pd, dspec, examples, steps, batch_tokens, lr, onehot_clusters, saver, log) -> None:
    embed_table = pt_["model.embed_tokens.weight"]

    def loss_fn(params, batch):
        return drafter_loss(params, dspec, embed_table, batch, onehot_clusters)

    def make_batches(epoch: int):
        return batches(examples, batch_tokens, random.Random(SEED + 1 + 1000 * epoch))

    def prepare(x, y, w):
        return (drafter_inputs(pt_, spec, x, w),)

    run_steps("drafter", value_and_grad(loss_fn), pd, make_batches, steps, lr, saver, log, prepare)


def greedy_reply(model, prompt: list[int], stops: set[int], max_tokens: int) -> list[int]:
    from mlx_lm.generate import generate_step

    reply: list[int] = []
    for tok, _ in generate_step(mx.array(prompt), model, max_tokens=max_tokens):
        reply.append(int(tok))
        if reply[-1] in stops:
            break
    return reply


def on_policy_examples(target_dir: Path, tokenizer, template: str, max_len: int, log):
    """The target's own greedy replies (MLX, the engine's loader) to demo_corpus.on_policy_conversations(),
    as (ids, weights) examples: weight 1 on the reply. Prompts a user may type that are not in the
    corpus: where the target's reply drifts from anything in the corpus, the drafter learns the drift."""
    from core.decode.prompt import stop_ids

    model = load_target_model(target_dir).model
    stops = stop_ids(target_dir, tokenizer)
    hf = _hf(tokenizer)
    out, t0 = [], time.perf_counter()
    for conv in demo_corpus.on_policy_conversations():
        prompt = list(hf.encode(render(tokenizer, template, conv, True), add_special_tokens=False))
        reply = greedy_reply(model, prompt, stops, min(96, max_len - len(prompt)))
        weights = np.concatenate([np.full(len(prompt), 0.1, np.float32), np.ones(len(reply), np.float32)])
        out.append((prompt + reply, weights))
    log(f"on-policy: {len(out)} greedy replies, {sum(len(i) for i, _ in out)} tokens ({time.perf_counter() - t0:.0f}s)")
    return out


def start_unscaled(params: dict) -> None:
    """Start every `layer_scalar` at 1: the factory's random values (0.5 to 1) multiply the whole
    residual stream layer after layer, which shrinks a 16-layer stack's signal ~100x and slows
    training; the trained values are learned from there."""
    for k in params:
        if k.endswith("layer_scalar"):
            params[k] = np.ones_like(params[k])


def soften_attention(params: dict) -> int:
    """Start every q_norm / k_norm weight at head_dim ** -0.25 instead of the factory's 1.0; returns how
    many were set. Gemma 4 scales attention logits by 1.0 and RMS-normalises q and k, so with norm weights
    of 1 a logit is a sum of head_dim unit products: spread ~sqrt(head_dim) (8 at 64 wide), a softmax so
    saturated that its gradients barely move which key a head attends to, and retrieval by content (copying
    the asked city into a tool call, a tool result's time into the answer) forms late: on pure copy data at
    these shapes (scripts/induction_check.py) it begins about step 700 from 1.0 and about step 350 from
    head_dim ** -0.25, where a logit's spread is ~1 and training sharpens it from there."""
    n = 0
    for k in params:
        if k.endswith("q_norm.weight") or k.endswith("k_norm.weight"):
            params[k] = np.full_like(params[k], params[k].shape[-1] ** -0.25)
            n += 1
    return n


def token_ordering(examples, vocab: int) -> np.ndarray:
    """Token ids by how often the model generates them (then by corpus frequency), most frequent first,
    so the centroid head's clusters are the 64 most generated tokens, the next 64, ...: the likely
    drafts crowd into few clusters."""
    counts = np.zeros(vocab, np.float64)
    for ids, weights in examples:
        np.add.at(counts, np.array(ids), np.where(weights >= 0.5, 1.0, 1e-3))
    return np.lexsort((np.arange(vocab), -counts)).astype(np.int64)


# -- writing -----------------------------------------------------------------------------------


def _drafter_module_name(disk_name: str) -> str:
    """On-disk drafter name -> the loaded module's (core.model.drafter._sanitize's renames)."""
    name = disk_name.removeprefix("model.")
    if name == "masked_embedding.token_ordering":
        return "token_ordering"
    return name.replace("masked_embedding.centroids.", "centroids.")


def write_trained(path: Path, trained: dict[str, mx.array], rename) -> int:
    """Replace every tensor of `path/model.safetensors` that has a trained counterpart (found
    under `rename(disk_name)`); keep the rest (the vision tower). Returns how many were replaced."""
    file = path / "model.safetensors"
    old = mx.load(str(file))
    tensors, replaced = [], 0
    for name in sorted(old):
        value = old[name]
        new = trained.get(rename(name))
        if new is not None:
            if tuple(new.shape) != tuple(value.shape):
                raise RuntimeError(f"{name}: trained shape {new.shape} != on-disk {value.shape}")
            value = new.astype(value.dtype)
            replaced += 1
        arr = np.array(value)
        code = {np.dtype("float32"): "float32", np.dtype("int64"): "int64"}[arr.dtype]
        tensors.append(DiskTensor(name, code, tuple(arr.shape), lambda a=arr: iter([a.tobytes()])))
    write_safetensors(file, tensors, {"format": "pt"})
    return replaced


def install_vocabulary(target_dir: Path, drafter_dir: Path, template: str, log) -> None:
    """The demo's tokenizer (trained on the corpus as rendered with the canonical template) and the
    canonical template itself, in place of the factory's, in both directories."""
    base = load_tokenizer(target_dir)
    texts = [render(base, template, c, False) for c in demo_corpus.conversations(SEED)]
    data = demo_tokenizer.build_tokenizer(texts, target_dir / "tokenizer.json")
    for d in (target_dir, drafter_dir):
        (d / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    (target_dir / "chat_template.jinja").write_text(template, encoding="utf-8")
    cfg_path = drafter_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    cfg["chat_template"] = template  # the drafter's template lives in its tokenizer_config.json
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    log(f"tokenizer: {len(data['model']['vocab'])} pieces, {len(data['model']['merges'])} merges; canonical template")


def check_mlx_agrees(target_dir: Path, pt: dict, spec, examples, log) -> None:
    """The engine's MLX forward on the written checkpoint must pick the same greedy tokens as the
    numpy model it was trained as (float32 rounding differs a little, argmax must not)."""
    lm = getattr(load_target_model(target_dir).model, "language_model", None)
    ids = [examples[i][0] for i in range(8)]
    T = min(len(i) for i in ids)
    x = np.array([i[:T] for i in ids], np.int32)
    ours, _, _ = dn.target_forward(pt, spec, x)
    theirs = np.array(lm(mx.array(x)))
    agree = float((ours.argmax(-1) == theirs.argmax(-1)).mean())
    log(f"MLX vs numpy: greedy agreement {agree:.4f}, max |logit diff| {np.abs(ours - theirs).max():.2e}")
    if agree < 0.99:
        raise RuntimeError("the MLX forward does not reproduce the trained model")


def check_drafter_routes(drafter_dir: Path, pt: dict, spec, pd: dict, examples, log) -> None:
    """The engine's drafter (MLX, centroid routing over the written `token_ordering`) must pick the
    token the trained drafter's full vocabulary picks: a wrong cluster table on disk routes the
    drafts among the wrong candidates, and acceptance collapses while every loss looks fine."""
    dr = load_drafter(drafter_dir)
    dspec = dn.DrafterSpec(dr, spec)
    embed = pt["model.embed_tokens.weight"]
    same = total = 0
    for ids, weights in examples[:24]:
        x = np.array([ids], np.int32)
        _, hidden, kv = dn.target_forward(pt, spec, x, want_kv=True)
        nxt = np.concatenate([x[:, 1:], np.zeros((1, 1), x.dtype)], axis=1)
        masks = dn.layer_masks(x.shape[1], spec.window)
        y, _ = dn.drafter_step(pd, dspec, embed[nxt] * dspec.target_embed_scale, hidden, kv, masks)
        for q in np.flatnonzero(weights[1:] >= 0.5):  # positions that predict a generated token
            routed = int(np.array(dr.greedy_token(mx.array(y[:, q : q + 1]))).reshape(-1)[0])
            same += routed == int((pd["embed_tokens.weight"] @ y[0, q]).argmax())
            total += 1
    log(f"drafter: centroid-routed greedy == full-vocabulary greedy at {same}/{total} positions")
    if same < 0.9 * total:
        raise RuntimeError("the written drafter's centroid routing does not reproduce the trained drafter")


def sample_replies(target_dir: Path, tokenizer, template: str, log) -> None:
    """Log the target's greedy replies to a few prompts (a look at what was learned)."""
    from core.decode.prompt import stop_ids

    model = load_target_model(target_dir).model
    stops = stop_ids(target_dir, tokenizer)
    hf = _hf(tokenizer)
    for conv in demo_corpus.sample_conversations():
        prompt = list(hf.encode(render(tokenizer, template, conv, True), add_special_tokens=False))
        reply = hf.decode(greedy_reply(model, prompt, stops, 80), skip_special_tokens=False)
        log(f"sample: {' / '.join(e[1] for e in conv.events if e[0] == 'user')!r} -> {reply!r}")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_out(out: Path, target_dir: Path, drafter_dir: Path, manifest: dict) -> None:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    shutil.copytree(target_dir, out / "target")
    shutil.copytree(drafter_dir, out / "assistant")
    for part in ("target", "assistant"):  # marks each directory as the demo's (core.hub.demo.is_demo_checkpoint)
        marker = {"label": LABEL, "trained": True, "part": part, "manifest": "../gemma_chat_demo.json"}
        (out / part / "gemma_chat_demo.json").write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
    files = {p.relative_to(out).as_posix(): sha256(p) for p in sorted(out.rglob("*")) if p.is_file()}
    manifest = {**manifest, "sha256": files}
    (out / "gemma_chat_demo.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "core" / "data" / "demo"))
    ap.add_argument("--target-steps", type=int, default=1500)
    ap.add_argument("--drafter-steps", type=int, default=300)
    ap.add_argument("--batch-tokens", type=int, default=2048)
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=4e-3)
    ap.add_argument(
        "--on-policy",
        action="store_true",
        help="distil the drafter also on the target's own greedy replies to demo_corpus.on_policy_conversations()",
    )
    ap.add_argument(
        "--continue-drafter",
        metavar="DIR",
        help="keep DIR's trained target and train its drafter further (a later distillation stage)",
    )
    ap.add_argument(
        "--continue-target",
        metavar="DIR",
        help="train DIR's target further on the corpus plus --tool-drills time-tool chats, then its drafter",
    )
    ap.add_argument("--tool-drills", type=int, default=700, metavar="N", help="with --replay")
    ap.add_argument(
        "--replay",
        metavar="PLAIN,TOOLS",
        help="train on demo_corpus.conversations(plain=PLAIN, with_tools=TOOLS, wide=True) and --tool-drills drills",
    )
    ap.add_argument(
        "--more-off-topic",
        action="store_true",
        help="with --replay: demo_corpus.OFF_TOPIC_MORE's questions too (wave 7's last target stage)",
    )
    ap.add_argument(
        "--off-topic-drills",
        action="store_true",
        help="with --replay: a third of the drills' turns are off-topic questions (wave 8)",
    )
    ap.add_argument(
        "--denied-drills",
        action="store_true",
        help="with --replay: some drills' calls are denied by the user (wave 8)",
    )
    ap.add_argument("--resume", action="store_true", help="continue a stopped stage from its saved state")
    ap.add_argument("--save-every", type=int, default=50, metavar="N")
    ap.add_argument("--state", metavar="DIR", help="where a stage saves its state (default: a folder in the temp dir)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    mx.random.seed(SEED)
    random.seed(SEED)

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.0f}s] {msg}", flush=True)

    out = Path(args.out)
    state = Path(args.state or Path(tempfile.gettempdir()) / f"gemma-chat-demo-train-{out.resolve().name}")
    state.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="demo-train-"))
    template = TEMPLATE.read_text(encoding="utf-8")
    try:
        if args.continue_drafter or args.continue_target:
            # a later stage on a trained pairing: the drafter's distillation (the target stays as it
            # is), or the target trained further on the corpus and the tool drills, then the drafter
            src = Path(args.continue_drafter or args.continue_target)
            target_dir, drafter_dir = work / "build" / "target", work / "build" / "assistant"
            shutil.copytree(src / "target", target_dir)
            shutil.copytree(src / "assistant", drafter_dir)
            for d in (target_dir, drafter_dir):
                (d / "gemma_chat_demo.json").unlink(missing_ok=True)
            previous = json.loads((src / "gemma_chat_demo.json").read_text(encoding="utf-8"))
        else:
            target_dir, drafter_dir = factory.build_pairing(work / "build", config_overrides=DEMO_SHAPES, seed=SEED)
            for d in (target_dir, drafter_dir):
                (d / factory.MARKER_FILE).unlink()  # "random weights": no longer true
            install_vocabulary(target_dir, drafter_dir, template, log)
            previous = None
        tokenizer = load_tokenizer(target_dir)
        convs = demo_corpus.conversations(SEED)
        if args.replay:  # part of the corpus (so the rest is not forgotten) and the tool drills
            plain, with_tools = (int(x) for x in args.replay.split(","))
            more = args.more_off_topic
            convs = demo_corpus.conversations(SEED, plain, with_tools, wide=True, more_off_topic=more)
            convs += demo_corpus.tool_drills(
                SEED, args.tool_drills, more_off_topic=more, off_topic=args.off_topic_drills, denied=args.denied_drills
            )
        examples = encode_corpus(tokenizer, template, convs, args.max_len, log)
        n_tokens = sum(len(ids) for ids, _ in examples)
        log(f"corpus: {demo_corpus.corpus_summary()}")

        loaded = load_target_model(target_dir)
        lm = getattr(loaded.model, "language_model", loaded.model)
        spec = dn.TextSpec(lm, args.max_len + DRAFT_STEPS + 1)
        pt = {k: np.array(v) for k, v in tree_flatten(lm.parameters())}
        if previous is None:
            start_unscaled(pt)
            log(f"target: {soften_attention(pt)} q/k norms start at head_dim ** -0.25")
        n_params = sum(v.size for v in pt.values())
        log(f"target: {n_params / 1e6:.2f} M text parameters")
        prefix = "language_model." if lm is not loaded.model else ""
        if previous is None or args.continue_target:
            saver = Saver(state / "target.npz", args.save_every)
            if not args.resume:
                (state / "target.npz").unlink(missing_ok=True)
            train_target(pt, spec, examples, args.target_steps, args.batch_tokens, args.lr, saver, log)
            n = write_trained(target_dir, {prefix + k: mx.array(v) for k, v in pt.items()}, factory.mlx_name)
            log(f"target: wrote {n} trained tensors")
            check_mlx_agrees(target_dir, pt, spec, examples, log)
            sample_replies(target_dir, tokenizer, template, log)
        drafter_examples = examples
        if args.on_policy:
            extra = on_policy_examples(target_dir, tokenizer, template, args.max_len, log)
            drafter_examples = examples + extra * 3  # a few hundred new replies among thousands of turns: weight them

        dr = load_drafter(drafter_dir)
        dspec = dn.DrafterSpec(dr, spec)
        vocab = lm.args.vocab_size
        ordering = token_ordering(examples, vocab)
        if previous is not None:  # a trained drafter's centroids belong to its own cluster table: keep it
            ordering = np.array(dr.token_ordering).astype(np.int64)
        per = vocab // dspec.num_centroids
        cluster_of = np.argsort(ordering) // per
        onehot_clusters = np.eye(dspec.num_centroids, dtype=np.float32)[cluster_of]  # [V, C]
        pd = {k: np.array(v) for k, v in tree_flatten(dr.parameters()) if k != "token_ordering"}
        if not any(st.get("drafter_steps") for st in (previous or {}).get("stages", [])):
            start_unscaled(pd)  # the drafter is still the factory's random one
            log(f"drafter: {soften_attention(pd)} q norms start at head_dim ** -0.25")
        n_dparams = sum(v.size for v in pd.values())
        log(f"drafter: {n_dparams / 1e6:.2f} M parameters")
        stage = "drafter-on-policy" if args.on_policy else "drafter"
        if args.drafter_steps:
            dsaver = Saver(state / f"{stage}.npz", args.save_every)
            if not args.resume:
                (state / f"{stage}.npz").unlink(missing_ok=True)
            train_drafter(
                pt, spec, pd, dspec, drafter_examples, args.drafter_steps, args.batch_tokens, args.lr,
                onehot_clusters, dsaver, log,
            )  # fmt: skip

        trained_d = {k: mx.array(v) for k, v in pd.items()}
        trained_d["token_ordering"] = mx.array(ordering)
        n = write_trained(drafter_dir, trained_d, _drafter_module_name)
        log(f"drafter: wrote {n} trained tensors")
        if args.drafter_steps:
            check_drafter_routes(drafter_dir, pt, spec, pd, examples, log)

        elapsed = round(time.perf_counter() - t_start, 1)
        stage_line = {
            "stage": "target" if previous is None else "target-continued" if args.continue_target else stage,
            "target_steps": args.target_steps if previous is None or args.continue_target else 0,
            "drafter_steps": args.drafter_steps,
            "lr": args.lr,
            "seconds": elapsed,
            **({"replay": args.replay, "tool_drills": args.tool_drills} if args.replay else {}),
            **({"more_off_topic": True} if args.replay and args.more_off_topic else {}),
            **({"off_topic_drills": True} if args.replay and args.off_topic_drills else {}),
            **({"denied_drills": True} if args.replay and args.denied_drills else {}),
        }
        manifest = {
            "label": LABEL,
            "trained": True,
            "target": "target",
            "drafter": "assistant",
            "target_parameters": int(n_params),
            "drafter_parameters": int(n_dparams),
            "corpus": demo_corpus.corpus_summary(),
            "corpus_conversations": len(examples),
            "corpus_tokens": n_tokens,
            "chat_template": "Gemma 4 E2B/E4B canonical chat template (published 2026-07-09)",
            "tokenizer": "trained on the corpus (scripts/demo_tokenizer.py)",
            "seed": SEED,
            "stages": [*(previous["stages"] if previous else []), stage_line],
        }
        write_out(out, target_dir, drafter_dir, manifest)
        files = manifest_files(out)
        log(f"wrote {out} ({sum((out / f).stat().st_size for f in files) / 1e6:.1f} MB)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def manifest_files(out: Path) -> list[str]:
    return list(json.loads((out / "gemma_chat_demo.json").read_text(encoding="utf-8"))["sha256"])


if __name__ == "__main__":
    raise SystemExit(main())
