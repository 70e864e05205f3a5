"""Theorem 3.3 at the frontier's matched checkpoints: the dispersion of log π_θ/π_0 over the
actions the verifier rejects at pivot states (theory.preference_check), for both checkpoints of
each matched pair (frontier.py), first seed, per world. A matched pair has the same dev gain (or
OOD retention) on both sides, so a difference in dispersion there is the mechanism the paper
names, not a difference in how far the arms trained. Cached in OUT/theory_matched.json, keyed by
the pairs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pivotrl_testbed.frontier import matched
from pivotrl_testbed.jobs import Job, checkpoint_dir
from pivotrl_testbed.stats import side_runs, step_of


def matched_preferences(out: Path, testbed: Path, cfg: Any, items: list[dict[str, Any]],
                        rows: list[dict[str, Any]]) -> dict[str, Any]:
    """{world: preference_check's result} over the matched checkpoints, named "<rule>: <side>"."""
    from pivotrl_testbed.testbed.tiny import load_tiny
    from pivotrl_testbed.theory import preference_check, theory_states
    from pivotrl.verifiers import get_verifier

    pairs = matched(items, rows, cfg.frontier_config())["pairs"]
    key = json.dumps({n: p and {k: [p[k]["method"], p[k]["lr"], side_runs(p[k])] for k in ("a", "b")}
                      for n, p in pairs.items()}, sort_keys=True)
    path = out / "theory_matched.json"
    if path.exists() and json.loads(path.read_text()).get("key") == key:
        return json.loads(path.read_text())["worlds"]
    base, tok = load_tiny(testbed / "base")
    per_world = max(1, cfg.theory_turns // len(cfg.worlds))
    worlds: dict[str, Any] = {}
    for world in cfg.worlds:
        models = {}
        for name, pair in pairs.items():
            for k in ("a", "b") if pair else ():
                p = pair[k]
                seed = min(s for _, s, _ in side_runs(p))
                step = step_of(p, world, seed)  # this world's run's checkpoint at the point
                ckpt = None if step is None else checkpoint_dir(Job(world, p["method"], p["lr"], seed), out, step)
                if ckpt is not None:
                    models[f"{name}: {p['method']} lr {p['lr']:g} step {step}"] = load_tiny(ckpt)[0]
        states = [s for s, pivot in theory_states(out / "data" / world, per_world) if pivot]
        if models and states:
            worlds[world] = preference_check(base, models, tok, states, get_verifier(cfg.verifier),
                                             samples=cfg.theory_samples,
                                             max_new_tokens=cfg.max_completion_length)
    path.write_text(json.dumps({"key": key, "worlds": worlds}))
    return worlds
