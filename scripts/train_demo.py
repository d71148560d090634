"""Train the offline demo pairing that ships in core/data/demo/.

    .venv/bin/python scripts/train_demo.py [--out core/data/demo] [--target-steps 320] [--drafter-steps 160]
    .venv/bin/python scripts/train_demo.py --continue-drafter DIR --drafter-steps N --lr L --out OUT

The shipped weights, three stages (the manifest lists them; seconds on the shared 2-core machine):
    train_demo.py --target-steps 320 --drafter-steps 160 --out A                          (2765 s)
    train_demo.py --continue-drafter A --drafter-steps 100 --lr 4e-3 --out B             (531 s)
    train_demo.py --continue-drafter B --on-policy --drafter-steps 80 --lr 3e-3 --out core/data/demo  (535 s)
The target learns the corpus by heart (loss 8.2 -> 0.014); the drafter's teacher-forced greedy agreement
with it on the corpus's replies is 91 / 96 / 96 / 95 % for draft steps 1-4. (The second stage ran with
--on-policy before ON_POLICY_PROMPTS existed; the target's replies to the corpus prompts are the corpus
text, so it added nothing and equals the command above.)

1. Writes a random-weight E-style pairing with the checkpoint factory, in the demo's shapes
   (`DEMO_SHAPES`): the real on-disk layout (HF names, config.json, tokenizer, chat template).
2. Loads it with the engine's own loaders (mlx-lm's Gemma 4 modules give the names, shapes and
   RoPE tables) and trains the target's text model on chat turns (scripts/demo_corpus.py), the
   prompt rendered exactly as the engine renders it, the loss on the reply and its end-of-turn token.
3. Freezes the target and distils the centroid-head `gemma4_assistant` drafter against it: for
   every position q the drafter starts from the target's post-norm hidden at q and the token at
   q + 1, reads the target's producer-layer K/V of [0, q] (the round's query position P - 1), and
   is unrolled `DRAFT_STEPS` steps, each matching the target's next-token distribution at q + j
   (soft + hard cross-entropy on the vocabulary, soft cross-entropy on the centroid head's clusters).
   The centroid head's `token_ordering` groups the tokens by corpus frequency.
4. Writes the trained tensors back under their on-disk names (vision tower untouched: random),
   checks that the engine's MLX forward picks the same greedy tokens as the trained model, and
   writes the manifest `gemma_chat_demo.json` with every file's sha256 (checked by `core.hub.demo`).

The arithmetic runs in numpy with autograd (scripts/demo_numpy.py): MLX's CPU matmul measured
~1 GFLOP/s here against OpenBLAS's ~20. Float32, fixed seeds (factory seed 0, data order seed 0),
one OpenBLAS thread: on one machine a rerun gives the same weights; other CPUs may differ in the
last bits.
"""

from __future__ import annotations

import os

# OpenBLAS's thread pool spins against other processes on a shared machine (40 s instead of 3 s
# for a forward here): one thread per matmul is fastest.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
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
from support import factory  # noqa: E402
from support.factory.specs import F, S  # noqa: E402
from support.factory.writer import DiskTensor, write_safetensors  # noqa: E402

from core.model.drafter import load_drafter  # noqa: E402
from core.model.loader import load_target_model  # noqa: E402

SEED = 0
DRAFT_STEPS = 4  # drafter steps unrolled in training (block size 5)
TARGET_LAYERS = 16


def _layer_types(n: int) -> list[str]:
    types = [F if i % 4 == 3 else S for i in range(n)]
    types[-1] = F
    return types


# Why these shapes: on a CPU a tiny model's decode step costs about a fixed amount per layer
# (kernel launch and Python overhead, not arithmetic), and a K-token verify costs about one
# step. The drafter always has 4 (query-only) layers, so a target of 16 layers makes a draft step
# about a quarter of a target step, and drafting pays. The width stays small so the weights ship
# in a few MB and train in minutes.
DEMO_SHAPES = {
    "text_config": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": TARGET_LAYERS,
        "layer_types": _layer_types(TARGET_LAYERS),
        "num_kv_shared_layers": 6,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "global_head_dim": 64,
        "hidden_size_per_layer_input": 8,
        "use_double_wide_mlp": True,
        "sliding_window": 512,
    },
    "drafter": {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_attention_heads": 2,
        "use_ordered_embeddings": True,
        "num_centroids": 32,
        "centroid_intermediate_top_k": 8,
    },
}


# -- data ------------------------------------------------------------------------------------


def encode_examples(tokenizer, max_len: int) -> list[tuple[list[int], int]]:
    """(token ids, index of the first reply token) per example: the prompt exactly as the engine
    renders it (core.decode.prompt, the checkpoint's chat template, no thinking), then the reply's own
    tokens and the end-of-turn token, which is how the model sees them while it generates."""
    from core.decode import prompt as prompt_mod

    end_of_turn = tokenizer.convert_tokens_to_ids("<turn|>")
    out = []
    for user, reply in demo_corpus.chat_examples(SEED):
        prompt = prompt_mod.encode_messages(tokenizer, [{"role": "user", "content": user}])
        full = prompt + tokenizer.encode(reply, add_special_tokens=False) + [end_of_turn]
        if len(full) <= max_len:
            out.append((full, len(prompt)))
    return out


def batches(examples, batch_tokens: int, rng: random.Random):
    """Length-bucketed batches (inputs [B, T], targets [B, T], loss mask [B, T]) in a shuffled order."""
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
        m = np.zeros((len(g), T), np.float32)
        for r, i in enumerate(g):
            ids, start = examples[i]
            n = len(ids) - 1
            x[r, :n] = ids[:-1]
            y[r, :n] = ids[1:]
            m[r, start - 1 : n] = 1.0  # predict every reply token and the closing <turn|>
            m[r, : start - 1] = 0.1  # and the prompt a little, so odd prompts stay in distribution
        yield x, y, m


def cosine_lr(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


# -- target ----------------------------------------------------------------------------------


def train_target(p: dict, spec, examples, steps: int, batch_tokens: int, lr: float, log) -> None:
    def loss_fn(params, x, y, m):
        logits, _, _ = dn.target_forward(params, spec, x)
        onehot = np.eye(logits.shape[-1], dtype=np.float32)[y]
        ce = dn.logsumexp(logits, axis=-1) - anp.sum(logits * onehot, axis=-1)
        return anp.sum(ce * m) / np.sum(m)

    grad_fn = value_and_grad(loss_fn)
    opt = dn.Adam(p)
    rng = random.Random(SEED)
    step, t0 = 0, time.perf_counter()
    while step < steps:
        for x, y, m in batches(examples, batch_tokens, rng):
            loss, grads = grad_fn(p, x, y, m)
            opt.update(p, grads, cosine_lr(step, steps, lr, 5))
            step += 1
            if step % 10 == 0 or step == steps or step <= 2:
                log(f"target step {step}/{steps} loss {float(loss):.3f} ({time.perf_counter() - t0:.0f}s)")
            if step >= steps:
                break


# -- drafter ---------------------------------------------------------------------------------


def drafter_loss(pd, dspec, embed_table, hidden, logits, kv, x, m, onehot_clusters):
    """Unrolled drafter steps from every query position q; step j matches the target at q + j."""
    B, T, _ = hidden.shape
    mask = dn.causal_mask(T)
    h = hidden
    total, count = 0.0, 0.0
    for j in range(1, DRAFT_STEPS + 1):
        if j >= T:
            break
        tok = np.concatenate([x[:, j:], np.zeros((B, j), x.dtype)], axis=1)  # the token at q + j
        emb = embed_table[tok] * dspec.target_embed_scale
        y, h = dn.drafter_step(pd, dspec, emb, h, kv, mask)
        target = np.concatenate([logits[:, j:], np.zeros((B, j, logits.shape[-1]), np.float32)], axis=1)
        valid = np.concatenate([m[:, j:], np.zeros((B, j), np.float32)], axis=1)
        pt = np.exp(target - target.max(-1, keepdims=True))
        pt /= pt.sum(-1, keepdims=True)
        hard = np.eye(pt.shape[-1], dtype=np.float32)[target.argmax(-1)]
        out = dn.log_softmax(dn.linear(y, pd["embed_tokens.weight"]))
        tok_loss = -anp.sum((pt + hard) * out, axis=-1)
        cl = -anp.sum((pt @ onehot_clusters) * dn.log_softmax(dn.linear(y, pd["centroids.weight"])), axis=-1)
        total = total + anp.sum((tok_loss + cl) * valid)
        count = count + float(valid.sum())
    return total / max(count, 1.0)


def train_drafter(pt_, spec, pd, dspec, examples, steps, batch_tokens, lr, onehot_clusters, log) -> None:
    embed_table = pt_["model.embed_tokens.weight"]

    def loss_fn(params, hidden, logits, kv, x, m):
        return drafter_loss(params, dspec, embed_table, hidden, logits, kv, x, m, onehot_clusters)

    grad_fn = value_and_grad(loss_fn)
    opt = dn.Adam(pd)
    rng = random.Random(SEED + 1)
    step, t0 = 0, time.perf_counter()
    while step < steps:
        for x, _, m in batches(examples, batch_tokens, rng):
            logits, hidden, kv = dn.target_forward(pt_, spec, x, want_kv=True)
            m = (m > 0.5).astype(np.float32)  # distil on reply positions only
            loss, grads = grad_fn(pd, hidden, logits, kv, x, m)
            opt.update(pd, grads, cosine_lr(step, steps, lr, 5))
            step += 1
            if step % 10 == 0 or step == steps or step <= 2:
                log(f"drafter step {step}/{steps} loss {float(loss):.3f} ({time.perf_counter() - t0:.0f}s)")
            if step >= steps:
                break


def on_policy_examples(target_dir: Path, tokenizer, examples, max_len: int, log) -> list[tuple[list[int], int]]:
    """The target's own greedy replies to every corpus prompt and to `demo_corpus.ON_POLICY_PROMPTS`
    (MLX, the engine's loader), as (ids, reply start) examples. The drafter is measured on what the
    target says, not on the corpus: where the target's reply drifts from the corpus text, these
    positions teach the drafter the drift."""
    from mlx_lm.generate import generate_step

    from core.decode import prompt as prompt_mod

    model = load_target_model(target_dir).model
    stops = {tokenizer.convert_tokens_to_ids("<turn|>"), tokenizer.eos_token_id}
    extra = [
        prompt_mod.encode_messages(tokenizer, [{"role": "user", "content": q}]) for q in demo_corpus.ON_POLICY_PROMPTS
    ]
    prompts = sorted({tuple(ids[:start]) for ids, start in examples} | {tuple(p) for p in extra})
    out, t0 = [], time.perf_counter()
    for prompt in prompts:
        reply: list[int] = []
        for tok, _ in generate_step(mx.array(prompt), model, max_tokens=max_len - len(prompt) - 1):
            reply.append(int(tok))
            if reply[-1] in stops:
                break
        out.append((list(prompt) + reply, len(prompt)))
    log(
        f"on-policy: {len(out)} greedy replies of the target, {sum(len(i) for i, _ in out)} tokens "
        f"({time.perf_counter() - t0:.0f}s)"
    )
    return out


def start_unscaled(params: dict) -> None:
    """Start every `layer_scalar` at 1: the factory's random values (0.5 to 1) multiply the whole
    residual stream layer after layer, which shrinks a 16-layer stack's signal ~100x and slows
    training; the trained values are learned from there."""
    for k in params:
        if k.endswith("layer_scalar"):
            params[k] = np.ones_like(params[k])


def token_ordering(examples, vocab: int) -> np.ndarray:
    """Token ids by corpus frequency (most frequent first), so the centroid head's clusters are
    the 64 most frequent tokens, the next 64, ...: the likely tokens crowd into few clusters."""
    counts = np.zeros(vocab, np.int64)
    for ids, _ in examples:
        np.add.at(counts, np.array(ids), 1)
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
    for ids, start in examples[:24]:
        x = np.array([ids], np.int32)
        _, hidden, kv = dn.target_forward(pt, spec, x, want_kv=True)
        nxt = np.concatenate([x[:, 1:], np.zeros((1, 1), x.dtype)], axis=1)
        y, _ = dn.drafter_step(pd, dspec, embed[nxt] * dspec.target_embed_scale, hidden, kv, dn.causal_mask(x.shape[1]))
        for q in range(start - 1, x.shape[1] - 1):
            routed = int(np.array(dr.greedy_token(mx.array(y[:, q : q + 1]))).reshape(-1)[0])
            same += routed == int((pd["embed_tokens.weight"] @ y[0, q]).argmax())
            total += 1
    log(f"drafter: centroid-routed greedy == full-vocabulary greedy at {same}/{total} positions")
    if same < 0.9 * total:
        raise RuntimeError("the written drafter's centroid routing does not reproduce the trained drafter")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "core" / "data" / "demo"))
    ap.add_argument("--target-steps", type=int, default=320)
    ap.add_argument("--drafter-steps", type=int, default=160)
    ap.add_argument("--batch-tokens", type=int, default=2048)
    ap.add_argument("--max-len", type=int, default=128)
    ap.add_argument("--lr", type=float, default=8e-3)
    ap.add_argument(
        "--on-policy",
        action="store_true",
        help="distil the drafter also on the target's own greedy replies to the corpus prompts and "
        "to demo_corpus.ON_POLICY_PROMPTS",
    )
    ap.add_argument(
        "--continue-drafter",
        metavar="DIR",
        help="keep DIR's trained target and train its drafter further (a second distillation stage)",
    )
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    mx.random.seed(SEED)
    random.seed(SEED)

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.0f}s] {msg}", flush=True)

    out = Path(args.out)
    work = Path(tempfile.mkdtemp(prefix="demo-train-"))
    try:
        if args.continue_drafter:
            # a second distillation stage on a trained pairing: the target stays as it is
            src = Path(args.continue_drafter)
            target_dir, drafter_dir = work / "build" / "target", work / "build" / "assistant"
            shutil.copytree(src / "target", target_dir)
            shutil.copytree(src / "assistant", drafter_dir)
            previous = json.loads((src / "gemma_chat_demo.json").read_text(encoding="utf-8"))
        else:
            target_dir, drafter_dir = factory.build_pairing(work / "build", config_overrides=DEMO_SHAPES, seed=SEED)
            for d in (target_dir, drafter_dir):
                (d / factory.MARKER_FILE).unlink()  # "random weights": no longer true
            previous = None
        from core.model.loader import load_tokenizer

        tokenizer = load_tokenizer(target_dir)
        examples = encode_examples(tokenizer, args.max_len)
        n_tokens = sum(len(ids) for ids, _ in examples)
        log(f"corpus: {len(examples)} turns, {n_tokens} tokens; {demo_corpus.corpus_summary()}")

        loaded = load_target_model(target_dir)
        lm = getattr(loaded.model, "language_model", loaded.model)
        spec = dn.TextSpec(lm, args.max_len + DRAFT_STEPS + 1)
        pt = {k: np.array(v) for k, v in tree_flatten(lm.parameters())}
        if previous is None:
            start_unscaled(pt)
        n_params = sum(v.size for v in pt.values())
        log(f"target: {n_params / 1e6:.2f} M text parameters")
        prefix = "language_model." if lm is not loaded.model else ""
        if previous is None:
            train_target(pt, spec, examples, args.target_steps, args.batch_tokens, args.lr, log)
            n = write_trained(target_dir, {prefix + k: mx.array(v) for k, v in pt.items()}, factory.mlx_name)
            log(f"target: wrote {n} trained tensors")
        drafter_examples = examples
        if args.on_policy:
            seen = {tuple(ids) for ids, _ in examples}
            extra = [
                e
                for e in on_policy_examples(target_dir, tokenizer, examples, args.max_len, log)
                if tuple(e[0]) not in seen
            ]
            log(f"on-policy: {len(extra)} replies differ from the corpus text")
            drafter_examples = examples + extra * 3  # a few new replies among 238 corpus turns: weight them

        dr = load_drafter(drafter_dir)
        dspec = dn.DrafterSpec(dr, spec)
        vocab = lm.args.vocab_size
        ordering = token_ordering(examples, vocab)
        per = vocab // dspec.num_centroids
        cluster_of = np.argsort(ordering) // per
        onehot_clusters = np.eye(dspec.num_centroids, dtype=np.float32)[cluster_of]  # [V, C]
        pd = {k: np.array(v) for k, v in tree_flatten(dr.parameters()) if k != "token_ordering"}
        if previous is None:
            start_unscaled(pd)
        n_dparams = sum(v.size for v in pd.values())
        log(f"drafter: {n_dparams / 1e6:.2f} M parameters")
        train_drafter(
            pt, spec, pd, dspec, drafter_examples, args.drafter_steps, args.batch_tokens, args.lr, onehot_clusters, log
        )

        trained_d = {k: mx.array(v) for k, v in pd.items()}
        trained_d["token_ordering"] = mx.array(ordering)
        n = write_trained(drafter_dir, trained_d, _drafter_module_name)
        log(f"drafter: wrote {n} trained tensors")
        check_mlx_agrees(target_dir, pt, spec, examples, log)
        check_drafter_routes(drafter_dir, pt, spec, pd, examples, log)

        elapsed = time.perf_counter() - t_start
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        shutil.copytree(target_dir, out / "target")
        shutil.copytree(drafter_dir, out / "assistant")
        label = "demo: tiny model trained on gemma-chat's notes and Python docstrings"
        for part in ("target", "assistant"):  # marks each directory as the demo's (core.hub.demo.is_demo_checkpoint)
            marker = {"label": label, "trained": True, "part": part, "manifest": "../gemma_chat_demo.json"}
            (out / part / "gemma_chat_demo.json").write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        files = {p.relative_to(out).as_posix(): sha256(p) for p in sorted(out.rglob("*")) if p.is_file()}
        manifest = {
            "label": label,
            "trained": True,
            "target": "target",
            "drafter": "assistant",
            "target_parameters": int(n_params),
            "drafter_parameters": int(n_dparams),
            "corpus": demo_corpus.corpus_summary(),
            "corpus_tokens": n_tokens,
            "target_steps": previous["target_steps"] if previous else args.target_steps,
            "drafter_steps": [*(previous["drafter_steps"] if previous else []), args.drafter_steps],
            "seed": SEED,
            "train_seconds": [*(previous["train_seconds"] if previous else []), round(elapsed, 1)],
            "sha256": files,
        }
        (out / "gemma_chat_demo.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        log(f"wrote {out} ({sum((out / f).stat().st_size for f in files) / 1e6:.1f} MB)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
