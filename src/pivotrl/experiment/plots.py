"""The demo report's PNG plots, drawn from results.json's content (descriptive: every checkpoint on
the dev split; the verdicts use the dev-chosen checkpoints on the eval split)."""

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


def plot_all(results: dict[str, Any], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {m: v["checkpoints"] for m, v in results["methods"].items()}
    keys = [k for k in MEASURES if all(p.get(k) is not None for c in curves.values() for p in c)]
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
            ax.plot([p[key] for p in front], [p["ood"] for p in front], marker="o", label=m)
        ax.set_xlabel(f"eval {MEASURES[key]} (mean over worlds)")
        ax.set_ylabel("eval OOD accuracy (mean over families)")
        ax.set_title(f"{MEASURES[key]}: every checkpoint (dots), frontier (lines); descriptive",
                     fontsize=9)
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
        ax.set_ylabel(f"eval {MEASURES[key]}")
        ax.set_xscale("symlog")
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
