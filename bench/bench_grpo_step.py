"""GRPO on CPU: TRL's repeated-prompt log-prob path vs the shared-prefix path, side by side.

    python3 bench/bench_grpo_step.py [--pivots-per-step 4] [--generations 8] [--repeats 5] [--steps 3]
    python3 bench/bench_grpo_step.py --model runs/testbed/base   # the default when that folder exists
    python3 bench/bench_grpo_step.py --arch qwen3_5,nemotron_h   # hybrids too; checkpointing off and on
    python3 bench/bench_grpo_step.py --prompt-tokens 8192        # long contexts: earlier tool results

Pivots are shaped like the demo's: the toolshop world's system prompt and tool schemas (~400-token
prompts, lengths mixed by the user's message), G completions each. The model is `--model`, else
runs/testbed/base, else the testbed's tiny Llama shape at random init (hidden 128, 2 layers,
4 heads; nothing downloaded).

Two measurements, each alternating the arms inside one process so a shared CPU slows them alike:

1. loss: one micro-batch's GRPO loss forward + backward (`trainer.compute_loss(...).backward()`)
   on identical inputs, completions 12-60 tokens long (uniform, right-padded): (a) TRL 1.16 as
   shipped, which on CPU projects every position through the LM head, (b) TRL's path with
   completion-only LM head (`shared_prefix_loss: false`), (c) the shared-prefix path (default).
   This is the part the shared prefix changes; the token-work bound is (P+C)/(P/G+C).
2. step: whole `trainer.train()` optimizer steps (generation included) for (b), (c), and (c) with
   the rollouts drawn by pivotrl's generation loop (`shared_rollouts`: one prefill per prompt for
   its G samples, instead of TRL's generate over G copies); the random model always writes
   `--max-completion-length` tokens.

`--prompt-tokens N` puts a realistic long prefix in every pivot's context: earlier order look-ups
and the JSON they returned (bench/long_context.py), until the prompt has N tokens; the random
model then has room for N + the completion. Every arm reports its peak memory beside the times
(bench/peak_memory.py: the most held above the arm's start; GPU: CUDA allocated, CPU: sampled RSS).

Each is measured for every model (the base, then each `--arch`: e.g. `--arch qwen3_5,nemotron_h`
for a linear-attention and a Mamba-2 hybrid at the testbed's width) with gradient checkpointing
off and on (`--checkpointing`), and a last table puts loss and whole step side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
from long_context import history_pair, lengthen  # noqa: E402  (bench/, the script's folder)
from peak_memory import PeakMemory  # noqa: E402

TESTBED_BASE = Path("runs/testbed/base")


def make_pivots(path: Path, n: int, seed: int = 0) -> None:
    from pivotrl_testbed.testbed.toolshop import SYSTEM_PROMPT, TOOLS

    rng = random.Random(seed)
    asks = ["Please cancel my pending order.", "Where is my last order? It has been a week.",
            "I would like to return the lamp I got, it arrived broken and the box was open.",
            "Can you change the address of my pending order to 12 Elm Street, Springfield, please?"]
    with path.open("w") as fh:
        for i in range(n):
            ctx = [{"role": "system", "content": SYSTEM_PROMPT},
                   {"role": "user", "content": f"Hi, I am ann{i}@shop.io. {rng.choice(asks)}"}]
            fh.write(json.dumps({
                "id": f"b{i}/1", "trajectory_id": f"b{i}", "turn": 1, "domain": "toolshop",
                "tools": TOOLS, "context": ctx,
                "expected": {"role": "assistant", "tool_calls": [{"id": "c0", "type": "function", "function": {
                    "name": "find_customer", "arguments": json.dumps({"email": f"ann{i}@shop.io"})}}]},
            }) + "\n")


def lengthen_pivots(path: Path, turns, tokenizer, n_tokens: int):
    """Rewrite the pivots of `path` with contexts of at least `n_tokens` prompt tokens."""
    from pivotrl.formats.chat import prompt_text
    from pivotrl.io.records import Message, Turn, iter_valid, write_atomic

    def count(context, tools) -> int:
        messages = [Message.model_validate(m) for m in context]
        return len(tokenizer(prompt_text(tokenizer, messages, tools), add_special_tokens=False)["input_ids"])

    long = [t.model_copy(update={"context": [Message.model_validate(m) for m in lengthen(
        [m.model_dump(exclude_none=True) for m in t.context], t.tools, n_tokens, count, seed=i)]})
            for i, t in enumerate(turns)]
    write_atomic(path, long)
    return list(iter_valid(path, Turn))


def loss_inputs(tokenizer, prompts: list[str], generations: int, lengths: tuple[int, int], seed: int):
    """One micro-batch as TRL hands it to compute_loss: G rows per prompt, shuffled; left-padded
    prompts, right-padded completions of random tokens and random lengths."""
    import torch

    rng = random.Random(seed)
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    rows = [(p, [rng.randrange(3, len(tokenizer)) for _ in range(rng.randint(*lengths))])
            for p in prompt_ids for _ in range(generations)]
    rng.shuffle(rows)
    n_p, n_c = max(len(p) for p, _ in rows), max(len(c) for _, c in rows)
    pad = tokenizer.pad_token_id
    out = {k: torch.full((len(rows), n), pad if k.endswith("ids") else 0, dtype=torch.long)
           for k, n in (("prompt_ids", n_p), ("prompt_mask", n_p), ("completion_ids", n_c), ("completion_mask", n_c))}
    for i, (p, c) in enumerate(rows):
        out["prompt_ids"][i, n_p - len(p):] = torch.tensor(p)
        out["prompt_mask"][i, n_p - len(p):] = 1
        out["completion_ids"][i, :len(c)] = torch.tensor(c)
        out["completion_mask"][i, :len(c)] = 1
    out["advantages"] = torch.randn(len(rows), generator=torch.Generator().manual_seed(seed))
    out["old_per_token_logps"] = None
    out["num_items_in_batch"] = out["completion_mask"].sum().float()
    return out


def time_loss(trainer, inputs, arm: str) -> tuple[float, float]:
    """(seconds, peak MiB) of one loss forward + backward on `arm`."""
    from pivotrl.train.trainer import score_only_completions_on_cpu

    score_only_completions_on_cpu(arm != "all positions")
    trainer.shared_prefix = arm == "shared prefix"
    model = trainer.model.train()
    with PeakMemory() as mem:
        t0 = time.perf_counter()
        trainer.compute_loss(model, inputs).backward()
        seconds = time.perf_counter() - t0
    model.zero_grad(set_to_none=True)
    score_only_completions_on_cpu(True)
    return seconds, mem.peak_mib


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pivots-per-step", type=int, default=4)
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--min-completion", type=int, default=12)
    ap.add_argument("--max-completion", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=5, help="loss timings per arm (alternating)")
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps per arm in the step timing (0: skip)")
    ap.add_argument("--max-completion-length", type=int, default=32, help="generation length, step timing")
    ap.add_argument("--model", type=Path, default=None, help="a trained base (default: runs/testbed/base "
                                                             "if it exists, else random init)")
    ap.add_argument("--arch", default="", help="comma-separated tiny architectures to time as well "
                    "(pivotrl_testbed.testbed.architectures, e.g. qwen3_5,nemotron_h), random init at "
                    "the testbed's width (128), the same tokenizer and pivots")
    ap.add_argument("--prompt-tokens", type=int, default=0, help="lengthen every pivot's prompt to at least "
                    "N tokens with earlier tool calls and results (0: the toolshop prompts, ~400 tokens)")
    ap.add_argument("--checkpointing", choices=("off", "on", "both"), default="both",
                    help="gradient checkpointing in every measurement: off, on, or each model both ways")
    args = ap.parse_args()

    import torch
    from transformers import AutoTokenizer, PrinterCallback

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    from pivotrl_testbed.testbed.architectures import save_tiny_arch
    from pivotrl_testbed.testbed.tiny import TinyModelConfig, build_model, build_tokenizer, save_tiny
    from pivotrl.formats.chat import prompt_text
    from pivotrl.io.records import Message, Turn, iter_valid
    from pivotrl.train.config import GRPORunConfig
    from pivotrl.train.grpo import build_trainer, load_pivot_set

    tmp = Path(tempfile.mkdtemp(prefix="bench_grpo_"))
    n_pivots = max(args.steps, 1) * args.pivots_per_step
    make_pivots(tmp / "pivots.jsonl", n_pivots)
    turns = list(iter_valid(tmp / "pivots.jsonl", Turn))
    model_dir = args.model or (TESTBED_BASE if TESTBED_BASE.is_dir() else None)
    if model_dir is not None:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    else:  # as the testbed build does: BPE trained on the rendered prompts, so they are ~400 tokens
        seed_tok = build_tokenizer([], vocab_size=300)
        corpus = [prompt_text(seed_tok, t.context, t.tools) for t in turns] * 4
        if args.prompt_tokens:  # the tool results of a long prefix are in the tokenizer's text too
            rng = random.Random(0)
            earlier = [Message.model_validate(m) for i in range(30) for m in history_pair(i, rng)]
            corpus += [prompt_text(seed_tok, [*t.context[:2], *earlier], t.tools) for t in turns[:4]]
        tokenizer = build_tokenizer(corpus)
        room = TinyModelConfig(max_positions=max(2048, args.prompt_tokens + args.max_completion + 2048))
        tokenizer.model_max_length = room.max_positions  # the context pivotrl reads off both
        model_dir = save_tiny(build_model(tokenizer, room), tokenizer, tmp / "model")
    if args.prompt_tokens:
        turns = lengthen_pivots(tmp / "pivots.jsonl", turns, tokenizer, args.prompt_tokens)
    models = {"base": model_dir}
    for name in filter(None, (a.strip() for a in args.arch.split(","))):
        models[name] = save_tiny_arch(name, tokenizer, tmp / name, width=128)
    texts = [prompt_text(tokenizer, t.context, t.tools) for t in turns]
    checkpointing = {"off": [False], "on": [True], "both": [False, True]}[args.checkpointing]

    def reward(completions, **_):  # any cheap reward with spread: this bench times the step
        return [float(len(c) % 3 == 0) for c in completions]

    def trainer_for(path: Path, shared: bool, steps: int, ckpt: bool):
        cfg = GRPORunConfig(model=str(path), pivots=tmp / "pivots.jsonl", output_dir=tmp / f"run{shared}",
                            num_generations=args.generations,
                            per_device_train_batch_size=args.generations * args.pivots_per_step,
                            max_completion_length=args.max_completion_length, learning_rate=1e-4,
                            max_steps=steps, save_steps=10_000, precision="fp32", seed=0, shared_prefix_loss=shared,
                            gradient_checkpointing=ckpt)
        trainer = build_trainer(cfg, load_pivot_set(cfg), reward_funcs=[reward], tokenizer=tokenizer)
        trainer.remove_callback(PrinterCallback)  # keep the bench's own lines readable
        return trainer

    lengths = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    print(f"models {', '.join(f'{k}={v}' for k, v in models.items())}; prompts {min(lengths)}-{max(lengths)} "
          f"tokens, {args.pivots_per_step} pivots × G={args.generations} per micro-batch, "
          f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}")

    summary = []
    for label, path in models.items():
        for ckpt in checkpointing:
            loss = time_losses(args, trainer_for, path, tokenizer, texts, ckpt, label)
            step = time_steps(args, trainer_for, path, ckpt) if args.steps else None
            summary.append((label, ckpt, loss, step))
    print(f"\nside by side (speed-up = TRL path time / shared-prefix time; peak MiB above each arm's start), "
          f"prompts {min(lengths)}-{max(lengths)} tokens:")
    print(f"  {'model':<12} {'checkpointing':<14} {'loss TRL / shared':<22} {'loss ×':>7} {'loss MiB':>13}   "
          f"{'whole step TRL / shared loss / + rollouts':<42} {'step ×':>15} {'step MiB':>20}")
    for label, ckpt, (trl, shared, ratio, trl_mib, shared_mib), step in summary:
        step_text = "-" if step is None else f"{step[0]:.2f} / {step[1]:.2f} / {step[2]:.2f} s"
        step_ratio = "-" if step is None else f"{step[0] / step[1]:.2f}× / {step[0] / step[2]:.2f}×"
        step_mib = "-" if step is None else f"{step[3]:.0f} / {step[4]:.0f} / {step[5]:.0f}"
        print(f"  {label:<12} {'on' if ckpt else 'off':<14} {f'{trl:.3f} / {shared:.3f} s':<22} "
              f"{ratio:>6.2f}× {f'{trl_mib:.0f} / {shared_mib:.0f}':>13}   {step_text:<42} {step_ratio:>15} "
              f"{step_mib:>20}")
    return 0


def time_losses(args, trainer_for, path, tokenizer, texts, ckpt: bool, label: str):
    """Loss forward+backward on identical micro-batches, the arms alternating; returns (TRL path
    median, shared-prefix median, median of the paired ratios)."""
    trainer = trainer_for(path, True, 1, ckpt)
    trainer.current_gradient_accumulation_steps = 1  # Trainer.train() sets it
    if ckpt:  # as Trainer.train() turns it on
        trainer.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs)
    # TRL as shipped (every position through the LM head) only where it has always been measured.
    arms = ("all positions", "TRL path", "shared prefix") if label == "base" and not ckpt else ("TRL path", "shared prefix")
    seconds = {arm: [] for arm in arms}
    peak = {arm: 0.0 for arm in arms}
    for r in range(args.repeats + 1):  # repeat 0 warms up every arm and is not counted
        inputs = loss_inputs(tokenizer, texts[:args.pivots_per_step], args.generations,
                             (args.min_completion, args.max_completion), seed=r)
        for arm in arms:
            s, mib = time_loss(trainer, inputs, arm)
            peak[arm] = max(peak[arm], mib)
            if r:
                seconds[arm].append(s)
    p = inputs["prompt_mask"].sum(1).float().mean().item()
    c = inputs["completion_mask"].sum(1).float().mean().item()
    print(f"\n[{label}, checkpointing {'on' if ckpt else 'off'}] loss forward+backward per micro-batch "
          f"(median of {args.repeats}); mean prompt {p:.0f}, completion {c:.0f} tokens; token-work bound "
          f"{(p + c) / (p / args.generations + c):.2f}×")
    med = {arm: statistics.median(v) for arm, v in seconds.items()}
    ratios = {}
    for arm in arms:
        # Paired per repeat (the arms ran back to back), so a load change between repeats cancels.
        ratios[arm] = [a / b for a, b in zip(seconds[arm], seconds["shared prefix"])]
        print(f"  {arm:<14} {med[arm]:.3f} s, peak {peak[arm]:.0f} MiB   speed-up of shared prefix: median "
              f"{statistics.median(ratios[arm]):.2f}× (repeats {min(ratios[arm]):.2f}-{max(ratios[arm]):.2f}×)")
    return (med["TRL path"], med["shared prefix"], statistics.median(ratios["TRL path"]),
            peak["TRL path"], peak["shared prefix"])


def time_steps(args, trainer_for, path, ckpt: bool):
    """Whole optimizer steps (generation included), the arms interleaved twice: TRL's path, the
    shared-prefix loss, and the shared-prefix loss with rollouts from pivotrl's generation loop
    (one prefill per prompt: `PivotGRPOTrainer.shared_rollouts`). Returns mean seconds per step."""
    arms = ("TRL path", "shared loss", "shared loss + rollouts")
    step, grad_norms, peak = {arm: [] for arm in arms}, {}, {arm: 0.0 for arm in arms}
    for arm in arms + arms:
        t = trainer_for(path, arm != "TRL path", args.steps, ckpt)
        t.shared_rollouts = arm == "shared loss + rollouts"
        with PeakMemory() as mem:
            t0 = time.perf_counter()
            t.train()
            step[arm].append((time.perf_counter() - t0) / args.steps)
        peak[arm] = max(peak[arm], mem.peak_mib)
        grad_norms[arm] = [round(e["grad_norm"], 5) for e in t.state.log_history if "grad_norm" in e]
        del t  # the next arm's peak starts without this trainer's model and optimizer
    mean = {arm: statistics.mean(v) for arm, v in step.items()}
    print(f"  whole optimizer step incl. generation of {args.max_completion_length} tokens (mean of "
          f"2×{args.steps} steps): " + ", ".join(f"{arm} {mean[arm]:.2f} s/step (peak {peak[arm]:.0f} MiB)"
                                                 for arm in arms))
    print(f"  grad norms (the first two arms: same seed, same rollouts): "
          + "; ".join(f"{arm} {grad_norms[arm]}" for arm in arms))
    return tuple(mean[arm] for arm in arms) + tuple(peak[arm] for arm in arms)


if __name__ == "__main__":
    raise SystemExit(main())
