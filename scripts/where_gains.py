"""Where each arm's gain or loss comes from: turn accuracy by world, turn position and whether the
expert's turn holds a planted step, each headline arm against the base and PivotRL against SFT, on
the eval split at the dev-chosen checkpoints and temperatures a demo's results.json names; then,
from dev and training files only, whether the planted turns were among the pivots, how many
updates each pivot got and how the reward's spread moved over training.

    python3 scripts/where_gains.py RUN [--config CONFIG] [--out RUN/where_gains.json]

RUN is a `pivotrl demo --out` folder (results.json, items.jsonl.gz or items.jsonl, testbed/,
data/<world>/pivots.jsonl, runs/). CONFIG is the testbed config the run's base was built from
(default: the shipped default's recipe); the planted flag of each turn is computed from it and
the run's own trajectories (`testbed/planted.py`), never hand-listed. Descriptive: intervals are
the demo's cluster bootstrap; no verdict is read here and no rule reads this file.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict
from pathlib import Path
from statistics import fmean
from typing import Any

from pivotrl.io.records import Trajectory, iter_valid
from pivotrl_testbed import stats
from pivotrl_testbed.decoding import at_dev_best
from pivotrl_testbed.testbed.build import load_testbed_config
from pivotrl_testbed.testbed.planted import plant_kinds, planted_at

ARMS = ("sft", "pivotrl", "e2e_rl")
REPLICATES = 1000
WINDOW = 3  # logged steps averaged at a run's start and end


def read_items(run: Path) -> list[dict[str, Any]]:
    path = run / "items.jsonl.gz"
    lines = gzip.open(path, "rt") if path.exists() else open(run / "items.jsonl")
    with lines:
        return [json.loads(line) for line in lines if line.strip()]


def planted_turns(run: Path, cfg: Any) -> dict[tuple[str, str, int], bool]:
    """{(world, trajectory id, position): holds a planted step} over the run's testbed files."""
    kinds = plant_kinds(cfg)
    out = {}
    for world in cfg.worlds:
        for name in ("train.jsonl", "eval.jsonl"):
            path = run / "testbed" / world / name
            if not path.exists():
                continue
            for traj in iter_valid(path, Trajectory):
                position = 0
                for i, msg in enumerate(traj.messages):
                    if msg.role == "assistant":
                        held = planted_at(world, traj.metadata["task"], traj.messages[:i], msg, position, kinds)
                        out[(world, traj.id, position)] = bool(held)
                        position += 1
    return out


def group_of(row: dict[str, Any], planted: dict[tuple[str, str, int], bool]) -> tuple[str, str, str]:
    task = str(row["item"]).rsplit("/", 1)[0]
    pos = int(row["position"])
    flag = planted.get((row["world"], task, pos))
    return row["world"], "3+" if pos >= 3 else str(pos), "?" if flag is None else "planted" if flag else "not planted"


def gains(items: list[dict[str, Any]], results: dict[str, Any], planted: dict) -> list[dict[str, Any]]:
    """Paired turn-accuracy differences per (world, position, planted) group, each arm at its own
    dev-best temperature (results.json's `decoding.best`, relabelled as the verdicts are)."""
    chosen = {m: v["chosen"] for m, v in results["methods"].items() if v.get("chosen")}
    dec = results["decoding"]
    turns = [r for r in items if r["measure"] == "turn" and r["split"] == "eval"]
    rows_at_best = at_dev_best(turns, dec["best"], dec["train_temperature"])
    by_group: dict[tuple, list] = defaultdict(list)
    for r in rows_at_best:
        by_group[group_of(r, planted)].append(r)
    pairs = [(a, "base") for a in ARMS] + [("pivotrl", "sft")]
    out = []
    for g, rows in sorted(by_group.items()):
        for a, b in pairs:
            if a not in chosen or b not in chosen:
                continue
            got = stats.paired(rows, chosen[a], chosen[b], measure="turn", replicates=REPLICATES)
            if got:
                out.append({"world": g[0], "position": g[1], "planted": g[2], "a": a, "b": b,
                            "a_mean": got["a_mean"], "b_mean": got["b_mean"],
                            "diff": got["diff"], "ci95": got["ci95"], "pairs": got["pairs"]})
    return out


def pivot_coverage(run: Path, planted: dict) -> list[dict[str, Any]]:
    """Per world, position and planted flag, the train turns the base profiled: how many were
    all-fail, mixed or all-pass under its K samples, and how many were kept as pivots (train split
    only: the profile and the selection read nothing else)."""
    out = []
    for world_dir in sorted((run / "data").glob("*")):
        world = world_dir.name
        pivots = {json.loads(line)["id"] for line in open(world_dir / "pivots.jsonl") if line.strip()}
        cells: dict[tuple[str, str], dict[str, int]] = defaultdict(
            lambda: {"turns": 0, "all-fail": 0, "mixed": 0, "all-pass": 0, "pivots": 0})
        for line in open(world_dir / "profile.jsonl"):
            if not line.strip():
                continue
            turn = json.loads(line)
            pos, q = int(turn["turn"]), float(turn["reward_mean"])
            flag = planted.get((world, turn["trajectory_id"], pos))
            cell = cells[("3+" if pos >= 3 else str(pos), "?" if flag is None else "planted" if flag else "not planted")]
            cell["turns"] += 1
            cell["all-fail" if q == 0 else "all-pass" if q == 1 else "mixed"] += 1
            cell["pivots"] += turn["id"] in pivots
        out += [{"world": world, "position": p, "planted": f, **c} for (p, f), c in sorted(cells.items())]
    return out


def training_signal(run: Path) -> list[dict[str, Any]]:
    """Per PivotRL training run (every lr and seed): steps, how many times each pivot was
    rolled out on average, and the reward's mean, within-group std and share of all-alike groups
    over its first and last few logged steps (metrics.jsonl; training data only)."""
    out = []
    for metrics in sorted(run.glob("runs/*/pivotrl/*/metrics.jsonl")):
        rows = [json.loads(line) for line in open(metrics) if line.strip()]
        rows = [r for r in rows if "reward_mean" in r]
        if not rows:
            continue
        world = metrics.parent.parent.parent.name
        n_pivots = sum(1 for line in open(run / "data" / world / "pivots.jsonl") if line.strip())
        config = (metrics.parent / "run_config.yaml").read_text()
        group = int(next(line.split(":")[1] for line in config.splitlines() if line.startswith("num_generations:")))
        head, tail = rows[:WINDOW], rows[-WINDOW:]
        out.append({"run": str(metrics.parent.relative_to(run)), "steps": int(rows[-1]["step"]),
                    "pivots": n_pivots, "rollouts_per_pivot": rows[-1]["rollout_turns"] / group / n_pivots,
                    **{f"{k}_{when}": fmean(float(r[k]) for r in part)
                       for k in ("reward_mean", "group_std_mean", "frac_zero_std")
                       for when, part in (("first", head), ("last", tail))}})
    return out


def markdown(report: dict[str, Any]) -> str:
    L = ["Eval turn accuracy, each arm at its dev-best temperature and dev-chosen checkpoints:", "",
         "| world | position | planted | a − b | a vs b | Δ [95% CI] | pairs |", "|---|---|---|---|---|---|---|"]
    for g in report["gains"]:
        L.append(f"| {g['world']} | {g['position']} | {g['planted']} | {g['a']} − {g['b']} | "
                 f"{g['a_mean']:.3f} vs {g['b_mean']:.3f} | {g['diff']:+.3f} [{g['ci95'][0]:+.3f}, {g['ci95'][1]:+.3f}] | {g['pairs']} |")
    L += ["", "The base's profile of the train turns (K samples each) and the pivots kept:", "",
          "| world | position | planted | train turns | all-fail | mixed | all-pass | pivots |",
          "|---|---|---|---|---|---|---|---|"]
    L += [f"| {c['world']} | {c['position']} | {c['planted']} | {c['turns']} | {c['all-fail']} | {c['mixed']} | "
          f"{c['all-pass']} | {c['pivots']} |" for c in report["pivots"]]
    L += ["", "| PivotRL run | steps | rollouts per pivot | reward first → last | group std first → last | all-alike groups first → last |",
          "|---|---|---|---|---|---|"]
    for t in report["training"]:
        L.append(f"| {t['run']} | {t['steps']} | {t['rollouts_per_pivot']:.1f} | "
                 f"{t['reward_mean_first']:.3f} → {t['reward_mean_last']:.3f} | "
                 f"{t['group_std_mean_first']:.3f} → {t['group_std_mean_last']:.3f} | "
                 f"{t['frac_zero_std_first']:.2f} → {t['frac_zero_std_last']:.2f} |")
    return "\n".join(L) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--config", default=None, help="the base's testbed config (default: the shipped default's)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    cfg = load_testbed_config(args.config)
    results = json.loads((args.run / "results.json").read_text())
    planted = planted_turns(args.run, cfg)
    if not planted:
        raise SystemExit(f"{args.run}/testbed: no trajectories to read the planted steps from")
    report = {"gains": gains(read_items(args.run), results, planted),
              "pivots": pivot_coverage(args.run, planted), "training": training_signal(args.run)}
    out = args.out or args.run / "where_gains.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
