"""Run configurations for `pivotrl train` (GRPO on pivots) and `pivotrl sft` (the SFT baseline).

One YAML file per run, any field overridable on the command line (`--field value`); every field
says where its default comes from. "paper" is PivotRL
(arXiv 2603.21383) and its published τ² recipe; "TRL" is the TRL 1.16 default; "ours" is a choice
made here, with the reason. Precedence: defaults < YAML < command line (io.yaml_config.YamlConfig).

How the schedule counts (docs/DESIGN.md, "Pitfalls designed against"): the train set holds ONE
row per pivot. One optimizer step consumes
`pivots_per_step = per_device_train_batch_size * num_processes * gradient_accumulation_steps
/ num_generations` pivots (each with its G completions). `num_epochs` passes over the pivot set
therefore take `ceil(num_epochs * n_pivots / pivots_per_step)` optimizer steps, and that number
is handed to TRL as `max_steps` (TRL never derives the schedule from a row count).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from pivotrl.formats.options import FormatOptions
from pivotrl.io.yaml_config import YamlConfig, field_like
from pivotrl.sampling.options import SamplingOptions
from pivotrl.verifiers.options import VerifierOptions


class LoraOptions(YamlConfig):
    enabled: bool = Field(False, description="Train LoRA adapters through PEFT instead of all weights "
                          "(ours: off, the paper trains full weights).")
    r: int = Field(16, description="LoRA rank (PEFT's common starting point).")
    alpha: int = Field(32, description="LoRA alpha (2×r, the usual PEFT recipe).")
    dropout: float = Field(0.05, description="LoRA dropout (PEFT examples).")
    target_modules: list[str] | str = Field("all-linear", description="Modules that get adapters "
                                            "(PEFT's 'all-linear' covers attention and MLP).")

    def peft_config(self, task_type: str = "CAUSAL_LM", model: str | None = None):
        """PEFT's LoraConfig; `model` (its folder or hub id) lets 'all-linear' leave out what PEFT
        refuses on Mamba-based models (Nemotron-H, Falcon-H1: the Mamba mixer's out_proj)."""
        if not self.enabled:
            return None
        from peft import LoraConfig

        exclude = None
        if self.target_modules == "all-linear" and model is not None and _model_type(model) in MAMBA_MODEL_TYPES:
            exclude = list(MAMBA_NO_LORA)
        return LoraConfig(r=self.r, lora_alpha=self.alpha, lora_dropout=self.dropout,
                          target_modules=self.target_modules, exclude_modules=exclude, task_type=task_type)


# PEFT 0.21 refuses LoRA on these modules of these model types (peft.tuners.tuners_utils).
MAMBA_MODEL_TYPES = frozenset({"falcon_h1", "mamba", "mamba2", "falcon_mamba", "nemotron_h"})
MAMBA_NO_LORA = ("out_proj", "conv1d")


def _model_type(model: str) -> str | None:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(model).model_type
    except (OSError, ValueError):
        return None


class ReprofileOptions(YamlConfig):
    enabled: bool = Field(False, description="Re-profile the pivots during training and drop those the "
                          "policy has mastered (off: the paper profiles once).")
    threshold: float = Field(0.9, description="Batch reward mean that triggers a re-profile (train.reprofile.ReprofileHook).")
    every_n_steps: int = Field(50, description="Least number of optimizer steps between two re-profiles.")
    options: dict[str, Any] = Field(default_factory=dict, description="ProfileConfig fields of the "
                                    "re-profiling (k, verifier, max_new_tokens, …); by default the "
                                    "rollouts' verifier, sampling, format and budget, k = 8.")


class RunBasics(YamlConfig):
    """What every training run has, whichever loop trains it (TRL's for `train` and `sft`, the
    testbed's E2E loop): its model and folder, the optimizer's settings, checkpoints and logs."""

    model: str = Field(..., description="Policy to start from: a local HF directory or hub id (for PivotRL "
                       "the same π0 that profiled the turns).")
    output_dir: Path = Field(..., description="Where checkpoints, the final model + tokenizer and metrics.jsonl go.")
    learning_rate: float = Field(1e-6, description="Peak learning rate (paper: 1e-6 for 30B-scale models; the "
                                 "testbed configs set their own, ~1e-4 for 1M-parameter models).")
    warmup_steps: int = Field(0, ge=0, description="Linear warmup in optimizer steps (TRL: 0).")
    weight_decay: float = Field(0.0, description="AdamW weight decay (TRL: 0).")
    max_grad_norm: float = Field(1.0, description="Gradient clipping norm (TRL: 1.0).")
    save_steps: int = Field(50, ge=1, description="Checkpoint every N optimizer steps (ours): a resumed run "
                            "continues from the last one.")
    resume: bool = Field(False, description="Continue from the last checkpoint-* in output_dir (--resume), on "
                         "the input files the run started on (a changed one is an error).")
    overwrite: bool = Field(False, description="Delete what an earlier run wrote in output_dir (checkpoints, "
                            "metrics, log, model; never an input, nor a folder no run wrote) first; without "
                            "it or --resume a non-empty output_dir is an error.")
    logging_steps: int = Field(1, ge=1, description="Log (and append to metrics.jsonl) every N steps (ours: every step).")
    seed: int = Field(0, description="Seed of sampling, shuffling and init (ours).")
    split: Path | None = Field(None, description="Split file of `pivotrl extract --eval-fraction` "
                               "(TURNS.split.json): records of its eval trajectories are dropped and "
                               "counted, never trained on. None: the one beside the data file, if any "
                               "(pivotrl.io.split).")
    progress_seconds: float = Field(30.0, ge=0, description="Seconds between progress lines (step, "
                                    "s/step, ETA, reward or loss) on stderr and in OUTPUT_DIR/train.log "
                                    "(ours; 0: every logged step).")

    path_fields: ClassVar[tuple[str, ...]] = ("model", "output_dir", "split")


class GroupRLOptions(BaseModel):
    """The group-RL settings both RL methods share (PivotRL's GRPO and the E2E baseline), so the two
    differ only in what they roll out."""

    num_generations: int = Field(16, ge=1, description="G completions per pivot (paper τ² recipe: 16).")
    max_completion_length: int | None = Field(None, ge=1, description="Tokens per completion. None (ours): "
                                              "4096 for a thinking model (its reasoning comes first), else 256 "
                                              "(one action); see pivotrl.formats.families.token_budget. Cut "
                                              "completions are logged as truncated_rate.")
    epsilon: float = Field(0.2, description="Lower clip ε (paper/DAPO clip-higher recipe: 0.2).")
    epsilon_high: float = Field(0.28, description="Upper clip ε_high (paper/DAPO clip-higher: 0.28).")
    num_iterations: int = Field(1, ge=1, description="Optimizer passes per generated batch (TRL μ: 1, on-policy).")


class _RunCommon(RunBasics):
    """A run TRL trains (`train`, `sft`): TRL's schedule, precision, trackers and LoRA."""

    trl_config_name: ClassVar[str] = "TrainingArguments"  # the TRL config its trl_overrides are checked against

    lr_scheduler_type: str = Field("constant_with_warmup", description="transformers scheduler name (ours: "
                                   "constant after warmup, as in the paper's RL recipe; 'cosine' for decay).")
    gradient_accumulation_steps: int = Field(1, ge=1, description="Micro-steps per optimizer step (TRL: 1).")
    max_steps: int | None = Field(None, ge=1, description="Optimizer steps; when set it wins over num_epochs.")
    num_epochs: float = Field(1.0, gt=0, description="Passes over the data (GRPO: over PIVOTS, see module doc).")
    save_total_limit: int | None = Field(None, description="Keep at most N checkpoints (None: all; TRL).")
    max_dropped_fraction: float = Field(0.5, ge=0, le=1, description="Refuse a run that would set aside more "
                                        "than this fraction of its train turns (too long, unreadable) before "
                                        "training; above 5% the plan warns (ours: past half, the run trains "
                                        "on other data than the one it was given; 1 allows any).")
    report_to: Literal["none", "tensorboard", "wandb"] = Field("none", description="Experiment tracker "
                                                              "(ours: none; metrics.jsonl is always written).")
    precision: Literal["auto", "bf16", "fp32"] = Field("auto", description="auto: bf16 on GPUs that support it, "
                                                      "fp32 on CPU (bf16 autocast on CPU is ~16× slower, docs/DESIGN.md).")
    gradient_checkpointing: bool = Field(False, description="Recompute activations (TRL: True; ours: False, "
                                         "2× slower on small models — turn on for big ones).")
    lora: LoraOptions = Field(default_factory=LoraOptions, description="PEFT LoRA options.")
    trl_overrides: dict[str, Any] = Field(default_factory=dict, description="Fields of TRL's GRPOConfig / "
                                          "SFTConfig that pivotrl does not model (e.g. deepspeed, fsdp, "
                                          "optim, adam_beta2), passed to TRL as given. A pivotrl setting "
                                          "(num_generations, beta, learning_rate, ...) is refused with its "
                                          "flag, a key TRL does not have is an error, and each value is "
                                          "checked against the TRL field's type (pivotrl.train.trl_overrides).")

    @field_validator("trl_overrides")
    @classmethod
    def _only_what_pivotrl_does_not_model(cls, value: dict[str, Any]) -> dict[str, Any]:
        from pivotrl.train.trl_overrides import checked_trl_overrides

        return checked_trl_overrides(value, cls.trl_config_name, set(cls.model_fields))

    @field_validator("report_to")
    @classmethod
    def _tracker_installed(cls, value: str) -> str:
        # Checked here, not after data loading: a missing tracker is the user's to install.
        from pivotrl.io.inputs import check_tracker

        check_tracker(value)
        return value

    def bf16(self) -> bool:
        if self.precision == "fp32":
            return False
        if self.precision == "bf16":
            return True
        import torch

        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())


class GRPORunConfig(_RunCommon, GroupRLOptions, SamplingOptions, VerifierOptions, FormatOptions):
    trl_config_name: ClassVar[str] = "GRPOConfig"

    pivots: Path = Field(..., description="Pivots JSONL (Turn/Profile records, the output of `pivotrl select`; "
                         "its --strategy all|random gives the ablations' training states).")
    invalid_action_penalty: float = Field(0.0, description="Reward of an unparseable completion (docs/DESIGN.md: "
                                          "0, never more than a wrong action; use <0 to punish format errors).")
    max_prompt_length: int | None = Field(None, description="Pivots whose prompt is longer (tokens) are "
                                          "dropped and counted (TRL 1.16 has no prompt truncation; cutting a "
                                          "chat prompt would break it). None (ours): the model's context "
                                          "less max_completion_length (train.grpo.with_prompt_cap).")
    beta: float = Field(0.0, description="KL coefficient to the reference model (paper: 0, no KL).")
    loss_type: str = Field("dapo", description="Token-level loss normalised over all tokens of the batch "
                           "(paper: token-level; TRL 1.16 calls it 'dapo').")
    scale_rewards: Literal["group", "batch", "none"] = Field("group", description="Advantage normalisation "
                                                             "(paper: group-normalised, GRPO).")
    use_vllm: bool = Field(False, description="Generate with vLLM (GPU only; `pip install pivotrl[vllm]`).")
    vllm_mode: Literal["colocate", "server"] = Field("colocate", description="vLLM in the training processes "
                                                     "(colocate) or a separate `trl vllm-serve` (server); TRL.")
    vllm_gpu_memory_utilization: float = Field(0.3, description="GPU memory share of colocated vLLM (TRL: 0.3).")
    shared_prefix_loss: bool = Field(True, description="Encode each pivot's prompt once per group in the "
                                     "GRPO loss forward/backward, every completion attending to its keys/values "
                                     "(ours, Prefix Grouper; same log-probs and gradients as TRL's repeated-prompt "
                                     "path, train/shared_prefix.py). Models it cannot serve (multimodal, unknown "
                                     "layer kinds) and False use TRL's path.")
    shared_rollouts: bool = Field(True, description="Draw the GRPO rollouts with pivotrl's generation loop "
                                  "(each prompt prefilled once for its G samples; the distribution TRL samples: "
                                  "softmax(logits / temperature) within the top-p nucleus) instead of TRL's "
                                  "generate over G prompt copies: about half of a CPU step's time "
                                  "(bench/bench_grpo_step.py). Ours: on; vLLM, multimodal models, FSDP and other "
                                  "sampling options keep TRL's generation (train/shared_prefix.py "
                                  "rollout_fallback_reason), and False always does.")
    reprofile: ReprofileOptions = Field(default_factory=ReprofileOptions, description="Re-profiling hook.")
    per_device_train_batch_size: int | None = Field(None, ge=1, description="Completions per device per "
                                                    "micro-step. None (ours): 4 × num_generations, i.e. 4 "
                                                    "pivots per step (64 with G=16). One pivot per step "
                                                    "(batch = G) made a step's gradient so noisy on the "
                                                    "testbed that held-out accuracy fell.")

    @model_validator(mode="after")
    def _four_pivots_per_step(self) -> "GRPORunConfig":
        # The batch follows G, so changing num_generations alone keeps 4 pivots per step.
        if self.per_device_train_batch_size is None:
            self.per_device_train_batch_size = 4 * self.num_generations
        return self

    path_fields: ClassVar[tuple[str, ...]] = ("model", "output_dir", "pivots", "split")

    def pivots_per_step(self, num_processes: int = 1) -> float:
        return self.per_device_train_batch_size * num_processes * self.gradient_accumulation_steps / self.num_generations

    def total_steps(self, n_pivots: int, num_processes: int = 1) -> int:
        """Optimizer steps of the run: max_steps, else epochs over the pivots (one row per pivot)."""
        if self.max_steps is not None:
            return self.max_steps
        return max(1, math.ceil(self.num_epochs * n_pivots / self.pivots_per_step(num_processes)))


class SFTRunConfig(_RunCommon):
    trl_config_name: ClassVar[str] = "SFTConfig"

    data: Path | list[Path] = Field(..., description="Trajectory JSONL file(s): the SAME trajectories the "
                                    "pivots were extracted from.")
    learning_rate: float = Field(1e-5, description="Peak learning rate (ours for real models, SFT's usual "
                                 "range; the testbed config sets its own).")
    lr_scheduler_type: str = Field("cosine", description="transformers scheduler name (ours: cosine, the "
                                   "usual SFT schedule).")
    per_device_train_batch_size: int = Field(8, description="Trajectories per device per micro-step (TRL: 8).")
    chat_template_kwargs: dict[str, Any] = field_like(FormatOptions, "chat_template_kwargs")
    max_length: int | None = Field(None, ge=1, description="Tokens per trajectory; longer ones are dropped "
                                   "and counted (cutting would leave half an action in the loss). Default: "
                                   "the model's context, the rule `train`'s prompt cap follows, so that SFT "
                                   "and PivotRL train on the same turns (ours).")
    assistant_only_loss: bool = Field(True, description="Loss on assistant tokens only (paper's SFT "
                                      "baseline). Marked by the template's {% generation %} markers, TRL's "
                                      "training template of a known family, or (Llama 3.1/3.2) rendered "
                                      "prefixes: train/sft.py sft_template.")

    path_fields: ClassVar[tuple[str, ...]] = ("model", "output_dir", "data", "split")

    def total_steps(self, n_rows: int, num_processes: int = 1) -> int:
        if self.max_steps is not None:
            return self.max_steps
        per_step = self.per_device_train_batch_size * num_processes * self.gradient_accumulation_steps
        return max(1, math.ceil(self.num_epochs * n_rows / per_step))


def trl_common_kwargs(cfg: _RunCommon, total_steps: int) -> dict[str, Any]:
    """The TrainingArguments both trainers share, from a run config."""
    import torch

    kwargs: dict[str, Any] = dict(
        output_dir=str(cfg.output_dir), learning_rate=cfg.learning_rate,
        lr_scheduler_type=cfg.lr_scheduler_type, warmup_steps=cfg.warmup_steps,
        weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm,
        per_device_train_batch_size=cfg.per_device_train_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps, max_steps=total_steps,
        save_strategy="steps", save_steps=cfg.save_steps, save_total_limit=cfg.save_total_limit,
        logging_steps=cfg.logging_steps, report_to=[] if cfg.report_to == "none" else [cfg.report_to],
        seed=cfg.seed, bf16=cfg.bf16(), gradient_checkpointing=cfg.gradient_checkpointing,
        use_cpu=not torch.cuda.is_available(), disable_tqdm=True,
        # A resume skips the batches its epoch already trained (train/resume.py); the re-profiling
        # loop turns this on for the pivots it swapped in, which no step has trained yet.
        ignore_data_skip=False,
    )
    return kwargs


class LauncherError(ValueError):
    """A launcher's sharding that this machine would not run (the run would silently not shard)."""


def check_launcher_sharding(cuda_available: bool | None = None) -> None:
    """Refuse an FSDP or DeepSpeed launch (`accelerate launch --config_file fsdp.yaml`, ...) on a
    machine without CUDA. Why: accelerate 1.16 turns FSDP on only for accelerator process groups
    and DeepSpeed only off CPU; on CPU both become plain data parallelism (every process holds the
    whole model) with no word said, which is not the run that was asked for."""
    import os

    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    asked = [name for name, env in (("FSDP", "ACCELERATE_USE_FSDP"), ("DeepSpeed", "ACCELERATE_USE_DEEPSPEED"))
             if os.environ.get(env, "false").lower() == "true"]
    if asked and not cuda_available:
        raise LauncherError(
            f"the launcher asks for {asked[0]}, which accelerate runs only on GPUs: on this machine (no CUDA) "
            "it would train every process on the whole model as plain data parallelism. For several CPU "
            "processes use configs/accelerate/cpu_2proc.yaml (the same run, unsharded)")


def with_trl_overrides(kwargs: dict[str, Any], overrides: dict[str, Any], trl_config: type) -> dict[str, Any]:
    """`kwargs` (what pivotrl derives) with the run's `trl_overrides` added: TRL fields pivotrl does
    not model (pivotrl.train.trl_overrides). One door for each setting: an override of a field
    pivotrl derives, or a key that `trl_config` (TRL's GRPOConfig or SFTConfig) does not have, is a
    ValueError naming it, never a setting that silently wins or is dropped."""
    from pivotrl.train.trl_overrides import checked_trl_overrides

    checked = checked_trl_overrides(overrides, trl_config.__name__, set())
    derived = sorted(set(kwargs) & set(checked))
    if derived:
        raise ValueError(f"trl_overrides: {', '.join(map(repr, derived))} set by pivotrl from the run "
                         "config; set the run config's field instead")
    return {**kwargs, **checked}
