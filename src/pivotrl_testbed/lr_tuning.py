"""An lr-tuning run: the demo's dev choice of each arm's learning rate, and nothing else.

A comparison of arms is fair only if each arm trains at the lr its own dev scores choose: one
arm at a tuned lr and another at an inherited one measures the tuning, not the method. So the
lrs the default and --full train at are not a guess but the output of one committed run of the
demo with `eval_split: false` (configs/demo_lr_tuning.yaml: one seed, every world, a small grid
for every headline arm). That run trains every (world, method, lr), scores every checkpoint on
dev, chooses by the demo's own rule (`stats.choose`: each run's earliest checkpoint within δ of
its best, each method's smallest lr within δ of the best lr's mean) and writes
`lr_choice.json`; it never scores the eval split, so the verdicts that read eval later were not
seen by the choice. The chosen values are then written into `demo_config.TUNED_LEARNING_RATES`
by hand, in a commit that cites the run's folder: that commit is the record.

A choice at a grid's edge, or a checkpoint at its run's cap, says the grid or the cap was too
small: both are flagged in the file and the log, never hidden (an edge lr that is only the rule's
preference among lrs within δ is not flagged; one that scores best is).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

from pivotrl_testbed.budget import at_cap
from pivotrl_testbed.demo_config import DemoConfig


def lr_choice(items: list[dict[str, Any]], cfg: DemoConfig) -> dict[str, Any]:
    """{method: {"lr", "steps", "dev_score", "delta", "by_lr": {lr: {"steps", "dev_score"}},
    "at_grid_edge", "at_cap"}} from the dev item rows of every trained run."""
    from pivotrl_testbed.report import chosen_sides

    chosen = chosen_sides(items, cfg.select_on, cfg.seeds, cfg.select_decoding)
    out: dict[str, Any] = {}
    for method in cfg.methods:
        if method not in chosen:
            continue
        grid = sorted(cfg.lrs(method))
        by_lr = {}
        for lr in grid:
            mine = [r for r in items if r["method"] != method or math.isclose(float(r["lr"]), lr)]
            side = chosen_sides(mine, cfg.select_on, cfg.seeds, cfg.select_decoding).get(method)
            if side is not None:
                by_lr[f"{lr:g}"] = {"steps": side["steps"], "dev_score": side["dev_score"]}
        side = chosen[method]
        best = max(by_lr, key=lambda lr: by_lr[lr]["dev_score"]) if by_lr else None
        out[method] = {"lr": side["lr"], "steps": side["steps"], "dev_score": side["dev_score"],
                       "delta": side.get("delta"), "by_lr": by_lr,
                       # the best-scoring lr at an end of the grid: the optimum may lie beyond it
                       "at_grid_edge": len(grid) > 1 and best in (f"{grid[0]:g}", f"{grid[-1]:g}"),
                       "at_cap": at_cap(side["steps"], cfg.cap(method))}
    return out


def write_lr_choice(out: Path, items: list[dict[str, Any]], cfg: DemoConfig,
                    log: Callable[[str], None]) -> dict[str, Any]:
    """OUT/lr_choice.json and one log line per method; returns the choice."""
    from pivotrl.io.records import write_text_atomic

    choice = lr_choice(items, cfg)
    if not choice:
        raise RuntimeError("the lr-tuning run chose nothing: no method has dev rows")
    write_text_atomic(out / "lr_choice.json", json.dumps(choice, indent=1, sort_keys=True))
    for method, got in choice.items():
        scores = ", ".join(f"{lr} {c['dev_score']:.3f}" for lr, c in got["by_lr"].items())
        log(f"  {method}: lr {got['lr']:g} (dev {scores}; δ {got['delta']:.3f})"
            + ("; WARNING: at the grid's edge, widen the grid" if got["at_grid_edge"] else "")
            + ("; WARNING: a chosen checkpoint is at the cap, raise it" if got["at_cap"] else ""))
    return choice
