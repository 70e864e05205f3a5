"""`pivotrl train`: TRL GRPOTrainer on pivot states (one-turn rollouts, verifier reward).

Prompts are pre-rendered to plain text with `chat.prompt_text` (the model's own chat template,
with the pivot's own tools). TRL 1.16 renders conversational prompts with ONE trainer-wide tool
list (`GRPOTrainer(tools=...)`, which it also executes); pivots from different trajectories carry
different tool schemas, so per-row rendering has to happen here. It is also exactly the text
profiling and evaluation prompt with, so the policy sees the same prompt in every stage.

The same code runs on one CPU, under `accelerate launch` (DDP, DeepSpeed ZeRO, FSDP) and with vLLM
generation on GPUs: all of that is TRL's, switched by the run config and the accelerate config.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers.trainer_utils import get_last_checkpoint

from pivotrl.formats.chat import load_tokenizer, prompt_text, prompt_token_ids
from pivotrl.formats.length_bound import length_bound
from pivotrl.formats.options import template_mismatch, write_template_settings
from pivotrl.io.inputs import check_chat_template, check_input_file, check_model
from pivotrl.io.run_folder import claim_run_folder, finish_run, start_run
from pivotrl.io.records import Turn, stats_path
from pivotrl.sampling.pipeline import check_budget, context_length
from pivotrl.io.split import HeldOut, resolve_split, split_file
from pivotrl.io.turn_files import iter_pivots
from pivotrl.train.config import GRPORunConfig, check_launcher_sharding, trl_common_kwargs, with_trl_overrides
from pivotrl.train.learning_signal import NoMixedOutcomesWarning, learning_signal
from pivotrl.train.metrics import (MetricsJSONL, ProgressLines, TrackerLogPath, final_and_best, final_and_best_text,
                                   quiet_trainer, read_metric_rows, say_and_log)
from pivotrl.profile.loop import ProfileConfig
from pivotrl.io.run_plan import Launch, NothingToRun
from pivotrl.train.plan import begin_training, grpo_plan
from pivotrl.train.reprofile import ReprofileCallback, ReprofileHook
from pivotrl.train.reward import PivotReward
from pivotrl.train.run_card import RL_REPORT, RunReport, grpo_card_facts, write_run_report
from pivotrl.train.saved_config import base_settings
from pivotrl.train.trainer import PivotGRPOTrainer

logger = logging.getLogger(__name__)

_TURN_FIELDS = set(Turn.model_fields)


def world_size() -> int:
    """Processes of this run, read from the launcher's environment. (Building an accelerate
    PartialState here would fix its device before TRL asks for CPU, and on a CPU machine leave every
    process thinking it is alone.)"""
    return int(os.environ.get("WORLD_SIZE", "1"))


def turn_json(turn: Turn) -> str:
    """The Turn part of a Turn/Profile record as a JSON string column (profile samples dropped)."""
    data = turn.model_dump(mode="json", exclude_none=True)
    return json.dumps({k: v for k, v in data.items() if k in _TURN_FIELDS}, ensure_ascii=False)


def load_pivot_set(cfg: GRPORunConfig, held_out: HeldOut | None = None) -> Sequence[Turn]:
    """The training states: the pivots file (whatever `pivotrl select --strategy` kept: the
    pivots, or the all/random ablations), less the turns of `held_out`'s eval trajectories
    (counted there)."""
    held_out = held_out or HeldOut(None)
    # Read lazily (row offsets; a pivot is parsed when asked): a run holds no pivot set in memory.
    pivots = iter_pivots(cfg.pivots)
    if held_out.split is not None:
        pivots = pivots.where(lambda t: held_out.keep(t.trajectory_id))
    return pivots


@dataclass
class PromptSet:
    """The rendered training rows {"prompt", "turn", "id"}: in memory (`rows`), or written to a
    JSONL file (`path`) that the trainer reads as a memory-mapped Arrow dataset, so a run holds
    no prompt set in memory however many pivots it has."""

    rows: list[dict[str, str]]
    dropped: list[tuple[str, str]] = field(default_factory=list)  # (turn id, reason)
    path: Path | None = None
    written: int = 0

    def __len__(self) -> int:
        return self.written if self.path is not None else len(self.rows)

    def dataset(self, cache_dir: Path):
        from datasets import Dataset

        if self.path is None:
            return Dataset.from_list(self.rows)
        return Dataset.from_json(str(self.path), cache_dir=str(cache_dir), keep_in_memory=False)


def spill_path(cfg: GRPORunConfig) -> Path:
    """Where this process writes its prompt rows (one file per rank: no two writers share one)."""
    return Path(cfg.output_dir) / f"prompts.rank{os.environ.get('RANK', '0')}.jsonl"


def build_prompts(turns: Iterable[Turn], tokenizer: Any, max_prompt_length: int | None = None,
                  chat_kwargs: dict[str, Any] | None = None, spill: Path | None = None) -> PromptSet:
    """One row per pivot: {"prompt": text, "turn": Turn JSON, "id"}, each prompt rendered once;
    kept in memory, or streamed to `spill`. Over-long prompts are dropped and reported (TRL 1.16
    would feed them whole; cutting a chat prompt corrupts it)."""
    out = PromptSet(rows=[], path=spill)
    sink = None
    if spill is not None:
        spill.parent.mkdir(parents=True, exist_ok=True)
        sink = spill.open("w", encoding="utf-8")
    try:
        for turn in turns:
            row = _prompt_row(turn, tokenizer, max_prompt_length, chat_kwargs, out.dropped)
            if row is None:
                continue
            if sink is None:
                out.rows.append(row)
            else:
                sink.write(json.dumps(row, ensure_ascii=False) + "\n")
                out.written += 1
    finally:
        if sink is not None:
            sink.close()
    return out


def _prompt_row(turn: Turn, tokenizer: Any, max_prompt_length: int | None, chat_kwargs: dict[str, Any] | None,
                dropped: list[tuple[str, str]]) -> dict[str, str] | None:
    """A pivot's training row, or None (and the reason in `dropped`) when it cannot be one."""
    try:
        text = prompt_text(tokenizer, turn.context, turn.tools, chat_kwargs)
    except Exception as exc:  # noqa: BLE001 - a template error names the turn, never kills the run
        dropped.append((turn.id, f"chat template failed: {type(exc).__name__}: {exc}"))
        return None
    if max_prompt_length is not None:
        # By its length first: a prompt long enough to take minutes to tokenize is not tokenized.
        bound = length_bound(tokenizer)
        if bound is not None and (why := bound.refusal(text, max_prompt_length, "the prompt")):
            dropped.append((turn.id, f"{why} (max_prompt_length {max_prompt_length})"))
            return None
        n = len(prompt_token_ids(tokenizer, text))
        if n > max_prompt_length:
            dropped.append((turn.id, f"prompt has {n} tokens > max_prompt_length {max_prompt_length}"))
            return None
    return {"prompt": text, "turn": turn_json(turn), "id": turn.id}


def with_token_budget(cfg: GRPORunConfig, tokenizer: Any) -> GRPORunConfig:
    """`cfg` with max_completion_length filled in for this model when unset (formats.token_budget)."""
    if cfg.max_completion_length is not None:
        return cfg
    return cfg.model_copy(update={"max_completion_length": cfg.token_budget(tokenizer)})


def with_prompt_cap(cfg: GRPORunConfig, tokenizer: Any, model_config: Any = None) -> GRPORunConfig:
    """`cfg` with max_prompt_length filled in when unset: the model's context
    (sampling.pipeline.context_length) less the completion budget, so every kept pivot's prompt
    and completion fit; unchanged when the model states no context."""
    if cfg.max_prompt_length is not None:
        return cfg
    if model_config is None:
        from transformers import AutoConfig

        model_config = AutoConfig.from_pretrained(cfg.model)
    room = check_budget(cfg.max_completion_length, context_length(model_config, tokenizer),
                        "max_completion_length")
    return cfg if room is None else cfg.model_copy(update={"max_prompt_length": room})


def grpo_kwargs(cfg: GRPORunConfig, total_steps: int) -> dict[str, Any]:
    """The GRPOConfig fields pivotrl derives from a run config (before `trl_overrides`)."""
    kwargs = trl_common_kwargs(cfg, total_steps)
    kwargs.update(
        num_generations=cfg.num_generations, max_completion_length=cfg.max_completion_length,
        temperature=cfg.temperature, top_p=cfg.top_p, epsilon=cfg.epsilon,
        epsilon_high=cfg.epsilon_high, beta=cfg.beta, loss_type=cfg.loss_type,
        scale_rewards=cfg.scale_rewards, num_iterations=cfg.num_iterations,
        use_vllm=cfg.use_vllm, vllm_mode=cfg.vllm_mode,
        vllm_gpu_memory_utilization=cfg.vllm_gpu_memory_utilization, log_completions=False,
    )
    if cfg.use_vllm and cfg.max_prompt_length is not None:
        # Every kept prompt fits (build_prompts), so the engine needs no more than this.
        kwargs["vllm_max_model_length"] = cfg.max_prompt_length + cfg.max_completion_length
    return kwargs


def grpo_config(cfg: GRPORunConfig, total_steps: int):
    """TRL's GRPOConfig: what pivotrl derives, then `trl_overrides` (they win)."""
    from trl import GRPOConfig

    return GRPOConfig(**with_trl_overrides(grpo_kwargs(cfg, total_steps), cfg.trl_overrides, GRPOConfig))


def prepare(cfg: GRPORunConfig, tokenizer: Any = None) -> tuple[GRPORunConfig, Any]:
    """The setup every GRPO entry point shares: the model's tokenizer (with a pad token) and the
    config with its completion budget and prompt cap filled in for that model."""
    tokenizer = tokenizer or load_tokenizer(cfg.model)
    check_chat_template(tokenizer, cfg.model)
    return with_prompt_cap(with_token_budget(cfg, tokenizer), tokenizer), tokenizer


def build_trainer(cfg: GRPORunConfig, turns: list[Turn], *, total_steps: int | None = None,
                  reward_funcs=None, callbacks: list | None = None, tokenizer=None,
                  prompts: PromptSet | None = None):
    """A PivotGRPOTrainer over `turns` (`prompts`: their rendered rows, when the caller has them).
    `reward_funcs` replaces the verifier reward (tests)."""
    cfg, tokenizer = prepare(cfg, tokenizer)
    prompts = prompts or build_prompts(turns, tokenizer, cfg.max_prompt_length, cfg.chat_template_kwargs,
                                       spill=spill_path(cfg))
    if not len(prompts):
        raise ValueError(f"no trainable pivots ({len(turns)} read, {len(prompts.dropped)} dropped: "
                         f"{prompts.dropped[:3]})")
    steps = total_steps or cfg.total_steps(len(prompts), world_size())
    reward = reward_funcs or [PivotReward(cfg.verifier, cfg.verifier_config, cfg.invalid_action_penalty,
                                          parse=cfg.parser(tokenizer),
                                          tokenizer=tokenizer)]
    trainer = PivotGRPOTrainer(
        model=cfg.model, reward_funcs=reward, args=grpo_config(cfg, steps),
        train_dataset=prompts.dataset(Path(cfg.output_dir) / ".prompt_cache"), processing_class=tokenizer,
        peft_config=cfg.lora.peft_config(model=cfg.model), shared_prefix=cfg.shared_prefix_loss,
        shared_rollouts=cfg.shared_rollouts,
    )
    trainer.add_callback(MetricsJSONL(Path(cfg.output_dir) / "metrics.jsonl", trainer=trainer))
    quiet_trainer(trainer, Path(cfg.output_dir) / "train.log")
    for cb in callbacks or []:
        trainer.add_callback(cb)
    trainer.pivot_dropped = prompts.dropped
    return trainer


def save_final(trainer, tokenizer, output_dir: Path, base_model: str | None = None) -> None:
    """Final weights + tokenizer in output_dir, loadable by `from_pretrained` whatever the
    launcher: the full state dict is gathered from every process first (accelerate's
    `get_state_dict`: FSDP's full state dict whatever `fsdp_state_dict_type` says, ZeRO-3's 16-bit
    consolidation), since `trainer.save_model` writes only shards under FSDP's SHARDED_STATE_DICT.
    Every process must call it. LoRA: the adapter in adapter/, and in output_dir the base
    (`base_model`, default the adapter's own base) with the adapter merged by PEFT on the main
    process: LoRA leaves the base frozen, and under ZeRO-3 or FSDP the training copy's parameters
    are partitioned, so they cannot be merged in place. The config keeps its base's settings where
    training changed them for itself (train/saved_config.py)."""
    accelerator = trainer.accelerator
    model = accelerator.unwrap_model(trainer.model)
    state = accelerator.get_state_dict(getattr(trainer, "model_wrapped", None) or trainer.model)
    lora = hasattr(model, "merge_and_unload")
    if accelerator.is_main_process:
        target = output_dir / "adapter" if lora else output_dir
        # (a merged LoRA model is saved from its base's own config)
        with base_settings(model, None if lora else base_model):
            model.save_pretrained(target, state_dict=state)  # PEFT keeps only the adapter's weights
        if lora:
            merge_adapter(base_model or model.peft_config["default"].base_model_name_or_path,
                          target, output_dir, dtype=next(t.dtype for t in state.values() if t.is_floating_point()))
        tokenizer.save_pretrained(output_dir)
    # No barrier after: a big LoRA merge on the main process can outlast a collective's timeout,
    # and no process communicates again.


def merge_adapter(base_model: str, adapter_dir: Path, output_dir: Path, dtype: Any = None) -> None:
    """`base_model` with the LoRA adapter of `adapter_dir` merged into its weights (PEFT's
    merge_and_unload), saved as a plain model in output_dir; on CPU, one model in memory."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_model, dtype=dtype)
    PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload().save_pretrained(output_dir)


def reprofile_config(cfg: GRPORunConfig) -> ProfileConfig:
    """How re-profiling samples and scores: the rollouts' verifier, sampling, format and budget
    (the run's blocks, as they are), then `reprofile.options` on top; a key ProfileConfig does not
    have is an error naming it."""
    from pivotrl.io.yaml_config import build_model

    return build_model(ProfileConfig, {**cfg.verifier_options(), **cfg.format_options(), **cfg.sampling_options(),
                                       "seed": cfg.seed, "max_new_tokens": cfg.max_completion_length,
                                       **cfg.reprofile.options}, "reprofile.options")


def pivots_profile_settings(pivots: str | Path) -> dict[str, Any]:
    """The template settings the pivots were profiled with (their stats, from `select`); {} when unknown."""
    try:
        return json.loads(stats_path(pivots).read_text()).get("profile_settings") or {}
    except (OSError, ValueError, AttributeError):
        return {}


# Run settings `train` takes from profiling when the run does not set them: (run config field,
# the profile's field). PivotRL trains the policy on the prompts, and with the budget, that
# measured the pivots.
PROFILED_SETTINGS = (("chat_template_kwargs", "chat_template_kwargs"), ("response_format", "response_format"),
                     ("max_completion_length", "max_new_tokens"))


def with_profile_settings(cfg: GRPORunConfig, profiled: dict[str, Any]) -> tuple[GRPORunConfig, dict[str, str]]:
    """`cfg` with the template settings and token budget profiling used (`profiled`: the pivots'
    stats) wherever the run config does not set its own, and where each setting came from."""
    update, origin = {}, {}
    for name, key in PROFILED_SETTINGS:
        if name in cfg.model_fields_set and getattr(cfg, name) is not None:  # given, `{}` included
            origin[name] = "run config"
        elif profiled.get(key) not in (None, {}):
            update[name], origin[name] = profiled[key], "profiling (the pivots' stats)"
        else:
            origin[name] = "the model's default" if name == "max_completion_length" else "default"
    return cfg.model_copy(update=update), origin


def train(cfg: GRPORunConfig, *, reward_funcs=None, launch: Launch | None = None) -> dict[str, Any]:
    """Run (or resume) GRPO on the configured pivot set. Returns a summary dict. The plan is
    printed and saved first (pivotrl.io.run_plan); `launch.dry_run` stops there, writing nothing."""
    check_launcher_sharding()
    output_dir = Path(cfg.output_dir)
    dry_run = bool(launch and launch.dry_run)
    claim_run_folder(output_dir, model=cfg.model, inputs=[cfg.pivots, cfg.split], resume=cfg.resume,
                     overwrite=cfg.overwrite, dry_run=dry_run)
    check_input_file(cfg.pivots, "pivots", "`pivotrl select`")
    check_model(cfg.model, "model")
    held_out = HeldOut(resolve_split(cfg.split, [cfg.pivots]))
    start_run(output_dir, "train", {"pivots": cfg.pivots, "split": split_file(cfg.split, [cfg.pivots])},
              resume=cfg.resume, dry_run=dry_run)
    profiled = pivots_profile_settings(cfg.pivots)
    cfg, settings_from = with_profile_settings(cfg, profiled)
    # (Pivots without stats say nothing of how they were profiled: nothing to compare with.)
    warning = template_mismatch(cfg.format_options(), profiled, "train", "profiling") if profiled else None
    if warning:
        logger.warning(warning)
    from pivotrl.select import other_profiler

    if warning := other_profiler(cfg.model, pivots_profile_settings(cfg.pivots)):
        logger.warning(warning)
    turns = load_pivot_set(cfg, held_out)
    cfg, tokenizer = prepare(cfg)
    prompts = build_prompts(turns, tokenizer, cfg.max_prompt_length, cfg.chat_template_kwargs,
                            spill=None if dry_run else spill_path(cfg))
    n_rows = len(prompts)
    total = cfg.total_steps(max(n_rows, 1), world_size())
    resume = get_last_checkpoint(str(output_dir)) if cfg.resume and output_dir.is_dir() else None
    if cfg.resume and resume is None:
        raise FileNotFoundError(f"--resume: no checkpoint-* folder in {output_dir}")
    plan = grpo_plan(cfg, tokenizer, n_rows, len(prompts.dropped), held_out.dropped, total, world_size(),
                     resume_from=resume and Path(resume).name)
    if not begin_training(plan, cfg, launch):
        return {"dry_run": True, "plan": plan.as_dict()}
    hook = None
    if cfg.reprofile.enabled:
        # Same verifier and sampling as the rollouts unless the options say otherwise; each pivot
        # is profiled once over all processes and all continue on the same pivots (train.reprofile).
        hook = ReprofileHook(threshold=cfg.reprofile.threshold, every_n_steps=cfg.reprofile.every_n_steps,
                             profile=reprofile_config(cfg))
    reprofiles = 0
    progress = ProgressLines(output_dir / "train.log", cfg.progress_seconds, "reward")
    facts = grpo_card_facts(cfg, n_rows, len(prompts.dropped), held_out.summary(), launch)
    watchers = [NoMixedOutcomesWarning(output_dir / "train.log"), RunReport(facts, RL_REPORT)]
    while True:
        callback = ReprofileCallback(hook) if hook else None
        trainer = build_trainer(cfg, turns, total_steps=total, reward_funcs=reward_funcs,
                                callbacks=[progress, *watchers] + ([callback] if callback else []),
                                tokenizer=tokenizer, prompts=prompts)
        trainer.add_callback(TrackerLogPath(trainer, say_and_log(output_dir / "train.log")))
        if reprofiles:  # the re-profiled pivots are new: no step of this epoch trained them
            trainer.args.ignore_data_skip = True
        try:
            trainer.train(resume_from_checkpoint=resume)
        finally:
            progress.stop()
        if not (callback and callback.triggered):
            break
        # Re-profile with the current policy, continue from the checkpoint just written.
        turns = hook.run(trainer.model, tokenizer, turns)
        prompts = build_prompts(turns, tokenizer, cfg.max_prompt_length, cfg.chat_template_kwargs,
                                spill=spill_path(cfg))
        reprofiles += 1
        resume = get_last_checkpoint(str(output_dir))
        if not turns:
            break
    if trainer.state.global_step == 0:  # never save the base model as the trained one
        raise NothingToRun(f"0 optimizer steps trained on {n_rows} pivots: nothing saved")
    save_final(trainer, tokenizer, output_dir, base_model=cfg.model)
    report: dict[str, Any] = {}
    if trainer.accelerator.is_main_process:
        write_template_settings(output_dir, {**cfg.format_options(), "max_new_tokens": cfg.max_completion_length,
                                             "settings_from": settings_from})
        # After the final save, in place of the stock card TRL wrote at the last checkpoint.
        report = write_run_report(facts.model_copy(update={"steps": trainer.state.global_step}), RL_REPORT)
        finish_run(output_dir)
    rows = read_metric_rows(output_dir / "metrics.jsonl")
    return {"steps": trainer.state.global_step, "pivots": len(turns), "rows": n_rows,
            "reward_mean": final_and_best_text(final_and_best(rows, {"reward_mean": "max"}).get("reward_mean")),
            "learning_signal": learning_signal(rows), **report,
            "max_completion_length": cfg.max_completion_length, "settings_from": settings_from,
            "held_out": held_out.summary(), "dropped": trainer.pivot_dropped, "rollout_turns": trainer.rollout_turns,
            "reprofiles": reprofiles, "output_dir": str(output_dir),
            "metrics": str(output_dir / "metrics.jsonl")}
