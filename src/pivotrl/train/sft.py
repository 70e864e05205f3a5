"""`pivotrl sft`: the paper's baseline, TRL SFTTrainer on the SAME trajectories, loss on assistant
turns only, rendered with the same chat template (and `chat.template_messages`) as PivotRL's
prompts.

The trajectories are tokenized here, not by TRL: `apply_chat_template(..., return_assistant_tokens
_mask=True)` (the call TRL's `assistant_only_loss=True` makes, driven by the template's
`{% generation %}` markers) on messages whose tool-call arguments are real dicts. Handing TRL a
conversational `datasets` column instead would let Arrow merge every call's differently keyed
argument dicts into one struct, filling missing keys with null (docs/DESIGN.md), and the model would
be trained on arguments the expert never sent. TRL gets `input_ids` + `labels` (-100 outside
assistant turns) and does the rest: batching, schedule, checkpoints, DDP/DeepSpeed/FSDP.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers.trainer_utils import get_last_checkpoint
from trl import SFTTrainer

from pivotrl.formats.chat import apply_template, load_tokenizer, template_messages
from pivotrl.formats.families import training_chat_template
from pivotrl.formats.length_bound import length_bound
from pivotrl.formats.options import write_template_settings
from pivotrl.io.inputs import check_chat_template, check_input_file, check_model
from pivotrl.io.run_folder import claim_run_folder, finish_run, start_run
from pivotrl.io.records import Reject, Trajectory, read_records, rejects_path
from pivotrl.io.split import HeldOut, resolve_split, split_file
from pivotrl.train.config import SFTRunConfig, check_launcher_sharding, trl_common_kwargs, with_trl_overrides
from pivotrl.train.grpo import save_final, world_size
from pivotrl.train.metrics import MetricsJSONL, ProgressLines, TrackerLogPath, quiet_trainer, say_and_log
from pivotrl.io.run_plan import Launch, NothingToRun
from pivotrl.train.plan import begin_training, sft_plan
from pivotrl.train.resume import Resumable
from pivotrl.train.run_card import SFT_REPORT, RunReport, sft_card_facts, write_run_report
from pivotrl.train.saved_config import SavesBaseSettings
from pivotrl.train.tokens import CountsTokens, batch_tokens

SFT_METRIC_KEYS = {"loss": "loss", "learning_rate": "learning_rate", "grad_norm": "grad_norm",
                   "mean_token_accuracy": "mean_token_accuracy", "entropy": "entropy",
                   "num_tokens": "num_tokens", "train_tokens": "train_tokens",
                   "aux_loss": "aux_loss"}  # MoE load-balancing loss, part of `loss` (router_aux_loss_coef)


class PivotSFTTrainer(Resumable, SavesBaseSettings, CountsTokens, SFTTrainer):
    """TRL's SFTTrainer, with the resume fixes of train/resume.py; checkpoints keep the base's
    settings (train/saved_config.py); the tokens its forward + backward passes ran are counted
    (`train_tokens`, train/tokens.py: TRL's own `num_tokens` starts again from 0 on resume)."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training and torch.is_grad_enabled():  # the training forward: a backward follows
            self.count_tokens("train_tokens", batch_tokens(inputs))
        return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                    num_items_in_batch=num_items_in_batch)


@dataclass
class SFTRows:
    rows: list[dict[str, Any]]
    dropped: list[tuple[str, str]] = field(default_factory=list)  # (trajectory id or file:line, reason)
    turns: int = 0  # assistant turns of the kept trajectories (what PivotRL would count as states)
    turns_dropped: int = 0  # assistant turns of the trajectories dropped


def assistant_turns(traj: Trajectory) -> int:
    return sum(m.role == "assistant" for m in traj.messages)


_MODEL_TEMPLATE = object()  # `chat_template` not given: look it up (`sft_template`)
PREFIX_MASK = "prefix-mask"  # mask by rendering prefixes (`_prefix_mask`)


def sft_template(tokenizer: Any) -> str | None:
    """The template SFT renders with: the model's own when it has {% generation %} markers, else
    TRL's training version of its family (same text plus the markers); for a template with
    neither (Llama 3.1/3.2), PREFIX_MASK."""
    try:
        return training_chat_template(tokenizer)
    except ValueError:
        return PREFIX_MASK


def _prefix_mask(tokenizer: Any, messages: list[dict[str, Any]], tools, chat_kwargs) -> dict[str, Any]:
    """Assistant-token mask without {% generation %} markers: assistant message i spans from the
    end of the generation prompt after messages[:i] to the end of the render of messages[:i+1].
    Exact only when each render is a prefix of the next (checked; otherwise an error)."""
    full = apply_template(tokenizer, messages, tools, **chat_kwargs)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = apply_template(tokenizer, messages[:i], tools, add_generation_prompt=True, **chat_kwargs)
        upto = apply_template(tokenizer, messages[:i + 1], tools, **chat_kwargs)
        if not (upto.startswith(before) and full.startswith(upto)):
            raise ValueError("the chat template has no {% generation %} markers, TRL has no training "
                             "version of it, and it re-renders earlier turns: add {% generation %}…"
                             "{% endgeneration %} around the assistant's output, or set "
                             "assistant_only_loss: false")
        spans.append((len(before), len(upto)))
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(a <= start < b for a, b in spans)) for start, _ in enc["offset_mapping"]]
    return {"input_ids": list(enc["input_ids"]), "assistant_masks": mask}


def tokenize_trajectory(tokenizer: Any, traj: Trajectory, assistant_only: bool = True,
                        chat_template: Any = _MODEL_TEMPLATE,
                        chat_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """{"input_ids", "labels"}: labels are -100 on every token the assistant did not write.

    chat_template: the template to render with (default: `sft_template`), so stock Qwen3 /
    Llama 3.1 / Nemotron 3 templates train assistant-only. Reasoning in the messages is passed on
    (the target turns' reasoning is trained where the template renders it). Tokenized without
    added special tokens (chat.py's rule: one BOS, the template's)."""
    if chat_template is _MODEL_TEMPLATE:
        chat_template = sft_template(tokenizer) if assistant_only else None
    messages, kwargs = template_messages(traj.messages), dict(chat_kwargs or {})
    if assistant_only and chat_template == PREFIX_MASK:
        out = _prefix_mask(tokenizer, messages, traj.tools, kwargs)
    else:
        out = apply_template(tokenizer, messages, traj.tools, tokenize=True, return_dict=True,
                             return_assistant_tokens_mask=assistant_only, chat_template=chat_template,
                             **kwargs)
    ids = list(out["input_ids"])
    if not assistant_only:
        return {"input_ids": ids, "labels": ids}
    mask = list(out["assistant_masks"])
    if 1 not in mask:
        raise ValueError("no assistant tokens in the mask: the chat template needs "
                         "{% generation %}…{% endgeneration %} around assistant turns")
    return {"input_ids": ids, "labels": [t if m else -100 for t, m in zip(ids, mask, strict=True)]}


def _too_long_to_tokenize(tokenizer: Any, traj: Trajectory, chat_template: Any,
                          chat_kwargs: dict[str, Any] | None, max_length: int | None) -> str | None:
    """Why `traj`'s text cannot fit in `max_length` tokens by its length alone
    (`pivotrl.formats.length_bound`), or None: then it is tokenized and counted as before. A
    long enough text takes minutes to tokenize; rendering it (what the check reads) is linear."""
    bound = length_bound(tokenizer)
    if max_length is None or bound is None:
        return None
    template = {} if chat_template in (PREFIX_MASK, None) else {"chat_template": chat_template}
    text = apply_template(tokenizer, template_messages(traj.messages), traj.tools, **template,
                          **(chat_kwargs or {}))
    why = bound.refusal(text, max_length, "the rendered trajectory")
    return f"{why} (max_length {max_length})" if why else None


def build_rows(paths: str | Path | list, tokenizer: Any, max_length: int | None = None,
               assistant_only: bool = True, chat_kwargs: dict[str, Any] | None = None,
               held_out: HeldOut | None = None) -> SFTRows:
    """Tokenized rows of the trajectories in `paths`; those of `held_out`'s eval trajectories are
    skipped (and counted there), bad ones dropped with the reason."""
    template = sft_template(tokenizer) if assistant_only else None  # looked up once, not per row
    out = SFTRows(rows=[])
    paths = paths if isinstance(paths, list) else [paths]
    records = (rec for path in paths for _, rec in read_records(path, Trajectory))
    for rec in records:
        if isinstance(rec, Reject):
            out.dropped.append((f"{rec.file}:{rec.line}", rec.reason))
            continue
        if held_out is not None and not held_out.keep(rec.id):
            continue
        why, row = None, None
        try:
            why = _too_long_to_tokenize(tokenizer, rec, template, chat_kwargs, max_length)
            row = None if why else tokenize_trajectory(tokenizer, rec, assistant_only, template, chat_kwargs)
        except Exception as exc:  # noqa: BLE001 - one bad trajectory is reported, not fatal
            why = f"{type(exc).__name__}: {exc}"
        if row is not None and max_length is not None and len(row["input_ids"]) > max_length:
            why = f"{len(row['input_ids'])} tokens > max_length {max_length}"
        if why:
            out.dropped.append((rec.id, why))
            out.turns_dropped += assistant_turns(rec)
        else:
            out.rows.append(row)
            out.turns += assistant_turns(rec)
    return out


def with_length_cap(cfg: SFTRunConfig, tokenizer: Any) -> SFTRunConfig:
    """`cfg` with max_length filled in when unset: the model's context
    (sampling.pipeline.context_length), the bound `train`'s prompt cap derives from; unchanged
    when the model states none."""
    if cfg.max_length is not None:
        return cfg
    from transformers import AutoConfig

    from pivotrl.sampling.pipeline import context_length

    context = context_length(AutoConfig.from_pretrained(cfg.model), tokenizer)
    return cfg if context is None else cfg.model_copy(update={"max_length": context})


def sft_config(cfg: SFTRunConfig, total_steps: int):
    from trl import SFTConfig

    return SFTConfig(**with_trl_overrides(sft_kwargs(cfg, total_steps), cfg.trl_overrides, SFTConfig))


def sft_kwargs(cfg: SFTRunConfig, total_steps: int) -> dict[str, Any]:
    """The SFTConfig fields pivotrl derives from a run config (before `trl_overrides`)."""
    kwargs = trl_common_kwargs(cfg, total_steps)
    # Rows arrive tokenized with labels; TRL must neither truncate nor re-mask them.
    kwargs.update(max_length=None, packing=False, assistant_only_loss=False, completion_only_loss=False)
    return kwargs


def build_sft_trainer(cfg: SFTRunConfig, rows: list[dict[str, Any]], tokenizer, total_steps: int):
    from datasets import Dataset

    trainer = PivotSFTTrainer(model=cfg.model, args=sft_config(cfg, total_steps),
                         train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                         peft_config=cfg.lora.peft_config(model=cfg.model))
    trainer.add_callback(MetricsJSONL(Path(cfg.output_dir) / "metrics.jsonl", keys=SFT_METRIC_KEYS))
    quiet_trainer(trainer, Path(cfg.output_dir) / "train.log")
    return trainer


def train_sft(cfg: SFTRunConfig, *, launch: Launch | None = None) -> dict[str, Any]:
    """Run (or resume) SFT on the configured trajectories. Returns a summary dict. The plan is
    printed and saved first (pivotrl.io.run_plan); `launch.dry_run` stops there, writing nothing."""
    check_launcher_sharding()
    output_dir = Path(cfg.output_dir)
    dry_run = bool(launch and launch.dry_run)
    files = cfg.data if isinstance(cfg.data, list) else [cfg.data]
    claim_run_folder(output_dir, model=cfg.model, inputs=[*files, cfg.split], resume=cfg.resume,
                     overwrite=cfg.overwrite, dry_run=dry_run)
    for path in files:
        check_input_file(path, "data", "your trajectory file")
    check_model(cfg.model, "model")
    held_out = HeldOut(resolve_split(cfg.split, files))
    start_run(output_dir, "sft", {"data": files, "split": split_file(cfg.split, files)}, resume=cfg.resume,
              dry_run=dry_run)
    tokenizer = load_tokenizer(cfg.model)
    check_chat_template(tokenizer, cfg.model)
    cfg = with_length_cap(cfg, tokenizer)
    data = build_rows(cfg.data, tokenizer, cfg.max_length, cfg.assistant_only_loss, cfg.chat_template_kwargs,
                      held_out)
    if data.dropped and os.environ.get("RANK", "0") == "0" and not dry_run:
        output_dir.mkdir(parents=True, exist_ok=True)
        with rejects_path(output_dir / "sft_data.jsonl").open("w") as f:
            for where, reason in data.dropped:
                f.write(json.dumps({"where": where, "reason": reason}) + "\n")
    if not data.rows:
        raise ValueError(f"{cfg.data}: no usable trajectories ({len(data.dropped)} dropped; first: "
                         f"{data.dropped[:1]})")
    total = cfg.total_steps(len(data.rows), world_size())
    resume = get_last_checkpoint(str(output_dir)) if cfg.resume and output_dir.is_dir() else None
    if cfg.resume and resume is None:
        raise FileNotFoundError(f"--resume: no checkpoint-* folder in {output_dir}")
    plan = sft_plan(cfg, tokenizer, len(data.rows), len(data.dropped), held_out.dropped, total, world_size(),
                    resume_from=resume and Path(resume).name, turns=(data.turns, data.turns_dropped))
    if not begin_training(plan, cfg, launch):
        return {"dry_run": True, "plan": plan.as_dict()}
    trainer = build_sft_trainer(cfg, data.rows, tokenizer, total)
    progress = ProgressLines(output_dir / "train.log", cfg.progress_seconds, "loss")
    trainer.add_callback(progress)
    facts = sft_card_facts(cfg, len(data.rows), len(data.dropped), held_out.summary(), launch)
    trainer.add_callback(RunReport(facts, SFT_REPORT))
    trainer.add_callback(TrackerLogPath(trainer, say_and_log(output_dir / "train.log")))
    try:
        result = trainer.train(resume_from_checkpoint=resume)
    finally:
        progress.stop()
    if trainer.state.global_step == 0:  # never save the base model as the trained one
        raise NothingToRun(f"0 optimizer steps trained on {len(data.rows)} trajectories: nothing saved")
    save_final(trainer, tokenizer, output_dir, base_model=cfg.model)
    report: dict[str, Any] = {}
    if trainer.accelerator.is_main_process:
        write_template_settings(output_dir, {"chat_template_kwargs": cfg.chat_template_kwargs})
        # After the final save, in place of the stock card TRL wrote at the last checkpoint.
        report = write_run_report(facts.model_copy(update={"steps": trainer.state.global_step}), SFT_REPORT)
        finish_run(output_dir)
    return {"steps": trainer.state.global_step, "trajectories": len(data.rows),
            "held_out": held_out.summary(), "dropped": data.dropped, "train_loss": round(result.training_loss, 4),
            "output_dir": str(output_dir), "metrics": str(output_dir / "metrics.jsonl"), **report}
