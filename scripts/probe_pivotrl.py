"""Probe one-turn GRPO on one testbed world: does it raise turn accuracy on held-out expert states?

Profiles every turn of the first `--profile-trajectories` train trajectories of WORLD with the
base (resumable, the demo's `prepare_world`), then trains each `--arm` (any demo method) at one
lr for `--steps`, and prints turn accuracy (greedy, `state` verifier) on the expert states of
`--trajectories` eval trajectories at every checkpoint, plus the greedy accuracy on the training
pivots themselves (memorised vs learned). Two arms train side by side (one thread each).

The held-out states come from the demo's dev split (eval trajectories 0–39 by default,
`--dev-offset`), never from its eval split (40–99), so choosing settings with this probe does not
tune the measurement the demo's verdicts are drawn from.

    python3 scripts/probe_pivotrl.py --testbed runs/testbed --out runs/probe --world toolshop \
        --profile-trajectories 100 --arm pivotrl --arm sft --lr 3e-4 --steps 60 --eval-every 20
"""

import argparse
import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from pivotrl_testbed.demo import DemoConfig, Job, prepare_world, train_job
from pivotrl_testbed.episodes import ModelPolicy, turn_accuracy
from pivotrl_testbed.evaluate import evaluate_turns, load_trajectories
from pivotrl.io.records import Turn, iter_valid
from pivotrl_testbed.testbed.tiny import load_tiny
from pivotrl.verifiers import get_verifier


def accuracy(model_dir: Path, world: str, trajectories, pivots: list[Turn]) -> dict:
    model, tok = load_tiny(model_dir)
    policy = ModelPolicy(model, tok, max_new_tokens=64, temperature=0.0, seed=0, batch_size=32)
    held_out = evaluate_turns(policy, trajectories, "state")
    train = turn_accuracy(policy, pivots, get_verifier("state"))
    return {"eval_turn_acc": round(held_out["turn_accuracy"], 3), "eval_ci95": [round(x, 2) for x in held_out["turn_ci95"]],
            "eval_invalid": held_out["turn_invalid"], "eval_turns": held_out["turns"],
            "pivot_acc": round(train.accuracy, 3), "pivot_invalid": train.invalid, "pivots": train.n}


def dev_trajectories(args) -> list:
    every = load_trajectories(args.testbed / args.world / "eval.jsonl")
    return every[args.dev_offset: args.dev_offset + args.trajectories]


def run_arm(arm: str, args, cfg: DemoConfig) -> list[dict]:
    torch.set_num_threads(1)
    job = Job(args.world, arm, args.lr, args.seed)
    job_dir = args.out / "runs" / job.name
    if not (job_dir / "config.json").exists():
        train_job(job, args.testbed, args.out, cfg)
    trajectories = dev_trajectories(args)
    pivots = list(iter_valid(args.out / "data" / args.world / "pivots.jsonl", Turn))
    rows = []
    for step in range(args.eval_every, args.steps + 1, args.eval_every):
        ckpt = job_dir / f"checkpoint-{step}"
        ckpt = ckpt if (ckpt / "config.json").exists() else job_dir
        rows.append({"arm": arm, "step": step, **accuracy(ckpt, args.world, trajectories, pivots)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--testbed", type=Path, default=Path("runs/testbed"))
    ap.add_argument("--out", type=Path, default=Path("runs/probe"))
    ap.add_argument("--world", default="toolshop")
    ap.add_argument("--profile-trajectories", type=int, default=30,
                    help="train trajectories whose turns are profiled (~4 turns each)")
    ap.add_argument("--arm", action="append", default=None, help="demo method; repeatable")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--pivots-per-step", type=int, default=2)
    ap.add_argument("--num-generations", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trajectories", type=int, default=40, help="eval trajectories (held-out states)")
    ap.add_argument("--dev-offset", type=int, default=0,
                    help="first eval trajectory used (the demo's dev split is 0-39, its eval split 40-99)")
    args = ap.parse_args()
    cfg = DemoConfig(worlds=[args.world], profile_trajectories=args.profile_trajectories, steps=args.steps,
                     eval_every=args.eval_every, pivots_per_step=args.pivots_per_step,
                     num_generations=args.num_generations)
    torch.set_num_threads(2)
    stats = prepare_world(args.testbed, args.out, args.world, cfg)
    print(json.dumps({k: stats.get(k) for k in ("turns", "kept", "all_fail", "all_pass", "mixed")}), flush=True)
    trajectories = dev_trajectories(args)
    pivots = list(iter_valid(args.out / "data" / args.world / "pivots.jsonl", Turn))
    print(json.dumps({"arm": "base", "step": 0, **accuracy(args.testbed / "base", args.world, trajectories, pivots)}),
          flush=True)
    with ProcessPoolExecutor(max_workers=2) as pool:
        for fut in [pool.submit(run_arm, arm, args, cfg) for arm in args.arm or ["pivotrl"]]:
            fut.result()


if __name__ == "__main__":
    main()
