"""metrics.jsonl: one line per logged step with the figures PivotRL reports (reward, per-group std,
zero-std fraction, invalid rate, rollout turns, …), kept consistent across a resume; and what a
run says while it trains: pivotrl's progress lines on the console, TRL's own log dicts in the
run's log file (`quiet_trainer`)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback

METRIC_KEYS = {  # metrics.jsonl key ← TRL log key
    "reward_mean": "reward", "reward_std": "reward_std", "frac_zero_std": "frac_zero_std",
    "frac_reward_zero_std": "frac_reward_zero_std", "group_std_mean": "group_std_mean",
    "invalid_rate": "invalid_rate", "rollout_turns": "rollout_turns", "loss": "loss",
    "learning_rate": "learning_rate", "grad_norm": "grad_norm", "step_time": "step_time",
    "completion_length": "completions/mean_length", "entropy": "entropy", "kl": "kl",
    "truncated_rate": "completions/clipped_ratio",  # cut at max_completion_length (a thinking budget too small)
    # The parts of the loss TRL logs besides the total: the MoE load-balancing loss (added to the
    # loss with the model's router_aux_loss_coef) and, with an entropy bonus, the policy term.
    "aux_loss": "aux_loss", "policy_loss": "policy_loss",
    # Counters (train/tokens.py): tokens the forward + backward passes ran, tokens generated.
    "train_tokens": "train_tokens", "rollout_tokens": "rollout_tokens",
}


class MetricsJSONL(TrainerCallback):
    """Appends one JSON line per log event to `path` on the main process: {step, reward_mean, …}.

    On resume, lines past the checkpoint's step are dropped first (they belong to the lost run), and
    the trainer's rollout-turn counter is restored from the checkpoint's log history."""

    def __init__(self, path: str | Path, keys: dict[str, str] | None = None, trainer=None):
        self.path = Path(path)
        self.keys = keys or METRIC_KEYS
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        if self.trainer is not None and hasattr(self.trainer, "rollout_turns"):
            seen = [e["rollout_turns"] for e in state.log_history if "rollout_turns" in e]
            self.trainer.rollout_turns = int(max(seen)) if seen else 0
        if state.is_world_process_zero and self.path.exists():
            kept = []
            for line in self.path.read_text().splitlines():
                try:
                    if json.loads(line).get("step", 0) <= state.global_step:
                        kept.append(line)
                except ValueError:
                    pass  # a torn last line of a killed run
            self.path.write_text("".join(k + "\n" for k in kept))

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        row: dict[str, Any] = {"step": state.global_step}
        for out_key, log_key in self.keys.items():
            value = logs.get(log_key)
            if isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value)):
                row[out_key] = value
        if len(row) == 1:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()


class ProgressLines(TrainerCallback):
    """`step 12/40 · 3.1 s/step · ETA 1m27s · reward 0.41` on stderr and appended to `log_file`, on
    the main process, every `every_s` seconds and at the last step. TRL's own bar is off
    (`disable_tqdm`): a redrawn bar leaves a SLURM log or a pipe nothing readable."""

    def __init__(self, log_file: str | Path, every_s: float = 30.0, metric: str = "loss"):
        self.log_file, self.every_s, self.metric = Path(log_file), every_s, metric
        self.log = None
        self.value: float | None = None
        self.printed: int | None = None
        self._running = None

    def on_train_begin(self, args, state, control, **kwargs):
        from pivotrl.io.progress import ProgressLog

        if state.is_world_process_zero:
            self.log = ProgressLog("step", state.max_steps, every_s=self.every_s,
                                   log_file=self.log_file, start=state.global_step)
            # A line every `every_s` even while one step runs (a long generation, a re-profile);
            # `stop` ends it (on_train_end, or the caller's `finally` when training raised).
            self._running = self.log.running()
            self._running.__enter__()

    def stop(self) -> None:
        running, self._running = getattr(self, "_running", None), None
        if running is not None:
            running.__exit__(None, None, None)

    def on_step_end(self, args, state, control, **kwargs):
        if self.log is not None:
            self.log.note(state.global_step, self._extra())

    def _extra(self) -> str:
        return f"{self.metric} {self.value:.3g}" if self.value is not None else ""

    def _update(self, step: int, force: bool = False) -> None:
        if step == self.printed:  # TRL's end-of-run summary is logged at the last step again
            return
        if self.log.update(step, self._extra(), force=force) is not None:
            self.printed = step

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.log is None:
            return
        value = (logs or {}).get(self.metric)
        if isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value)):
            self.value = float(value)
        self._update(state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        # The last step gets its line even when logging_steps skipped it (or a re-profile stopped
        # the run early).
        if self.log is not None and self.printed != state.global_step:
            self._update(state.global_step, force=True)
        self.stop()


class LogDicts(TrainerCallback):
    """Every log dict TRL and transformers print at each logged step (`{'loss': …, 'reward': …}`),
    appended to the run's log file instead, on the main process: on the console they buried
    pivotrl's progress lines (one dict per step), and the log file keeps them whole."""

    def __init__(self, log_file: str | Path):
        self.log_file = Path(log_file)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        import time

        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("a") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} step {state.global_step} {json.dumps(logs)}\n")


def quiet_trainer(trainer, log_file: str | Path) -> None:
    """Send `trainer`'s printed log dicts to `log_file` (LogDicts) instead of the console."""
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(LogDicts(log_file))


def read_metric_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a run's metrics.jsonl in step order (a torn last line of a killed run is
    skipped); [] when the run logged nothing yet."""
    rows = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
    return rows


def final_and_best(rows: list[dict[str, Any]], better: dict[str, str]) -> dict[str, dict[str, Any]]:
    """{metric: {"final", "best", "best_step"}} for each metric of `better` (metric → "max" or
    "min": which way is better) that some row logged; a metric no row logged is left out."""
    out: dict[str, dict[str, Any]] = {}
    for key, way in better.items():
        logged = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        if not logged:
            continue
        pick = max if way == "max" else min
        best_step, best = pick(logged, key=lambda sv: sv[1])
        out[key] = {"final": logged[-1][1], "best": best, "best_step": best_step}
    return out


class TrackerLogPath(TrainerCallback):
    """Says at the start of a run where its experiment tracker writes (`report_to`): the
    tensorboard log folder, the wandb run's page and folder. Added after the trackers'
    callbacks, so theirs have set those by the time this one runs."""

    def __init__(self, trainer, say):
        self.trainer, self.say = trainer, say

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            for line in tracker_lines(self.trainer.callback_handler.callbacks):
                self.say(line)


def tracker_lines(callbacks: list) -> list[str]:
    """Where each tracker among `callbacks` (a trainer's callback list) logs, once it started."""
    lines = []
    for cb in callbacks:
        name = type(cb).__name__
        if name == "TensorBoardCallback" and getattr(cb, "logging_dir", None):
            lines.append(f"tensorboard: logging to {cb.logging_dir} (view: tensorboard --logdir {cb.logging_dir})")
        elif name == "WandbCallback":
            run = getattr(getattr(cb, "_wandb", None), "run", None)
            if run is not None:
                lines.append(f"wandb: logging to {getattr(run, 'url', None) or 'an offline run'} "
                             f"(files: {getattr(run, 'dir', '?')})")
    return lines


def say_and_log(log_file: str | Path):
    """A `say(line)` that prints a line on stderr and appends it to the run's log file (the
    lines a run says once, beside its progress lines)."""
    import sys

    def say(line: str) -> None:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
        log = Path(log_file)
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as f:
            f.write(line + "\n")
    return say


def final_and_best_text(entry: dict[str, Any] | None) -> str:
    """One entry of `final_and_best` as a summary reads it: `0.75 at the last logged step (best
    0.81 at step 12)`; "not logged" for None."""
    if not entry:
        return "not logged"
    return f"{entry['final']:.4g} at the last logged step (best {entry['best']:.4g} at step {entry['best_step']})"
