"""Seconds per GRPO step on CPU: TRL's fused LM head over every position vs completions only.

    python3 bench/bench_grpo_step.py [--steps 4] [--pivots-per-step 4] [--generations 8] [--repeats 2]
    python3 bench/bench_grpo_step.py --model runs/testbed/base   # a trained base: realistic completions

Builds the testbed's tiny model (random init, nothing downloaded; it writes `--max-completion-length`
tokens every time) or loads `--model`, and one-turn pivots with the toolshop world's system prompt
and tool schemas (~350-400-token prompts, as in the demo), then
alternates, in one process: (a) TRL 1.16 as shipped, which on CPU projects every prompt and
completion position through the LM head; (b) `score_only_completions_on_cpu()`, which projects
only the completion positions. Same seed, same completions, same losses. Prints s/step of each
per repeat and the median ratio (a)/(b).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")


def make_pivots(path: Path, n: int) -> None:
    from pivotrl.experiment.testbed.toolshop import SYSTEM_PROMPT, TOOLS

    with path.open("w") as fh:
        for i in range(n):
            ctx = [{"role": "system", "content": SYSTEM_PROMPT},
                   {"role": "user", "content": f"Hi, I am ann{i}@shop.io. Please cancel my pending order."}]
            fh.write(json.dumps({
                "id": f"b{i}/1", "trajectory_id": f"b{i}", "turn": 1, "domain": "toolshop",
                "tools": TOOLS, "context": ctx,
                "expected": {"role": "assistant", "tool_calls": [{"id": "c0", "type": "function", "function": {
                    "name": "find_customer", "arguments": json.dumps({"email": f"ann{i}@shop.io"})}}]},
            }) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--pivots-per-step", type=int, default=4)
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--max-completion-length", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--model", type=Path, default=None, help="a trained testbed base (default: random init)")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    from pivotrl.experiment.testbed.tiny import build_model, build_tokenizer, save_tiny
    from pivotrl.train.config import GRPORunConfig
    from pivotrl.train.grpo import build_trainer, load_pivot_set
    from pivotrl.train.rewards import score_only_completions_on_cpu

    from pivotrl.chat import prompt_text
    from pivotrl.records import Turn, iter_valid

    tmp = Path(tempfile.mkdtemp(prefix="bench_grpo_"))
    make_pivots(tmp / "pivots.jsonl", args.steps * args.pivots_per_step)
    # As the testbed build does: BPE trained on the rendered prompts, so they are ~400 tokens.
    seed_tok = build_tokenizer([], vocab_size=300)
    texts = [prompt_text(seed_tok, t.context, t.tools) for t in iter_valid(tmp / "pivots.jsonl", Turn)]
    if args.model:
        from transformers import AutoTokenizer

        model_dir, tokenizer = args.model, AutoTokenizer.from_pretrained(args.model)
        texts = [prompt_text(tokenizer, t.context, t.tools) for t in iter_valid(tmp / "pivots.jsonl", Turn)]
    else:
        tokenizer = build_tokenizer(texts * 4)
        model_dir = save_tiny(build_model(tokenizer), tokenizer, tmp / "model")

    def length_reward(completions, **_):  # any cheap reward with spread: this bench times the step
        return [float(len(c) % 3 == 0) for c in completions]

    def seconds_per_step(compact: bool) -> float:
        cfg = GRPORunConfig(model=str(model_dir), pivots=tmp / "pivots.jsonl", output_dir=tmp / "run",
                            num_generations=args.generations,
                            per_device_train_batch_size=args.generations * args.pivots_per_step,
                            max_completion_length=args.max_completion_length, learning_rate=1e-4,
                            max_steps=args.steps, save_steps=10_000, precision="fp32", seed=0)
        trainer = build_trainer(cfg, load_pivot_set(cfg), reward_funcs=[length_reward])
        score_only_completions_on_cpu(compact)  # after build_trainer, which turns it on
        t0 = time.perf_counter()
        trainer.train()
        return (time.perf_counter() - t0) / args.steps

    ratios = []
    prompt_tokens = len(tokenizer(texts[0])["input_ids"])
    print(f"~{prompt_tokens} prompt tokens, {args.pivots_per_step} pivots × G={args.generations} per step, "
          f"{args.steps} steps, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}")
    for r in range(args.repeats):
        full = seconds_per_step(False)
        compact = seconds_per_step(True)
        ratios.append(full / compact)
        print(f"repeat {r}: all positions {full:.2f} s/step, completions only {compact:.2f} s/step, "
              f"speed-up {full / compact:.2f}×", flush=True)
    print(f"median speed-up {statistics.median(ratios):.2f}×")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
