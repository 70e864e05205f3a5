"""Check a built testbed against the acceptance criteria for a base whose missing skill costs tasks
(docs/RESULTS.md; `pivotrl_testbed.testbed.task_criteria`): the base's rescue test on the dev
tasks, then the demo's SFT arm alone, its training stage only (the demo's data, budget rule and
dev scoring, greedy, runs stopped and checkpoints chosen on dev episode success; lr 1e-4 and
3e-4; no profiling, no eval split: every criterion reads dev), then every criterion.

    python3 scripts/task_criteria.py BUILD_DIR --config CONFIG.yaml --out RUN_DIR [--rescue-only]

With --to-cap, SFT at its chosen lr also trains to its cap without the plateau stop
(RUN_DIR/sft_cap/), and at 3× its chosen lr when the grid lacks it, both read only by
`ood_can_move`.

BUILD_DIR must be a finished build of CONFIG (the script never builds). Writes RUN_DIR/rescue.json
(reused when present), RUN_DIR/sft/ (the runs, cached: another --lrs adds only its runs),
RUN_DIR/items.jsonl and RUN_DIR/criteria.json; --rescue-only stops after the rescue test (and
checks what the build record and the rescue alone can say).
"""

import argparse
import json
import sys
from pathlib import Path

from pivotrl.io.records import Trajectory, iter_valid
from pivotrl.verifiers import get_verifier
from pivotrl_testbed.demo import DemoConfig
from pivotrl_testbed.episodes import ModelPolicy
from pivotrl_testbed.evaluate import SampledConfig
from pivotrl_testbed.testbed.build import is_built, load_testbed_config
from pivotrl_testbed.testbed.common import WORLDS
from pivotrl_testbed.testbed.rescue import rescue_test
from pivotrl_testbed.testbed.planted import planted_table
from pivotrl_testbed.testbed.task_criteria import OVERTRAIN_LR, check, sft_choice
from pivotrl_testbed.testbed.tiny import load_tiny

DEV_TASKS = 40  # the dev split the criteria were registered on: the eval file's first 40 tasks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build", type=Path)
    ap.add_argument("--config", type=Path, help="the build's TestbedConfig YAML (default: the default)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rescue-only", action="store_true")
    ap.add_argument("--lrs", default="1e-4,3e-4", help="SFT's lr grid (the criteria's: 1e-4,3e-4)")
    ap.add_argument("--to-cap", action="store_true", help="also train SFT at its chosen lr to its "
                    "cap without the plateau stop (RUN_DIR/sft_cap/), for `ood_can_move`")
    args = ap.parse_args()
    cfg = load_testbed_config(args.config)
    if not is_built(args.build, cfg):
        sys.exit(f"{args.build}: not a finished build of {args.config or 'the default config'}")
    args.out.mkdir(parents=True, exist_ok=True)
    saved = args.out / "rescue.json"
    if saved.exists():  # the base's rescue test is deterministic (greedy): done once per folder
        rescue = json.loads(saved.read_text())["counts"]
    else:
        model, tok = load_tiny(args.build / "base")
        rescue, details = {}, {}
        for w in WORLDS:
            tasks = list(iter_valid(args.build / w / "eval.jsonl", Trajectory))[:DEV_TASKS]
            got = rescue_test(w, tasks, ModelPolicy(model, tok), get_verifier("state"))
            rescue[w], details[w] = got["counts"], got["episodes"]
        saved.write_text(json.dumps({"counts": rescue, "episodes": details}, indent=2) + "\n")
    for w, counts in rescue.items():
        print(f"rescue {w}: {counts}", flush=True)
    build = json.loads((args.build / "build.json").read_text())
    lrs = [float(x) for x in args.lrs.split(",")]
    items = [] if args.rescue_only else sft_items(args.build, args.out / "sft", lrs)
    (args.out / "items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in items))
    cap_items: list[dict] = []
    chosen = sft_choice(items) if items and args.to_cap else None
    if chosen:
        cap_items = [r for r in sft_items(args.build, args.out / "sft_cap", [float(chosen["lr"])],
                                          to_cap=True) if r["method"] == "sft"]
        over = OVERTRAIN_LR * float(chosen["lr"])
        if not any(abs(lr - over) < 1e-12 for lr in lrs):  # the criterion's "3× its lr" as well
            cap_items += [r for r in sft_items(args.build, args.out / "sft", [over])
                          if r["method"] == "sft"]
        (args.out / "items_to_cap.jsonl").write_text("".join(json.dumps(r) + "\n" for r in cap_items))
    got = check(build, items, rescue, cap_items, planted=planted_table(args.build, cfg))
    (args.out / "criteria.json").write_text(json.dumps(got, indent=2, default=str) + "\n")
    for name, v in got.items():
        print(f"{name}: {v['verdict']}")


def sft_items(build: Path, out: Path, lrs: list[float], to_cap: bool = False) -> list[dict]:
    """The base's and every SFT checkpoint's greedy dev item rows: the demo's training stage
    (`demo.run_jobs`) for the SFT arm at each of `lrs`, on the demo's shared data (a finished
    run is cached in `out`, so a second call with another lr adds only that lr's runs). `to_cap`:
    no plateau stop, every run to the cap."""
    from pivotrl_testbed.budget import BudgetRule
    from pivotrl.io.records import write_atomic
    from pivotrl_testbed.checkpoint_eval import Evaluator, item_rows
    from pivotrl_testbed.demo import run_jobs, say
    from pivotrl_testbed.jobs import Job

    cfg = DemoConfig(methods=["sft"], worlds=list(WORLDS), learning_rates=lrs,
                     dev_tasks=DEV_TASKS, sampled=SampledConfig(k=0))
    if to_cap:
        cfg = cfg.model_copy(update={"budget": BudgetRule(patience=cfg.steps)})
    evaluator = Evaluator(build, cfg)
    base = []
    for w in WORLDS:
        trajs = list(iter_valid(build / w / "train.jsonl", Trajectory))[:cfg.profile_trajectories]
        write_atomic(out / "data" / w / "trajectories.jsonl", trajs)
        _, got = evaluator(None, w, ("dev",))
        base += item_rows(got, method="base", world=w, seed=0, lr=0.0, step=0)
    jobs = [Job(w, "sft", lr, 0) for lr in cfg.lrs("sft") for w in WORLDS]
    _, items = run_jobs(jobs, build, out, cfg, {w: {} for w in WORLDS}, say, base)
    return base + items


if __name__ == "__main__":
    main()
