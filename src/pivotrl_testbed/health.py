"""Nothing silent: a measure whose outcomes collapse, or whose world failed, is flagged with its
cause in the demo's log and report.

A fresh default run once scored a checkpoint at 0 of 100 episodes where the same checkpoint had
scored 36 of 100 in the committed run (a transient failure), and the report showed the 0
without a word. Two checks, over the item rows alone:

- **world failures**: an item whose outcome was decided by the world failing rather than by the
  model (a world that could not be rebuilt or raised, a sandbox that could not start, a goal
  check that raised) carries `failure` (its cause) in its row; every measure with such items is
  flagged, whatever its rate.
- **collapse**: a measure (one checkpoint, world, split, measure and decoding) with no success
  on any of its n items, where a reference rate p makes that implausible: (1 − p)^n < 0.001.
  The reference of a trained checkpoint is the base's rate on the same items in the same run;
  the base's is its build record (`build.json`, measured when the testbed was built). A collapse
  can be real (a learning rate that wrecks the model) or a failure the item rows did not see;
  the flag says which causes were recorded, so a reader knows which.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from pivotrl_testbed.testbed.agentic_ood import mean_by_kind, split_kinds

IMPLAUSIBLE = 1e-3
# An observation the episode runner wrote because the world raised ("error: OSError: ..."), or
# bubblewrap's own complaint: not the command's output, the sandbox's failure.
_RAISED = re.compile(r"^error: [A-Za-z_][\w.]*: ")
_SANDBOX = re.compile(r"^bwrap: ", re.M)
# The `state` verifier's reasons when the world, not the action, decided the score.
_VERIFIER_FAILURES = ("world could not be rebuilt", "world failed on the expert's action",
                      "world raised")


def reason_failure(reason: str | None) -> str | None:
    """The cause when a verifier's reason says the world failed, else None."""
    if reason and reason.startswith(_VERIFIER_FAILURES):
        return reason
    return None


def episode_failure(messages: Iterable[Any], notes: Iterable[str] = ()) -> str | None:
    """The first world failure in an episode's tool observations or runner notes, else None."""
    for m in messages:
        text = getattr(m, "content", None)
        if getattr(m, "role", None) == "tool" and isinstance(text, str):
            if _RAISED.match(text) or _SANDBOX.search(text):
                return text.splitlines()[0][:200]
    return next((n for n in notes if n.startswith("success check failed")), None)


def _key(r: dict[str, Any]) -> tuple:
    return (r["method"], r["world"], r["seed"], float(r["lr"]), r["step"], r["split"],
            r["measure"], r.get("decoding", "greedy"))


def base_reference(items: Sequence[dict[str, Any]]) -> dict[tuple, float]:
    """{(world, split, measure, decoding): the base's mean outcome} in this run."""
    acc: dict[tuple, list[float]] = defaultdict(list)
    for r in items:
        if r["method"] == "base":
            acc[(r["world"], r["split"], r["measure"], r.get("decoding", "greedy"))].append(float(r["outcome"]))
    return {k: sum(v) / len(v) for k, v in acc.items()}


def record_reference(build: dict[str, Any] | None) -> dict[tuple, float]:
    """{(world, measure): rate} from a testbed's build record (`build.json`'s `base`)."""
    base = (build or {}).get("base") or {}
    out: dict[tuple, float] = {}
    for world, m in (base.get("in_domain") or {}).items():
        if m.get("success") is not None:
            out[(world, "episode")] = m["success"]
        if m.get("turn_accuracy") is not None:
            out[(world, "turn")] = m["turn_accuracy"]
    for measure, rate in mean_by_kind(base.get("ood") or {}).items():
        out[("*", measure)] = rate
    return out


def flags(items: Sequence[dict[str, Any]], build: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every flagged measure (module doc): {"method", "world", "seed", "lr", "step", "split",
    "measure", "decoding", "items", "successes", "failures", "kind", "why"}."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    base_seed = min((r["seed"] for r in items if r["method"] == "base"), default=None)
    items = split_kinds(list(items))  # the two OOD kinds apart, as the verdicts read them
    for r in items:
        if r["method"] != "base" or r["seed"] == base_seed:  # the base: the same rows per seed
            groups[_key(r)].append(r)
    run_ref, rec_ref = base_reference(items), record_reference(build)
    out = []
    for key, rows in sorted(groups.items(), key=lambda kv: str(kv[0])):
        method, world, seed, lr, step, split, measure, decoding = key
        n = len(rows)
        wins = sum(float(r["outcome"]) for r in rows)
        failed = Counter(r["failure"] for r in rows if r.get("failure"))
        flag = {"method": method, "world": world, "seed": seed, "lr": lr, "step": step,
                "split": split, "measure": measure, "decoding": decoding, "items": n,
                "successes": round(wins, 3), "failures": sum(failed.values())}
        where = f"{method} step {step} (seed {seed}, lr {lr:g}), {world} {split} {measure} ({decoding})"
        cause = (f"the world failed on {sum(failed.values())} of {n} items, e.g. "
                 f"{failed.most_common(1)[0][0]!r}" if failed else "")
        if wins == 0:
            if method == "base":
                p, source = rec_ref.get((world, measure), rec_ref.get(("*", measure))), "its build record"
            else:
                p, source = run_ref.get((world, split, measure, decoding)), "the base on these items"
            if p is not None and (1 - p) ** n < IMPLAUSIBLE:
                out.append({**flag, "kind": "collapse", "why": (
                    f"{where}: 0 of {n} where {source} had {p:.3f}; "
                    + (cause or "no world failure was recorded on these items: the model's own "
                       "outcomes, or a failure they do not show"))})
                continue
        if failed:
            out.append({**flag, "kind": "world failure", "why": f"{where}: {cause}"})
    return out
