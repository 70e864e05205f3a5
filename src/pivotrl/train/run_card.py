"""What a run folder says about itself: its model card (README.md, `pivotrl.train.model_card`) and
its learning curves (curves.png, `pivotrl.train.curves`), both read off metrics.jsonl. Written at
each checkpoint (`RunReport`, after TRL has written its stock card there) and at the end of the
run (`write_run_report`, after the final model is saved), by `train`, `sft` and the testbed's
`e2e`. Nothing here touches training: it reads what the run logged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from transformers import TrainerCallback

from pivotrl.io.records import stats_path
from pivotrl.train.curves import CURVES_FILE, RL_CURVES, SFT_CURVES, plot_curves
from pivotrl.train.learning_signal import learning_signal
from pivotrl.train.metrics import final_and_best, read_metric_rows
from pivotrl.train.model_card import CardFacts, write_model_card


class ReportKind(NamedTuple):
    """Which curves a kind of run draws and which metrics its card tabulates (metric → "max" or
    "min": which way is better, for the card's "best" column)."""

    curves: tuple[tuple[str, str], ...]
    better: dict[str, str]
    rl: bool  # a group-RL run: its card gives the learning signal (train.learning_signal)


# (A GRPO loss has no "best": its value follows the advantages, not how good the policy is; it is
# drawn in the curves.)
RL_REPORT = ReportKind(RL_CURVES, {"reward_mean": "max", "invalid_rate": "min", "frac_zero_std": "min"}, rl=True)
SFT_REPORT = ReportKind(SFT_CURVES, {"loss": "min", "mean_token_accuracy": "max"}, rl=False)


def write_run_report(facts: CardFacts, kind: ReportKind) -> dict[str, str]:
    """curves.png and README.md in `facts.output_dir`, their metrics read off its metrics.jsonl;
    returns their paths (for the run's summary)."""
    out = Path(facts.output_dir)
    rows = read_metric_rows(out / "metrics.jsonl")
    png = plot_curves(rows, out / CURVES_FILE, kind.curves,
                      title=f"pivotrl {facts.verb}: {out.name} (step {facts.steps})")
    facts = facts.model_copy(update={"metrics": final_and_best(rows, kind.better), "curves": CURVES_FILE,
                                     "learning_signal": learning_signal(rows) if kind.rl else None})
    card = write_model_card(out, facts)
    return {"model_card": str(card), "curves": str(png)}


class RunReport(TrainerCallback):
    """Redraws the report at each checkpoint (on the main process), its card marked in progress:
    a run stopped between checkpoints still explains itself."""

    def __init__(self, facts: CardFacts, kind: ReportKind):
        self.facts, self.kind = facts, kind

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            write_run_report(self.facts.model_copy(update={"steps": state.global_step, "finished": False}),
                             self.kind)


def pivot_selection(pivots: str | Path) -> str:
    """How the pivots were selected, from the stats `pivotrl select` wrote beside them."""
    try:
        stats = json.loads(stats_path(pivots).read_text())
    except (OSError, ValueError):
        return (f"`{pivots}` has no {stats_path(pivots).name} beside it: not written by `pivotrl "
                "select` (imported or hand-made pivots), so how they were chosen is not recorded.")
    cfg = stats.get("config") or {}
    profiler = (stats.get("profile_settings") or {}).get("model")
    return (f"{stats.get('kept')} of {stats.get('turns')} profiled turns kept by `pivotrl select "
            f"--strategy {cfg.get('strategy')}` (lambda_diff {cfg.get('lambda_diff')}, success threshold "
            f"{cfg.get('success_threshold')}); outcomes under the reference policy: "
            f"{stats.get('mixed')} mixed, {stats.get('all_fail')} all fail, {stats.get('all_pass')} all pass"
            + (f"; profiled by `{profiler}`." if profiler else "."))


def run_facts(verb: str, cfg: Any, *, data: dict[str, Any], held_out: str, items: str,
              settings: dict[str, Any], command: str | None, selection: str | None = None) -> CardFacts:
    """The card's facts from a run config (any of RunBasics' kinds) and what the verb counted."""
    from pivotrl.io.outputs import CONFIG_FILE

    schedule = getattr(cfg, "lr_scheduler_type", None)
    return CardFacts(verb=verb, output_dir=str(cfg.output_dir), base_model=str(cfg.model),
                     data={k: str(v) for k, v in data.items() if v is not None}, held_out=held_out,
                     selection=selection, items=items, learning_rate=cfg.learning_rate,
                     schedule=(f"{schedule}, " if schedule else "") + f"{cfg.warmup_steps} warmup steps",
                     settings=settings, command=command, config_file=CONFIG_FILE)


def grpo_card_facts(cfg: Any, rows: int, dropped: int, held_out: str, launch: Any) -> CardFacts:
    """The card's facts of a `pivotrl train` run (GRPORunConfig) on `rows` trainable pivots."""
    from pivotrl.io.split import split_file

    return run_facts(
        "train", cfg, data={"pivots": cfg.pivots, "split": split_file(cfg.split, [cfg.pivots])}, held_out=held_out,
        items=f"{rows} pivots trained on ({dropped} dropped: prompt too long or not renderable)",
        selection=pivot_selection(cfg.pivots), command=getattr(launch, "command", None),
        settings={"completions per pivot (num_generations)": cfg.num_generations,
                  "completions per device step": cfg.per_device_train_batch_size,
                  "max_completion_length": cfg.max_completion_length, "temperature": cfg.temperature,
                  "KL coefficient (beta)": cfg.beta, "loss_type": cfg.loss_type, "verifier": cfg.verifier,
                  "LoRA": cfg.lora.enabled})


def sft_card_facts(cfg: Any, rows: int, dropped: int, held_out: str, launch: Any) -> CardFacts:
    """The card's facts of a `pivotrl sft` run (SFTRunConfig) on `rows` trajectories."""
    from pivotrl.io.split import split_file

    files = cfg.data if isinstance(cfg.data, list) else [cfg.data]
    return run_facts(
        "sft", cfg, data={"data": ", ".join(map(str, files)), "split": split_file(cfg.split, files)},
        held_out=held_out, items=f"{rows} trajectories trained on ({dropped} dropped)",
        command=getattr(launch, "command", None),
        settings={"trajectories per device step": cfg.per_device_train_batch_size, "max_length": cfg.max_length,
                  "assistant_only_loss": cfg.assistant_only_loss, "LoRA": cfg.lora.enabled})
