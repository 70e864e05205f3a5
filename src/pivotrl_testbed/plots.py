"""The demo report's PNG plots, drawn from results.json's content (descriptive: every checkpoint on
the dev split, and every label says so; the verdicts use the dev-chosen checkpoints on the eval
split). The frontier carries the curves' 95% intervals over seeds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

MEASURES = {"in_domain": "episode success", "turn_accuracy": "turn accuracy"}


def frontier(points: list[dict[str, Any]], key: str = "in_domain") -> list[dict[str, Any]]:
    """Pareto frontier (higher in-domain `key` and higher OOD are better), sorted by `key`."""
    pts = sorted(points, key=lambda p: (-p[key], -p["ood"]))
    out, best_ood = [], -1.0
    for p in pts:
        if p["ood"] > best_ood:
            out.append(p)
            best_ood = p["ood"]
    return sorted(out, key=lambda p: p[key])


def _errors(points: list[dict[str, Any]], key: str) -> list[list[float]] | None:
    """Asymmetric error bars from each point's `<key>_ci95` (None when a point has none)."""
    cis = [p.get(f"{key}_ci95") for p in points]
    if not points or any(ci is None for ci in cis):
        return None
    return [[max(0.0, p[key] - lo) for p, (lo, _) in zip(points, cis)],
            [max(0.0, hi - p[key]) for p, (_, hi) in zip(points, cis)]]


def _turn_ticks(ax, values: list[float], most: int = 7) -> None:
    """A symlog x axis labelled at the data's own values (at most `most`, spread evenly over
    the sorted values), in plain numbers: symlog's default locator can leave a range within one
    decade with no label at all."""
    from matplotlib.ticker import FixedLocator, NullLocator

    ax.set_xscale("symlog", linthresh=max(1.0, min((v for v in values if v > 0), default=1.0)))
    ticks = sorted(set(values))
    if len(ticks) > most:
        ticks = [ticks[round(i * (len(ticks) - 1) / (most - 1))] for i in range(most)]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(ticks, [f"{v:,.0f}" for v in ticks], rotation=30, fontsize=8)


def plot_all(results: dict[str, Any], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {m: v["checkpoints"] for m, v in results["methods"].items()}
    keys = [k for k in MEASURES if all(p.get(k) is not None for c in curves.values() for p in c)]
    decoding = next((p.get("decoding", "greedy") for c in curves.values() for p in c), "greedy")
    files: list[str] = []

    def save(fig, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        files.append(name)

    fig, axes = plt.subplots(1, len(keys), figsize=(6.5 * len(keys), 5), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for m, pts in curves.items():
            if m == "base":
                ax.scatter([pts[0][key]], [pts[0]["ood"]], marker="*", s=160, c="k", label="base")
                continue
            front = frontier(pts, key)
            ax.scatter([p[key] for p in pts], [p["ood"] for p in pts], s=12, alpha=0.4)
            line, = ax.plot([p[key] for p in front], [p["ood"] for p in front], marker="o", label=m)
            ax.errorbar([p[key] for p in front], [p["ood"] for p in front],
                        xerr=_errors(front, key), yerr=_errors(front, "ood"), fmt="none",
                        ecolor=line.get_color(), alpha=0.6, capsize=3)
        ax.set_xlabel(f"dev {MEASURES[key]}, {decoding} (mean over worlds)")
        ax.set_ylabel(f"dev non-agentic OOD accuracy, {decoding} (mean over families)")
        seeds = max((p.get("seeds", 1) for c in curves.values() for p in c), default=1)
        bars = ("bars: 95% interval over seeds" if seeds > 1
                else "one seed: no interval over seeds to draw")
        ax.set_title(f"{MEASURES[key]}, dev split: every checkpoint (dots), frontier (lines); "
                     f"{bars}; descriptive", fontsize=8)
        ax.legend(fontsize=8)
    save(fig, "frontier.png")

    fig, axes = plt.subplots(1, len(keys), figsize=(6.5 * len(keys), 4.5), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for m in ("pivotrl", "e2e_rl"):
            for lr in sorted({p["lr"] for p in curves.get(m, [])}):
                pts = [p for p in curves[m] if p["lr"] == lr]
                ax.plot([p["rollout_turns"] for p in pts], [p[key] for p in pts],
                        marker="o", label=f"{m} lr={lr:g}")
        ax.set_xlabel("rollout turns spent (model turns generated, profiling included)")
        ax.set_ylabel(f"dev {MEASURES[key]}, {decoding}")
        ax.set_title(f"{MEASURES[key]} per checkpoint, dev split", fontsize=9)
        _turn_ticks(ax, [p["rollout_turns"] for m in ("pivotrl", "e2e_rl")
                         for p in curves.get(m, [])])
        if ax.get_legend_handles_labels()[0]:  # no RL arm ran (an SFT-only run): no legend
            ax.legend(fontsize=8)
    save(fig, "compute.png")

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for m, v in results["methods"].items():
        lr = v.get("chosen", {}).get("lr")
        pts = [p for p in curves[m] if m != "base" and p["lr"] == lr]
        if pts:
            for ax, key in zip(axes, ("kl_to_base", "rank_corr")):
                ax.plot([0] + [p["step"] for p in pts], [0.0 if key == "kl_to_base" else 1.0]
                        + [p[key] for p in pts], marker="o", label=f"{m} lr={lr:g}")
    for ax, label in zip(axes, ("KL to base on OOD text", "rank corr. of the base's top tokens")):
        ax.set_xlabel("optimizer step (each method at its dev-chosen lr)")
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    save(fig, "theory_drift.png")

    th = results["theory"]
    pts = [p for p in th.get("points", []) if p["reward_std"] > 0]
    if pts:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        std = [p["reward_std"] for p in pts]
        for ax, key, label in ((axes[0], "grad_norm", "plain policy-gradient norm"),
                               (axes[1], "progress", "held-out progress per unit step")):
            ax.scatter(std, [p[key] for p in pts], s=14, label="verifier rewards")
            ax.scatter(std, [p[f"null_{key}"] for p in pts], s=14, marker="x",
                       label="null: rewards shuffled within the state")
            ax.set_xlabel("reward std at the state (G samples of the base)")
            ax.set_ylabel(label)
            ax.legend(fontsize=8)
        axes[0].set_title("Theorem 3.2: the norm rises with std under the null too", fontsize=9)
        axes[1].set_title("Theorem 3.2: only real rewards should give progress", fontsize=9)
        save(fig, "theory_grad_vs_std.png")
    return files
