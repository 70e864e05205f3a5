"""Progress of long jobs as periodic lines with rate and ETA, on stderr and in a log file
(pivotrl.io.progress; the trainers' callback in pivotrl.train.metrics; profile off a terminal)."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

from pivotrl.io.progress import ProgressLog, duration

ROOT = Path(__file__).resolve().parents[1]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_lines_come_every_period_with_rate_and_eta(tmp_path):
    clock, out = Clock(), io.StringIO()
    log = ProgressLog("step", 40, every_s=10, log_file=tmp_path / "train.log", stream=out, clock=clock)
    printed = []
    for step in range(1, 41):
        clock.now += 3.0  # 3 s a step
        printed.append(log.update(step, f"reward {step / 100:.2f}"))
    lines = [p for p in printed if p]
    # one line every 10 s (every 4th step at 3 s/step) and the last step
    assert [p.split()[1] for p in lines] == ["4/40", "8/40", "12/40", "16/40", "20/40", "24/40",
                                             "28/40", "32/40", "36/40", "40/40"]
    assert lines[2] == "step 12/40 · 3.0 s/step · ETA 1m24s · elapsed 36s · reward 0.12"
    assert out.getvalue().splitlines() == lines
    logged = (tmp_path / "train.log").read_text().splitlines()
    assert [line.split(" ", 2)[2] for line in logged] == lines  # timestamped copies


def test_a_resumed_job_rates_only_the_work_it_did():
    clock = Clock()
    log = ProgressLog("profile", 100, unit="turn", every_s=0, start=90, stream=io.StringIO(), clock=clock)
    clock.now = 5.0
    line = log.update(95)
    assert "1.0 s/turn" in line and "ETA 5s" in line  # 5 turns in 5 s, not 95


def test_durations_read_like_a_clock():
    assert [duration(s) for s in (0, 59.4, 87, 3600 + 180)] == ["0s", "59s", "1m27s", "1h03m"]


def test_the_trainer_callback_writes_steps_and_the_metric(tmp_path, capsys):
    from pivotrl.train.metrics import ProgressLines

    cb = ProgressLines(tmp_path / "train.log", every_s=0, metric="reward")
    state = SimpleNamespace(is_world_process_zero=True, max_steps=3, global_step=0)
    cb.on_train_begin(None, state, None)
    for step, reward in ((1, 0.25), (2, 0.5), (3, 0.75)):
        state.global_step = step
        cb.on_log(None, state, None, logs={"reward": reward, "loss": 1.0})
    cb.on_log(None, state, None, logs={"train_runtime": 1.0})  # TRL's summary: no second line
    cb.on_train_end(None, state, None)
    lines = (tmp_path / "train.log").read_text().splitlines()
    assert [line.split(" · ")[0].split(" ", 2)[2] for line in lines] == ["step 1/3", "step 2/3", "step 3/3"]
    assert lines[-1].endswith("reward 0.75")
    assert capsys.readouterr().err.count("step 3/3") == 1
    other = ProgressLines(tmp_path / "other.log", every_s=0)
    other.on_train_begin(None, SimpleNamespace(is_world_process_zero=False, max_steps=3, global_step=0), None)
    other.on_log(None, state, None, logs={"loss": 1.0})
    assert not (tmp_path / "other.log").exists()  # one writer under accelerate launch


def test_profile_off_a_terminal_prints_lines_and_keeps_a_log(tmp_path, tiny_model_dir):
    from typer.testing import CliRunner

    from pivotrl.cli import app
    from pivotrl.extract import ExtractOptions, extract_file

    every = tmp_path / "every.jsonl"
    extract_file(ROOT / "examples" / "trajectories.jsonl", every, ExtractOptions(compact=False))
    turns = tmp_path / "turns.jsonl"
    turns.write_text("".join(every.read_text().splitlines(keepends=True)[:5]))
    out = tmp_path / "profile.jsonl"
    result = CliRunner().invoke(app, ["profile", str(turns), "--model", str(tiny_model_dir), "--k", "1",
                                      "--max-new-tokens", "2", "--out", str(out)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    final = [line for line in result.output.splitlines() if line.startswith("profile 5/5 · ")]
    assert final and ("turns/s" in final[0] or "s/turn" in final[0]) and "ETA 0s" in final[0]
    log = (tmp_path / "profile.log").read_text().splitlines()
    assert log and log[-1].endswith(final[0])


def test_lines_come_while_one_long_unit_of_work_runs(tmp_path):
    """Inside `running()`, a line every period even when no work finished: no rate, no ETA yet."""
    import time

    out = io.StringIO()
    log = ProgressLog("profile", 10, unit="turn", every_s=0.05, stream=out)
    with log.running(poll_s=0.01):
        time.sleep(0.3)
        log.note(5)
        time.sleep(0.15)
    lines = out.getvalue().splitlines()
    every_step = ProgressLog("step", 3, every_s=0, stream=io.StringIO())  # --progress-seconds 0
    with every_step.running(poll_s=0.01):
        time.sleep(0.05)
    assert every_step.stream.getvalue() == ""  # lines at updates only, none in between
    waiting = [line for line in lines if line.startswith("profile 0/10")]
    assert len(waiting) >= 2 and all("ETA" not in line and "– s/turn" in line for line in waiting)
    assert lines[-1].startswith("profile 5/10") and "ETA" in lines[-1]


def test_profile_lines_come_inside_a_chunk_and_the_first_eta_counts_the_whole_chunk(tmp_path, tiny_model_dir):
    """A chunk's profiles arrive together after its sampling: a line written at its first profile
    rated the chunk's time as one turn's (an ETA of the whole chunk time per remaining turn)."""
    import time

    from pivotrl.profile.loop import ProfileConfig
    from pivotrl.profile.runs import profile_file
    from pivotrl.sampling.hf import HFSampler
    from test_profile_pipeline import ScriptedSampler, write_turns

    class SlowSampler(ScriptedSampler):
        def sample(self, prompts, n, params, seeds=None):
            time.sleep(0.5)
            return super().sample(prompts, n, params, seeds)

    class Pass:
        name = "pass"

        def score(self, turn, action):
            from pivotrl.verifiers.base import Score
            return Score(1.0, True)

    tokenizer = HFSampler(str(tiny_model_dir)).tokenizer
    turns = write_turns(tmp_path / "turns.jsonl", 12)
    cfg = ProfileConfig(k=1, chunk_turns=6, max_new_tokens=2, progress_seconds=0.1)
    profile_file(turns, tmp_path / "p.jsonl", SlowSampler(tokenizer), Pass(), tokenizer, cfg,
                 progress=False)
    lines = [line.split(" ", 2)[2] for line in (tmp_path / "p.log").read_text().splitlines()]
    assert lines[0].startswith("profile 0/12") and "ETA" not in lines[0]  # a line before any chunk ended
    first_eta = next(line for line in lines if "ETA" in line)
    assert first_eta.split()[1] in ("6/12", "12/12"), lines  # chunk boundaries only
    assert lines[-1].startswith("profile 12/12")


def test_the_trainer_callback_writes_lines_during_a_long_step_and_stops(tmp_path):
    import threading
    import time

    from pivotrl.train.metrics import ProgressLines

    cb = ProgressLines(tmp_path / "train.log", every_s=0.05)
    state = SimpleNamespace(is_world_process_zero=True, max_steps=3, global_step=0)
    cb.on_train_begin(None, state, None)
    time.sleep(0.3)  # step 1 runs long (a slow generation)
    cb.stop()  # what train() does when training raised
    lines = (tmp_path / "train.log").read_text().splitlines()
    assert len(lines) >= 2 and all(" step 0/3 · " in line for line in lines)
    assert not any(t.name == "progress-step" for t in threading.enumerate())
