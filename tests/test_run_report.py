"""A run folder explains itself, and a run that cannot learn says so.

- GRPO on pivots where no group can have mixed outcomes (every completion scores 0: the expected
  call names a function no completion can guess) warns at the start and its summary and model
  card say "no mixed outcomes: nothing to learn", with the fix; the summary shows the reward.
- The README.md of `train` and `sft` is pivotrl's card (method, base model, data, steps, lr,
  final/best metrics, how to load, the command), not TRL's stock text; curves.png is drawn at
  each checkpoint and at the end, a metric the run did not log (KL at beta 0) included.
- Where a tracker logs is said at the start."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

from typer.testing import CliRunner

from pivotrl.cli import app
from pivotrl.train.curves import SFT_CURVES, plot_curves
from pivotrl.train.learning_signal import NO_MIXED_OUTCOMES, NoMixedOutcomesWarning, learning_signal
from pivotrl.train.metrics import tracker_lines
from pivotrl.train.model_card import CardFacts
from pivotrl.train.run_card import RL_REPORT, RunReport

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "trajectories.jsonl"
SHIPPED_BASE = ROOT / "src" / "pivotrl_testbed" / "testbed" / "shipped_base" / "base"
PNG = b"\x89PNG\r\n\x1a\n"


def pivotrl(*argv: object) -> str:
    result = CliRunner().invoke(app, [str(a) for a in argv], env={"COLUMNS": "200"})
    assert result.exit_code == 0, f"{argv}\n{result.output}\n{result.exception!r}"
    return result.output


def unlearnable_pivots(path: Path, n: int = 4) -> Path:
    """Pivots whose expected call no completion of the base can match: every reward is 0."""
    call = {"id": "c0", "type": "function", "function": {
        "name": "zq_never_seen_fn", "arguments": json.dumps({"token": "x7Qv-unguessable-19"})}}
    path.write_text("".join(json.dumps({
        "id": f"u{i}/1", "trajectory_id": f"u{i}", "turn": 1, "tools": [],
        "context": [{"role": "user", "content": f"Please handle request {i}."}],
        "expected": {"role": "assistant", "content": "", "tool_calls": [call]}}) + "\n" for i in range(n)))
    return path


def test_grpo_without_mixed_outcomes_warns_and_its_card_says_so(tmp_path, caplog):
    pivots, run = unlearnable_pivots(tmp_path / "pivots.jsonl"), tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="pivotrl.train.learning_signal"):
        out = pivotrl("train", "--pivots", pivots, "--model", SHIPPED_BASE, "--output-dir", run,
                      "--max-steps", "2", "--save-steps", "1", "--num-generations", "2",
                      "--max-completion-length", "8", "--progress-seconds", "0")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["frac_zero_std"] for r in rows if "loss" in r] == [1.0, 1.0]  # the premise
    [warning] = [m for m in caplog.messages if NO_MIXED_OUTCOMES in m]
    assert "first 2 logged steps" in warning and "`pivotrl select` with its default strategy" in warning
    assert NO_MIXED_OUTCOMES in (run / "train.log").read_text()
    assert "no mixed outcomes:" in out and "reward_mean" in out and "at the last logged step" in out

    card = (run / "README.md").read_text()
    assert "huggingface.co/None" not in card and 'model="None"' not in card
    assert "PivotRL: GRPO on the pivot turns" in card and str(SHIPPED_BASE) in card
    assert f"- pivots: `{pivots}`" in card and "no pivots.stats.json beside it" in card
    assert "- optimizer steps: 2" in card and "- learning rate: 1e-06" in card
    assert f"learning signal: {NO_MIXED_OUTCOMES}" in card
    assert "| reward_mean | 0 | 0 | 1 |" in card
    assert f'AutoModelForCausalLM.from_pretrained("{run}")' in card
    command = card.split("```bash\npivotrl train ", 1)[1].split("\n", 1)[0]  # the command as given
    assert f"--pivots {pivots}" in command and "--max-steps 2" in command and "--save-steps 1" in command
    assert (run / "curves.png").read_bytes().startswith(PNG)


def test_sft_card_and_curves(tmp_path):
    data, run = tmp_path / "trajectories.jsonl", tmp_path / "sft"
    data.write_text("".join(EXAMPLES.read_text().splitlines(keepends=True)[:4]))
    out = pivotrl("sft", "--data", data, "--model", SHIPPED_BASE, "--output-dir", run, "--max-steps", "1",
                  "--progress-seconds", "0")
    card = (run / "README.md").read_text()
    assert "SFT baseline" in card and f"- data: `{data}`" in card and "- optimizer steps: 1" in card
    assert "| loss |" in card and "| mean_token_accuracy |" in card
    assert "huggingface.co/None" not in card
    assert (run / "curves.png").read_bytes().startswith(PNG) and "curves" in out


def test_a_checkpoint_redraws_the_report_in_progress(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward_mean": 0.5, "frac_zero_std": 0.5}) + "\n")
    facts = CardFacts(verb="train", output_dir=str(tmp_path), base_model="org/base-model")
    RunReport(facts, RL_REPORT).on_save(None, SimpleNamespace(is_world_process_zero=True, global_step=1), None)
    card = (tmp_path / "README.md").read_text()
    assert "Training in progress" in card and "base_model: org/base-model" in card
    assert "groups with mixed outcomes: 50%" in card
    assert (tmp_path / "curves.png").read_bytes().startswith(PNG)


def test_curves_draw_whatever_was_logged(tmp_path):
    for rows in ([], [{"step": 1}], [{"step": 1, "loss": 2.0}, {"step": 2, "loss": float("nan")}]):
        path = plot_curves(rows, tmp_path / "c.png", SFT_CURVES)
        assert path.read_bytes().startswith(PNG)


def test_learning_signal_and_its_warning():
    assert learning_signal([{"step": 1, "frac_zero_std": 0.5}]).startswith("groups with mixed outcomes: 50%")
    assert learning_signal([{"step": 1, "frac_reward_zero_std": 1.0}]).startswith(NO_MIXED_OUTCOMES)
    state = SimpleNamespace(is_world_process_zero=True)
    mixed = NoMixedOutcomesWarning(watched=2)
    for fraction in (1.0, 0.75, 1.0):  # a mixed group among the watched steps: no warning
        mixed.on_log(None, state, None, logs={"frac_zero_std": fraction})
    mixed.on_train_end(None, state, None)
    assert not mixed.warned


def test_the_trackers_log_path_is_said():
    from transformers.integrations import TensorBoardCallback

    board = object.__new__(TensorBoardCallback)  # tensorboard itself need not be installed
    board.logging_dir = "out/runs/May01_host"
    assert tracker_lines([board, object()]) == [
        "tensorboard: logging to out/runs/May01_host (view: tensorboard --logdir out/runs/May01_host)"]


def test_e2e_card_and_curves(tmp_path, tiny_model_dir):
    from pivotrl_testbed.e2e import E2ERunConfig, train_e2e
    from pivotrl_testbed.testbed.tasks import make_tasks

    run = tmp_path / "e2e"
    cfg = E2ERunConfig(model=str(tiny_model_dir), output_dir=run, world="toolshop", tasks=tmp_path / "unused.jsonl",
                       tasks_per_step=2, num_generations=2, max_turns=2, max_completion_length=8, max_steps=1)
    summary = train_e2e(cfg, make_tasks("toolshop", "train", 2))
    card = (run / "README.md").read_text()
    assert "E2E RL baseline" in card and "- tasks: `handed in by the caller`" in card
    assert "| reward_mean |" in card and "learning signal:" in card
    assert summary["curves"] == str(run / "curves.png") and (run / "curves.png").read_bytes().startswith(PNG)
