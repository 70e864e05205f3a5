"""Pivot selection (PivotRL step 3): keep turns whose sampled outcomes are mixed and not too easy.

The paper's rule, per profiled turn s with K samples: keep s when the empirical reward variance
is nonzero, σ̂²(s) > 0, and the mean is low, μ̂(s) < λ_diff. Zero-variance turns give GRPO no
signal (all advantages are zero; Thm 3.2: the natural-gradient norm scales with the reward std);
easy turns give little.

We apply it to the BINARY outcome (success = reward ≥ `success_threshold`, default 0.5): with a
shaped reward, a group of failures scored 0.1, 0.2, 0.3 has variance > 0 and would pass the
filter though no sample succeeded (docs/DESIGN.md pitfall). For binary rewards both readings agree.

λ_diff default 0.75. The paper states the rule with a free λ_diff; the material available to
us (the two seed summaries and public descriptions of arXiv 2603.21383) gives no value, so this
is our choice: with K = 8 it drops turns the reference policy already solves 6 or more times out
of 8, and keeps every mixed turn it solves ≤ 5 times. Tune it with --lambda-diff.

Re-profiling during training (`reprofile`, `ReprofileHook`) lives in pivotrl.train.reprofile.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from pivotrl.io.records import (
    Profile,
    Reject,
    read_records,
    rejects_path,
    sidecar_path,
    stats_path,
    write_atomic,
)

# A shaped reward counts as a success from here (docs/DESIGN.md pitfall). The toolcall verifier's
# partial_credit pays matched / expert calls for a subset of the expert's calls, so with it on,
# half of a turn's calls reaches this threshold (its config says so next to the option).
SUCCESS_THRESHOLD = 0.5


def outcome(rewards: Iterable[float], threshold: float = SUCCESS_THRESHOLD) -> str:
    """all_fail / all_pass / mixed on the BINARY outcome (reward ≥ threshold is a success)."""
    wins = [r >= threshold for r in rewards]
    if not wins:
        return "empty"
    return "all_pass" if all(wins) else "all_fail" if not any(wins) else "mixed"


LAMBDA_DIFF = 0.75  # see the module docstring for where this comes from


class SelectConfig(BaseModel):
    """Options of `pivotrl select` (every one a CLI flag)."""

    lambda_diff: float = Field(LAMBDA_DIFF, description="Keep turns with success rate < λ_diff "
                               "(paper's rule; value: our default, see module docstring).")
    min_std: float = Field(0.0, ge=0.0, description="Keep turns with binary-outcome std > min_std "
                           "(paper: > 0, i.e. mixed outcomes).")
    budget: int | None = Field(None, ge=0, description="At most this many turns; the easiest "
                               "(highest success rate) are dropped first.")
    strategy: Literal["pivots", "all", "random"] = Field(
        "pivots", description="pivots: the rule; all: every profiled turn (the 'no filter' "
        "ablation); random: a seeded random subset of the size pivots would keep (or --budget).")
    seed: int = Field(0, description="Seed of the random strategy.")
    success_threshold: float = Field(SUCCESS_THRESHOLD, description="A reward ≥ this is a success "
                                     "(binary outcome; 0.5 suits 0/1 and shaped rewards alike).")


def success_rate(p: Profile, threshold: float = SUCCESS_THRESHOLD) -> float:
    wins = [s.reward >= threshold for s in p.samples]
    return sum(wins) / len(wins) if wins else 0.0


def binary_std(p: Profile, threshold: float = SUCCESS_THRESHOLD) -> float:
    """Population std of the 0/1 outcomes: sqrt(q(1-q))."""
    q = success_rate(p, threshold)
    return math.sqrt(max(0.0, q * (1.0 - q)))


def is_pivot(p: Profile, cfg: SelectConfig) -> bool:
    return (bool(p.samples) and binary_std(p, cfg.success_threshold) > cfg.min_std
            and success_rate(p, cfg.success_threshold) < cfg.lambda_diff)


def _hardest_first(profiles: list[Profile], cfg: SelectConfig, budget: int) -> list[Profile]:
    """Drop the easiest first: sort by success rate (then by larger std: more signal), keep `budget`."""
    ranked = sorted(profiles, key=lambda p: (success_rate(p, cfg.success_threshold),
                                             -binary_std(p, cfg.success_threshold), p.id))
    return ranked[:budget]


def select(profiles: Sequence[Profile], cfg: SelectConfig) -> list[Profile]:
    """The kept turns, in input order."""
    profiles = list(profiles)
    pivots = [p for p in profiles if is_pivot(p, cfg)]
    if cfg.strategy == "pivots":
        kept = pivots
    elif cfg.strategy == "all":
        kept = profiles
    else:
        size = len(pivots) if cfg.budget is None else cfg.budget
        kept = random.Random(cfg.seed).sample(profiles, min(size, len(profiles)))
    if cfg.budget is not None and len(kept) > cfg.budget:
        kept = _hardest_first(kept, cfg, cfg.budget)
    keep_ids = {p.id for p in kept}
    return [p for p in profiles if p.id in keep_ids]


def selection_stats(profiles: Sequence[Profile], kept: Sequence[Profile], cfg: SelectConfig
               ) -> dict[str, Any]:
    """Outcome counts (binary), kept fraction per domain, and the shape of the rewards."""
    counts = Counter(outcome([s.reward for s in p.samples], cfg.success_threshold) for p in profiles)
    shaped = any(s.reward not in (0.0, 1.0) for p in profiles for s in p.samples)
    kept_ids = {p.id for p in kept}
    per_domain: dict[str, dict[str, Any]] = defaultdict(lambda: {"turns": 0, "kept": 0})
    for p in profiles:
        d = per_domain[p.domain or "(none)"]
        d["turns"] += 1
        d["kept"] += p.id in kept_ids
    for d in per_domain.values():
        d["kept_fraction"] = round(d["kept"] / d["turns"], 4) if d["turns"] else 0.0
    n = len(profiles)
    return {
        "config": cfg.model_dump(), "turns": n, "kept": len(kept),
        "kept_fraction": round(len(kept) / n, 4) if n else 0.0,
        "all_fail": counts["all_fail"], "all_pass": counts["all_pass"], "mixed": counts["mixed"],
        "no_samples": counts["empty"],
        "mixed_but_too_easy": sum(1 for p in profiles if outcome(
            [s.reward for s in p.samples], cfg.success_threshold) == "mixed"
            and success_rate(p, cfg.success_threshold) >= cfg.lambda_diff),
        "shaped_rewards": shaped,
        "samples": sum(len(p.samples) for p in profiles),
        "per_domain": dict(sorted(per_domain.items())),
    }


def plot(profiles: Sequence[Profile], kept: Sequence[Profile], cfg: SelectConfig,
         path: str | Path) -> Path:
    """Histograms of per-turn reward mean and std (all turns vs kept), λ_diff marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    # Rewards lie in [0, 1], so a std lies in [0, 0.5].
    for ax, key, title, top in ((axes[0], "reward_mean", "reward mean per turn", 1.0),
                                (axes[1], "reward_std", "reward std per turn", 0.5)):
        bins = [top * i / 20 for i in range(21)]
        ax.hist([getattr(p, key) for p in profiles], bins=bins, alpha=0.5, label="all turns")
        ax.hist([getattr(p, key) for p in kept], bins=bins, alpha=0.7, label="kept")
        ax.set_title(title)
        ax.set_xlabel(key)
        ax.set_ylabel("turns")
    axes[0].axvline(cfg.lambda_diff, color="k", linestyle="--", label=f"λ_diff = {cfg.lambda_diff}")
    axes[0].legend()
    fig.suptitle(f"pivot selection ({cfg.strategy}): kept {len(kept)} of {len(profiles)}")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def output_paths(out: str | Path) -> tuple[Path, Path]:
    """`pivots.jsonl` → (`pivots.stats.json`, `pivots.hist.png`)."""
    return stats_path(out), sidecar_path(out, ".hist.png")


def select_file(profile_path: str | Path, out_path: str | Path, cfg: SelectConfig,
                *, plot_png: bool = True) -> dict[str, Any]:
    """Read a Profile file (bad lines → rejects file), write PIVOTS, PIVOTS.stats.json and the PNG."""
    profiles, rejects = [], []
    for _, rec in read_records(profile_path, Profile):
        (rejects if isinstance(rec, Reject) else profiles).append(rec)
    if rejects:
        write_atomic(rejects_path(out_path), [r.to_json() for r in rejects])
    kept = select(profiles, cfg)
    write_atomic(out_path, kept)
    stats = selection_stats(profiles, kept, cfg)
    stats["rejected_lines"] = len(rejects)
    spath, png = output_paths(out_path)
    if plot_png:
        stats["histogram"] = str(plot(profiles, kept, cfg, png))
    spath.write_text(json.dumps(stats, indent=2))
    return stats
