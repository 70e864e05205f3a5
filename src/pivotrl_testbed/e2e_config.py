"""The run config of the end-to-end RL baseline (`pivotrl e2e`), apart from the loop in
pivotrl_testbed/e2e.py so that the command line can list its fields without importing torch."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field

from pivotrl.io.yaml_config import field_like
from pivotrl.sampling.options import SamplingOptions
from pivotrl.train.config import GroupRLOptions, RunBasics


class E2ERunConfig(RunBasics, GroupRLOptions, SamplingOptions):
    """The end-to-end RL baseline: GRPO over whole episodes, reward = the world's success (0/1).
    Its optimizer, checkpoint and group-RL fields are GRPORunConfig's own (RunBasics,
    GroupRLOptions), so the two methods differ only in what they roll out."""

    world: str | None = Field(None, description="Registered world every episode runs in; None: each "
                              "task's metadata['world'] (mixed-world runs).")
    tasks: Path | list[Path] = Field(..., description="Task/Trajectory JSONL file(s) (e.g. testbed DIR/<world>/"
                                     "train.jsonl; only each record's opening messages and metadata are used).")
    tasks_per_step: int = Field(4, ge=1, description="Tasks per optimizer step (the analogue of pivots per step).")
    max_turns: int = Field(8, ge=1, description="Model turns per episode (the episode runner's MAX_TURNS).")
    max_completion_length: int = Field(96, ge=1, description="Tokens per model turn (ModelPolicy's default).")
    top_p: float = field_like(SamplingOptions, "top_p", ge=1.0, note="E2E: 1.0 only, its loss scores the "
                              "rollouts under softmax(logits / temperature).")
    micro_batch_size: int = Field(16, ge=1, description="Sequences per forward/backward pass (memory only, "
                                  "not the maths: gradients are accumulated over the whole step). An "
                                  "episode whose prompts extend each other token for token is one "
                                  "sequence, no longer than its last turn; otherwise each turn is one.")
    max_steps: int = Field(100, ge=1, description="Optimizer steps (ours).")

    path_fields: ClassVar[tuple[str, ...]] = ("model", "output_dir", "tasks", "split")
