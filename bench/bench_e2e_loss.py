"""E2E RL's loss: one forward + backward per model turn vs one per episode (`pack_turns`), side by side.

    python3 bench/bench_e2e_loss.py [--testbed runs/testbed] [--world toolshop] [--tasks 4] [--repeats 3]

Episodes are real: the testbed's base plays `--tasks` train tasks × G episodes in `--world` with
E2E RL's own recording policy (the demo's settings: G = 8, 64 tokens per turn, 8 turns), so the
turns and their prompts are what a training step sees. Both arms then compute the clipped policy
loss of every generated token (advantage 1) and its gradient on the same weights, alternating
inside one process so a shared CPU slows them alike: (a) one sequence per turn (prompt +
completion: the earlier turns are re-read by every later one), (b) one sequence per episode
whose prompts replay the earlier turns token for token, each turn a span of it. Both arms'
log-probs are compared (they must agree) and the token counts printed: the work bound is their
ratio. Needs a built testbed (`pivotrl testbed build --out DIR`; built here when missing).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--testbed", type=Path, default=Path("runs/testbed"))
    ap.add_argument("--world", default="toolshop")
    ap.add_argument("--tasks", type=int, default=4, help="tasks per step (the demo's E2E: 4)")
    ap.add_argument("--generations", type=int, default=8, help="G episodes per task (the demo's: 8)")
    ap.add_argument("--micro-batch", type=int, default=16, help="sequences per forward pass")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pivotrl_testbed.e2e import RecordingPolicy, pack_turns
    from pivotrl_testbed.episodes import run_episodes
    from pivotrl_testbed.testbed.build import build_testbed, is_built, load_testbed_config
    from pivotrl_testbed.testbed.tasks import make_tasks
    from pivotrl.sampling.generate import completion_logps, span_logps

    torch.set_num_threads(1)
    if not is_built(args.testbed, load_testbed_config(None)):
        print(f"building the testbed in {args.testbed} (once)")
        build_testbed(args.testbed)
    base = args.testbed / "base"
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    policy = RecordingPolicy(model, tokenizer, max_new_tokens=64, temperature=1.0, seed=0)
    tasks = make_tasks(args.world, "train", args.tasks)
    with torch.no_grad():
        run_episodes(args.world, [t for t in tasks for _ in range(args.generations)], policy, 8)
    turns = [(p, c) for episode in policy.turns for p, c in episode if c]
    packed = [seq for episode in policy.turns for seq in pack_turns(episode)]
    per_turn_tokens = sum(len(p) + len(c) for p, c in turns)
    packed_tokens = sum(len(ids) for ids, _ in packed)
    print(f"{args.world}: {len(policy.turns)} episodes, {len(turns)} model turns "
          f"({len(turns) / len(policy.turns):.2f} per episode); sequences: {len(turns)} per turn vs "
          f"{len(packed)} packed; tokens {per_turn_tokens} vs {packed_tokens} "
          f"({per_turn_tokens / packed_tokens:.2f}x fewer)")

    def loss_pass(arm: str) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        rows = turns if arm == "per turn" else packed
        out: list[torch.Tensor] = []
        for k in range(0, len(rows), args.micro_batch):
            micro = rows[k:k + args.micro_batch]
            lps = completion_logps(model, micro) if arm == "per turn" else span_logps(model, micro)
            (-torch.cat(lps).sum() / per_turn_tokens).backward()
            out += [lp.detach() for lp in lps]
        return out

    model.train()
    seconds: dict[str, list[float]] = {"per turn": [], "packed": []}
    logps = {}
    for _ in range(args.repeats):
        for arm in seconds:
            t0 = time.perf_counter()
            logps[arm] = loss_pass(arm)
            seconds[arm].append(time.perf_counter() - t0)
    worst = max((a - b).abs().max().item() for a, b in zip(logps["per turn"], logps["packed"]))
    turn_s, packed_s = statistics.median(seconds["per turn"]), statistics.median(seconds["packed"])
    print(f"loss forward + backward, median of {args.repeats}: per turn {turn_s:.2f} s, packed "
          f"{packed_s:.2f} s: {turn_s / packed_s:.2f}x; largest log-prob difference {worst:.1e}")


if __name__ == "__main__":
    main()
