"""`pivotrl train` (GRPO on pivots) and `pivotrl sft` (the SFT baseline): a run config in, its plan
printed and saved, a checkpoint folder and a summary table out (pivotrl.cli.run_verb)."""

from __future__ import annotations

from pivotrl.cli.run_verb import training_verb
from pivotrl.train.config import GRPORunConfig, SFTRunConfig

train = training_verb(
    "train", GRPORunConfig, "pivotrl.train.grpo:train", example="configs/train_testbed.yaml",
    doc="""GRPO on pivots (TRL GRPOTrainer); works under `accelerate launch` too. Give a run YAML, or the
    required fields as flags: `pivotrl train --pivots P --model M --output-dir D`.""")

sft = training_verb(
    "sft", SFTRunConfig, "pivotrl.train.sft:train_sft", example="configs/sft_testbed.yaml", raw_data="data",
    doc="""The SFT baseline on the same trajectories (TRL SFTTrainer, loss on assistant turns only). Give
    a run YAML, or the required fields as flags: `pivotrl sft --data T --model M --output-dir D`.""")
