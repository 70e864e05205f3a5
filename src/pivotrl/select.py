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

A turn the verifier marks unverifiable (`Profile.unverifiable`: e.g. no probe workspace changes
the expert's outcome, so a memorised answer would be paid) is never kept, by any strategy: its
rewards are no signal. The statistics count such turns (`unverifiable`, also per domain).

Re-profiling during training (`reprofile`, `ReprofileHook`) lives in pivotrl.train.reprofile.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, Field

from pivotrl.io.empty import ALLOW_EMPTY, check_input, require_some
from pivotrl.io.records import (
    AtomicWriter,
    Profile,
    Reject,
    read_records,
    rejects_path,
    sidecar_path,
    stats_path,
    write_text_atomic,
)
from pivotrl.verifiers.arguments import is_unproven

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


class Scored(NamedTuple):
    """What the rule and the statistics read of one Profile: a few numbers, made one profile at
    a time and not kept (`Selection` keeps what its strategy needs, `Tally` only counts)."""

    id: str
    domain: str | None
    success: float  # binary success rate
    std: float  # binary std
    reward_mean: float
    reward_std: float
    samples: int
    outcome: str  # all_fail / all_pass / mixed / empty
    shaped: bool  # some reward is neither 0 nor 1
    invalid: int  # samples the parser or verifier could not use
    truncated: int  # samples cut at the token budget
    unproven: int  # failed samples whose only difference is free text no rule proves (a judge's question)
    unverifiable: bool  # the verifier cannot verify the turn (Profile.unverifiable): never kept


def score(p: Profile, threshold: float = SUCCESS_THRESHOLD) -> Scored:
    rewards = [s.reward for s in p.samples]
    return Scored(p.id, p.domain, success_rate(p, threshold), binary_std(p, threshold),
                  p.reward_mean, p.reward_std, len(rewards), outcome(rewards, threshold),
                  any(r not in (0.0, 1.0) for r in rewards), sum(not s.valid for s in p.samples),
                  sum(s.finish_reason == "length" for s in p.samples),
                  sum(s.valid and s.reward < threshold and is_unproven(s.reason) and s.finish_reason != "length"
                      for s in p.samples), bool(p.unverifiable))


def is_pivot(s: Scored, cfg: SelectConfig) -> bool:
    """The paper's rule, on turns the verifier can verify: a reward on an unverifiable turn
    (a memorised answer would be paid there) is no signal, whatever its variance."""
    return (not s.unverifiable and s.samples > 0 and s.std > cfg.min_std
            and s.success < cfg.lambda_diff)


class Selection:
    """The selection rule over a stream: `add` every profile's Scored (first pass), then
    `keeps(s)` tells whether a profile is kept (second pass). The paper's rule alone (strategy
    pivots, no budget) is decided per profile and holds nothing; a budget holds (success, std,
    id) of each pivot, the baselines of each profile, as the draw and the ranking need them."""

    def __init__(self, cfg: SelectConfig):
        self.cfg = cfg
        self.per_profile = cfg.strategy == "pivots" and cfg.budget is None
        self.candidates: list[tuple[float, float, str]] = []
        self.pivots = 0
        self._ids: set[str] | None = None

    def add(self, s: Scored) -> None:
        pivot = is_pivot(s, self.cfg)
        self.pivots += pivot
        if not self.per_profile and not s.unverifiable and (pivot or self.cfg.strategy != "pivots"):
            self.candidates.append((s.success, s.std, s.id))

    def keeps(self, s: Scored) -> bool:
        if self.per_profile or s.unverifiable:
            return is_pivot(s, self.cfg)
        if self._ids is None:
            self._ids = self._decide()
        return s.id in self._ids

    def _decide(self) -> set[str]:
        cfg, kept = self.cfg, self.candidates
        if cfg.strategy == "random":  # as many as the rule keeps, or the budget
            size = self.pivots if cfg.budget is None else cfg.budget
            kept = random.Random(cfg.seed).sample(kept, min(size, len(kept)))
        if cfg.budget is not None and len(kept) > cfg.budget:
            # drop the easiest first: by success rate, then larger std first (more signal)
            kept = sorted(kept, key=lambda c: (c[0], -c[1], c[2]))[: cfg.budget]
        return {c[2] for c in kept}


def select(profiles: Sequence[Profile], cfg: SelectConfig) -> list[Profile]:
    """The kept turns, in input order (in memory; `select_file` streams the same rule)."""
    scored = [score(p, cfg.success_threshold) for p in profiles]
    selection = Selection(cfg)
    for s in scored:
        selection.add(s)
    return [p for p, s in zip(profiles, scored) if selection.keeps(s)]


BINS = 20  # histogram bins over [0, 1] (reward mean) and [0, 0.5] (reward std)


class Tally:
    """The selection's statistics, counted as profiles stream by (`add`: every profile, first
    pass; `add_kept`: each kept one, second pass); histograms as bin counts, not values."""

    def __init__(self, cfg: SelectConfig):
        self.cfg = cfg
        self.outcomes: Counter = Counter()
        self.per_domain: dict[str, dict[str, Any]] = defaultdict(
            lambda: {"turns": 0, "kept": 0, "unverifiable": 0})
        self.turns = self.kept = self.too_easy = self.samples = self.unverifiable = 0
        self.invalid = self.truncated = self.free_text = 0
        self.shaped = False
        self.hist = {k: {"all": [0] * BINS, "kept": [0] * BINS} for k in ("reward_mean", "reward_std")}

    def _bin(self, s: Scored, which: str) -> None:
        for key, top in (("reward_mean", 1.0), ("reward_std", 0.5)):
            value = min(max(getattr(s, key), 0.0), top)
            self.hist[key][which][min(int(value / top * BINS), BINS - 1)] += 1

    def add(self, s: Scored) -> None:
        self.turns += 1
        self.outcomes[s.outcome] += 1
        self.per_domain[s.domain or "(none)"]["turns"] += 1
        self.per_domain[s.domain or "(none)"]["unverifiable"] += s.unverifiable
        self.unverifiable += s.unverifiable
        self.too_easy += s.outcome == "mixed" and s.success >= self.cfg.lambda_diff
        self.shaped = self.shaped or s.shaped
        self.samples += s.samples
        self.invalid += s.invalid
        self.truncated += s.truncated
        self.free_text += s.outcome == "all_fail" and s.unproven > 0
        self._bin(s, "all")

    def add_kept(self, s: Scored) -> None:
        self.kept += 1
        self.per_domain[s.domain or "(none)"]["kept"] += 1
        self._bin(s, "kept")

    def stats(self) -> dict[str, Any]:
        """Outcome counts (binary), kept fraction per domain, and the shape of the rewards."""
        for d in self.per_domain.values():
            d["kept_fraction"] = round(d["kept"] / d["turns"], 4) if d["turns"] else 0.0
        n, counts = self.turns, self.outcomes
        return {
            "config": self.cfg.model_dump(), "turns": n, "kept": self.kept,
            "kept_fraction": round(self.kept / n, 4) if n else 0.0,
            "all_fail": counts["all_fail"], "all_pass": counts["all_pass"],
            "mixed": counts["mixed"], "no_samples": counts["empty"],
            "mixed_but_too_easy": self.too_easy, "unverifiable": self.unverifiable,
            "shaped_rewards": self.shaped,
            "samples": self.samples, "invalid_samples": self.invalid, "truncated_samples": self.truncated,
            "all_fail_on_free_text": self.free_text, "per_domain": dict(sorted(self.per_domain.items())),
        }


def plot(tally: Tally, path: str | Path) -> Path:
    """Histograms of per-turn reward mean and std (all turns vs kept), λ_diff marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = tally.cfg
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    # Rewards lie in [0, 1], so a std lies in [0, 0.5].
    for ax, key, title, top in ((axes[0], "reward_mean", "reward mean per turn", 1.0),
                                (axes[1], "reward_std", "reward std per turn", 0.5)):
        edges = [top * i / BINS for i in range(BINS + 1)]
        ax.stairs(tally.hist[key]["all"], edges, fill=True, alpha=0.5, label="all turns")
        ax.stairs(tally.hist[key]["kept"], edges, fill=True, alpha=0.7, label="kept")
        ax.set_title(title)
        ax.set_xlabel(key)
        ax.set_ylabel("turns")
    axes[0].axvline(cfg.lambda_diff, color="k", linestyle="--", label=f"λ_diff = {cfg.lambda_diff}")
    axes[0].legend()
    fig.suptitle(f"pivot selection ({cfg.strategy}): kept {tally.kept} of {tally.turns}")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def output_paths(out: str | Path) -> tuple[Path, Path]:
    """`pivots.jsonl` → (`pivots.stats.json`, `pivots.hist.png`)."""
    return stats_path(out), sidecar_path(out, ".hist.png")


def profile_settings(profile_path: str | Path) -> dict[str, Any] | None:
    """How the profiles were sampled (PROFILE.stats.json's settings: the model, its template
    settings, the budget), passed on in the pivots' stats for training to check against; None
    when the profile file has no stats beside it."""
    path = stats_path(profile_path)
    try:
        settings = json.loads(path.read_text()).get("settings") or {}
    except (OSError, ValueError, AttributeError):
        return None
    return {k: settings.get(k) for k in ("model", "chat_template_kwargs", "response_format", "max_new_tokens")}


def unprofiled_reason(profile_path: str | Path) -> str:
    """Why an empty profile file is empty, read off its stats (PROFILE.stats.json): its run set
    every prompt aside as longer than the engine takes. "" when the stats say nothing of it."""
    try:
        runs = json.loads(stats_path(profile_path).read_text()).get("runs") or []
    except (OSError, ValueError, AttributeError):
        return ""
    too_long = sum(len(r.get("too_long") or {}) for r in runs if isinstance(r, dict))
    if not too_long:
        return ""
    return (f"the profile run that wrote it set all {too_long} turns aside as longer than the engine "
            f"takes (see {rejects_path(profile_path)} and the error `pivotrl profile` printed: it names "
            "the fix for the backend it used)")


def other_profiler(model: str | Path, settings: dict[str, Any] | None) -> str | None:
    """A warning when the pivots were profiled by another model than `model`, the policy about to
    be trained (None when the same or unknown). PivotRL keeps the turns the trained policy finds
    mixed; another model's pass rates (imported ones: `pivotrl.export.pass_rates`) keep turns that
    may be all-pass or all-fail for it."""
    profiler = (settings or {}).get("model")
    if not profiler or _same_model(str(profiler), str(model)):
        return None
    return (f"train: the pivots were selected on pass rates of {profiler}, not of {model}, the model "
            "trained here: PivotRL assumes the trained policy did the profiling, so some pivots may "
            f"give it no signal; re-profile (`pivotrl profile TURNS --model {model}`, then `pivotrl select`)")


def _same_model(a: str, b: str) -> bool:
    """One model named twice: the same string, or two paths to the same folder."""
    if a == b:
        return True
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    return pa.exists() and pb.exists() and pa.resolve() == pb.resolve()


def select_file(profile_path: str | Path, out_path: str | Path, cfg: SelectConfig,
                *, plot_png: bool = True, allow_empty: bool = False) -> dict[str, Any]:
    """Read a Profile file (bad lines → rejects file), write PIVOTS, PIVOTS.stats.json and the PNG.

    Streams, in two passes over the file: the first scores each profile and counts (`Selection`
    holds what its strategy needs, `Tally` counts), the second writes the kept profiles. No profile read, or none kept, raises EmptyResultError
    after the outputs are written (`pivotrl.io.empty`); `allow_empty` accepts 0 pivots."""
    check_input(profile_path)
    selection, tally = Selection(cfg), Tally(cfg)
    rejected, first = 0, None
    with ExitStack() as stack:  # the rejects file is opened at the first bad line: none if none
        rejects: AtomicWriter | None = None
        for _, rec in read_records(profile_path, Profile):
            if isinstance(rec, Reject):
                rejects = rejects or stack.enter_context(AtomicWriter(rejects_path(out_path)))
                rejects.write(rec.to_json())
                rejected, first = rejected + 1, first or rec
            else:
                scored = score(rec, cfg.success_threshold)
                selection.add(scored)
                tally.add(scored)
    require_some(tally.turns, "profiles", profile_path, rejected=rejected, first_reject=first,
                 expects="profiles", reason="" if rejected else unprofiled_reason(profile_path))
    with AtomicWriter(out_path) as writer:
        for _, rec in read_records(profile_path, Profile):
            if not isinstance(rec, Reject):
                scored = score(rec, cfg.success_threshold)
                if selection.keeps(scored):
                    writer.write(rec)
                    tally.add_kept(scored)
    stats = tally.stats()
    stats["rejected_lines"] = rejected
    stats["profile_settings"] = profile_settings(profile_path)
    spath, png = output_paths(out_path)
    if plot_png:
        stats["histogram"] = str(plot(tally, png))
    write_text_atomic(spath, json.dumps(stats, indent=2))
    require_some(stats["kept"], "pivots", profile_path, allow_empty=allow_empty, flag=ALLOW_EMPTY,
                 result=stats, reason=(
                     f"none of {stats['turns']} profiled turns is kept by the {cfg.strategy} rule "
                     f"({stats['all_fail']} all fail, {stats['all_pass']} all pass, "
                     f"{stats['mixed_but_too_easy']} mixed but success ≥ λ_diff "
                     f"{cfg.lambda_diff}, {stats['unverifiable']} unverifiable by the verifier; "
                     f"see {spath}); " + "; ".join(no_pivot_causes(stats, cfg))))
    return stats


# The judge recipe `select` shows when free text kept turns from being pivots.
JUDGE_RECIPE = ("serve a local judge model (`pivotrl serve --model JUDGE_MODEL --served-model-name judge "
                "--port 8001`) and profile again with `--verifier-config judge.yaml` holding `{unproven_rule: "
                "judge, message_rule: judge, judge: {base_url: 'http://127.0.0.1:8001/v1', model: judge}}` "
                "(docs/GUIDE.md: A local judge)")


def no_pivot_causes(stats: dict[str, Any], cfg: SelectConfig) -> list[str]:
    """Why no turn was kept, the largest cause first, each with what helps: invalid samples (the
    format), samples cut at the token budget, turns that fail only on free text (a judge); only
    when none of these explains it, the rule's own knobs (more samples, λ_diff)."""
    n, turns = stats["samples"] or 1, stats["turns"] or 1
    causes = []  # (share of the samples or turns it explains, text)
    if stats.get("truncated_samples"):
        causes.append((stats["truncated_samples"] / n, f"{stats['truncated_samples']} of {stats['samples']} samples "
                       "were cut at the token budget (finish 'length'): raise --max-new-tokens in profile "
                       "(a thinking model spends it thinking: or pass its chat-template kwargs to turn "
                       "thinking off)"))
    if stats.get("invalid_samples"):
        causes.append((stats["invalid_samples"] / n, f"{stats['invalid_samples']} of {stats['samples']} samples "
                       "were invalid (no action the parser could read: see each sample's `reason` in the "
                       "profile; the tool-call format is chosen from the chat template, --response-format "
                       "sets it)"))
    if stats.get("all_fail_on_free_text"):
        causes.append((stats["all_fail_on_free_text"] / turns, f"{stats['all_fail_on_free_text']} all-fail turns "
                       "failed only on free text (a message, or an argument such as an e-mail body, that "
                       "differs from the expert's word for word): no rule proves two texts mean the same, "
                       f"so such turns can never be pivots without a judge; {JUDGE_RECIPE}"))
    if not causes or max(c for c, _ in causes) < 0.5:
        causes.append((0, f"a larger K in profile (rare successes show up) or a higher --lambda-diff "
                       f"(now {cfg.lambda_diff}: keeps easier mixed turns) may keep some"))
    return [text for _, text in sorted(causes, key=lambda c: -c[0])]
