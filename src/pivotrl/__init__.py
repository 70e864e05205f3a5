"""pivotrl: PivotRL (arXiv 2603.21383) — RL on the pivot turns of existing agent trajectories."""

__version__ = "0.1.0"
