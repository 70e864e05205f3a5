"""The run config of the end-to-end RL baseline (`pivotrl e2e`), apart from the loop in
pivotrl_testbed/e2e.py so that the command line can list its fields without importing torch."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field

from pivotrl.io.yaml_config import YamlConfig, field_like
from pivotrl.sampling.options import SamplingOptions


class E2ERunConfig(YamlConfig, SamplingOptions):
    """The end-to-end RL baseline: GRPO over whole episodes, reward = the world's success (0/1).
    Optimizer settings mirror GRPORunConfig so the two methods differ only in what they roll out."""

    model: str = Field(..., description="Policy to start from (the same base as PivotRL's run).")
    output_dir: Path = Field(..., description="Final model + tokenizer, checkpoint-N/ and metrics.jsonl.")
    world: str | None = Field(None, description="Registered world every episode runs in; None: each "
                              "task's metadata['world'] (mixed-world runs).")
    tasks: Path | list[Path] = Field(..., description="Task/Trajectory JSONL file(s) (e.g. testbed DIR/<world>/"
                                     "train.jsonl; only each record's opening messages and metadata are used).")
    tasks_per_step: int = Field(4, description="Tasks per optimizer step (the analogue of pivots per step).")
    num_generations: int = Field(16, description="G episodes per task (paper's G, as for PivotRL).")
    max_turns: int = Field(8, description="Model turns per episode (the episode runner's MAX_TURNS).")
    max_completion_length: int = Field(96, description="Tokens per model turn (ModelPolicy's default).")
    top_p: float = field_like(SamplingOptions, "top_p", ge=1.0, note="E2E: 1.0 only, its loss scores the "
                              "rollouts under softmax(logits / temperature).")
    learning_rate: float = Field(1e-6, description="Peak learning rate (as GRPORunConfig: paper 1e-6; the "
                                 "testbed sets its own).")
    warmup_steps: int = Field(0, description="Linear warmup steps, then constant (as GRPORunConfig).")
    weight_decay: float = Field(0.0, description="AdamW weight decay (TRL: 0).")
    max_grad_norm: float = Field(1.0, description="Gradient clipping norm (TRL: 1.0).")
    epsilon: float = Field(0.2, description="Lower clip ε (as GRPORunConfig).")
    epsilon_high: float = Field(0.28, description="Upper clip ε_high (as GRPORunConfig).")
    num_iterations: int = Field(1, description="Optimizer passes per batch of episodes (TRL μ: 1).")
    micro_batch_size: int = Field(16, description="Sequences per forward/backward pass (memory only, "
                                  "not the maths: gradients are accumulated over the whole step). An "
                                  "episode whose prompts extend each other token for token is one "
                                  "sequence, no longer than its last turn; otherwise each turn is one.")
    max_steps: int = Field(100, description="Optimizer steps (ours).")
    save_steps: int = Field(50, description="Write checkpoint-N every N steps (ours): the weights "
                            "and what a resumed run needs (optimizer, schedule, RNG, task order).")
    resume: bool = Field(False, description="Continue from the last checkpoint-N in output_dir "
                         "(metrics of later steps are dropped): the same run as one uninterrupted.")
    overwrite: bool = Field(False, description="Delete what an earlier run wrote in output_dir first (never an "
                            "input, nor a folder no run wrote); without it or --resume a non-empty "
                            "output_dir is an error.")
    logging_steps: int = Field(1, description="Append to metrics.jsonl every N steps.")
    seed: int = Field(0, description="Seed of task order and sampling.")
    split: Path | None = Field(None, description="Split file of `pivotrl extract --eval-fraction` "
                               "(TURNS.split.json): its eval trajectories are never trained on. None: the "
                               "one beside the tasks file, if any (pivotrl.io.split).")
    progress_seconds: float = Field(30.0, ge=0, description="Seconds between progress lines on stderr and "
                                    "in OUTPUT_DIR/train.log (0: every step).")

    path_fields: ClassVar[tuple[str, ...]] = ("model", "output_dir", "tasks", "split")
