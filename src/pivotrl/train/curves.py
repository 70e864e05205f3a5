"""`curves.png` in a run folder: the learning curves of its metrics.jsonl, one panel per metric
by optimizer step, so a run shows at a glance whether it learned (redrawn at each checkpoint and
at the end: `pivotrl.train.run_card`).

A metric a run did not log (TRL logs KL only when beta > 0; a testbed E2E run logs no entropy)
gets an empty panel that says so, never an error: the figure is a report, and a report must not
stop a run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

CURVES_FILE = "curves.png"
# (metrics.jsonl key, panel title) per kind of run
RL_CURVES = (("reward_mean", "reward (mean over completions)"), ("loss", "loss"), ("kl", "KL to the reference"),
             ("entropy", "entropy"))
SFT_CURVES = (("loss", "loss"), ("mean_token_accuracy", "token accuracy"))


def series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of `key` over the rows that logged it as a number."""
    points = [(r["step"], float(r[key])) for r in rows
              if isinstance(r.get("step"), int) and isinstance(r.get(key), (int, float))]
    return [s for s, _ in points], [v for _, v in points]


def plot_curves(rows: list[dict[str, Any]], path: str | Path, curves=RL_CURVES, title: str = "") -> Path:
    """Draw `curves` ((key, title) pairs) of `rows` (metrics.jsonl rows) by step into `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    path = Path(path)
    fig, axes = plt.subplots(1, len(curves), figsize=(3.6 * len(curves), 3.2), squeeze=False)
    for ax, (key, label) in zip(axes[0], curves):
        steps, values = series(rows, key)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("optimizer step")
        if not steps:
            ax.text(0.5, 0.5, f"{key}: not logged", ha="center", va="center", transform=ax.transAxes,
                    color="gray")
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        # A marker on every point: a run of one or two steps draws no visible line.
        ax.plot(steps, values, marker="o", markersize=3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
