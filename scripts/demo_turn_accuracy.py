"""Turn accuracy (the model's action on expert states of eval tasks, `state` verifier) of a demo
run's final checkpoints: a finer in-domain measure than episode success (issue #7's notes).

    python3 scripts/demo_turn_accuracy.py --demo runs/demo --testbed runs/testbed --lr 0.0003
"""

import argparse
from pathlib import Path

import torch

from pivotrl.episodes import ModelPolicy
from pivotrl.evaluate import evaluate_turns, load_trajectories
from pivotrl.testbed.tiny import load_tiny

METHODS = ["base", "sft", "pivotrl", "pivotrl_no_filter", "pivotrl_random", "pivotrl_exact", "e2e_rl"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--demo", type=Path, default=Path("runs/demo"))
    ap.add_argument("--testbed", type=Path, default=Path("runs/testbed"))
    ap.add_argument("--lr", default="0.0003", help="the run folder's lr, as written there")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trajectories", type=int, default=40, help="eval trajectories per world")
    args = ap.parse_args()
    torch.set_num_threads(2)
    for world in ("terminal", "toolshop"):
        trajectories = load_trajectories(args.testbed / world / "eval.jsonl", args.trajectories)
        for name in METHODS:
            run = args.demo / "runs" / world / name / f"lr{args.lr}-seed{args.seed}"
            model_dir = args.testbed / "base" if name == "base" else run  # the final model
            if not (model_dir / "config.json").exists():
                continue
            model, tok = load_tiny(model_dir)
            policy = ModelPolicy(model, tok, max_new_tokens=64, temperature=0.0, seed=0, batch_size=32)
            r = evaluate_turns(policy, trajectories, "state")
            lo, hi = r["turn_ci95"]
            print(f"{world:9s} {name:18s} turn accuracy {r['turn_accuracy']:.3f} [{lo:.2f}, {hi:.2f}] "
                  f"n={r['turns']} invalid={r['turn_invalid']}  ({model_dir})", flush=True)


if __name__ == "__main__":
    main()
