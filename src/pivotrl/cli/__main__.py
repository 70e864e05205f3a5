"""`python -m pivotrl.cli` (what `accelerate launch -m` and `torchrun -m` run)."""

from pivotrl.cli import app

app()
