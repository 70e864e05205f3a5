"""A long run prints its plan, saves it with the config as used, and `--dry-run` stops there (train,
sft, e2e, profile); a run that would train nothing is an error, never an exit 0 with the base model
saved as the trained one; a chat-template variable the template never reads is named (an error with
--strict); Ctrl-C says the exact command that continues or restarts the run and exits 130."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pivotrl.cli import app

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "trajectories.jsonl"


def run(*argv):
    return CliRunner().invoke(app, list(map(str, argv)), env={"COLUMNS": "400", "NO_COLOR": "1"})


@pytest.fixture(scope="module")
def turns(tmp_path_factory):
    from pivotrl.extract import extract_file

    path = tmp_path_factory.mktemp("plan") / "turns.jsonl"
    extract_file(EXAMPLE, path)
    return path


def first_lines(src: Path, n: int, dst: Path) -> Path:
    dst.write_text("".join(src.read_text().splitlines(keepends=True)[:n]))
    return dst


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def given_again(output: str, args: list) -> str:
    """The flag a stopped run's message adds to the command it was given: its last line is that
    command, the same words (options in any order) plus one flag."""
    import shlex

    words = shlex.split(output.rstrip().splitlines()[-1])
    assert words[:2] == ["pivotrl", args[0]], words

    def pairs(tokens):
        out, i = set(), 0
        while i < len(tokens):
            nxt = tokens[i + 1] if i + 1 < len(tokens) else None
            if tokens[i].startswith("--") and nxt is not None and not nxt.startswith("--"):
                out.add((tokens[i], nxt))
                i += 2
            else:
                out.add((tokens[i],))
                i += 1
        return out

    given, again = pairs([str(a) for a in args[1:]]), pairs(words[2:])
    assert given <= again, given - again
    (added,) = again - given
    return added[0]


def train_args(pivots, model, out, *extra):
    return ["train", "--pivots", pivots, "--model", model, "--output-dir", out, "--num-generations", "2",
            "--max-completion-length", "8", *extra]


def test_train_on_fewer_pivots_than_one_step_exits_non_zero_and_saves_nothing(turns, tiny_model_dir, tmp_path):
    three = first_lines(turns, 3, tmp_path / "p3.jsonl")  # a step takes 4 pivots
    result = run(*train_args(three, tiny_model_dir, tmp_path / "o"))
    assert result.exit_code == 2, result.output
    assert "fewer than one step takes (4 pivots per step" in result.output and "0 steps" in result.output
    out = tmp_path / "o"
    assert not (out / "model.safetensors").exists() and not (out / "config.json").exists()


def test_dry_run_prints_the_plan_and_touches_nothing(turns, tiny_model_dir, tmp_path):
    out = tmp_path / "o"
    result = run(*train_args(turns, tiny_model_dir, out, "--dry-run"))
    assert result.exit_code == 0, result.output
    import re

    read = len(turns.read_text().splitlines())
    kept = int(re.search(rf"pivots: (\d+) \(of {read} read", result.output).group(1))
    for line in (f"steps: {-(-kept // 4)}", "pivots per step: 4", "completions per step: 8",
                 "token budget: max_completion_length 8", "epochs: 1", "ETA"):
        assert line in result.output, line
    assert "dry run, nothing trained or written" in result.output and not out.exists()
    # an earlier run's folder stays byte for byte, --overwrite or not
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    before = snapshot(out)
    assert run(*train_args(turns, tiny_model_dir, out, "--overwrite", "--dry-run")).exit_code == 0
    assert snapshot(out) == before


def test_a_template_variable_the_template_never_reads_is_named(turns, tiny_model_dir, tmp_path):
    args = train_args(turns, tiny_model_dir, tmp_path / "o", "--chat-template-kwargs", "{enable_thinkng: false}",
                      "--dry-run")
    result = run(*args)
    assert result.exit_code == 0, result.output
    assert "warning: chat_template_kwargs 'enable_thinkng'" in result.output
    strict = run(*args, "--strict")
    assert strict.exit_code == 2 and "'enable_thinkng'" in strict.output and "--strict" in strict.output


def test_template_variables_are_read_from_the_template_source():
    import trl

    from pivotrl.formats.template_vars import template_variables

    qwen3 = (Path(trl.__file__).parent / "chat_templates" / "qwen3_training.jinja").read_text()
    names = template_variables(qwen3)  # {% generation %} blocks parse too
    assert "enable_thinking" in names and "enable_thinkng" not in names


def test_train_saves_the_plan_and_ctrl_c_before_a_checkpoint_says_how_to_restart(
        turns, tiny_model_dir, tmp_path, monkeypatch):
    import pivotrl.train.grpo as grpo

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(grpo, "build_trainer", interrupted)
    out = tmp_path / "o"
    result = run(*train_args(turns, tiny_model_dir, out))
    assert result.exit_code == 130, result.output
    assert "stopped before the first checkpoint" in result.output and "--resume\n" not in result.output
    assert given_again(result.output, train_args(turns, tiny_model_dir, out)) == "--overwrite"
    plan = json.loads((out / "run_plan.json").read_text())
    assert plan["plan"]["steps"] == -(-plan["plan"]["items"] // 4) and plan["plan"]["read"] == len(
        turns.read_text().splitlines())
    used = yaml.safe_load((out / "run_config.yaml").read_text())
    # every field, as used: the prompt cap filled in from the model, paths absolute
    from pivotrl.train.config import GRPORunConfig

    assert set(used) == set(GRPORunConfig.model_fields) and used["max_prompt_length"] == 2048 - 8
    assert used["pivots"] == str(turns.resolve())
    assert GRPORunConfig.from_yaml(out / "run_config.yaml").num_generations == 2  # a valid --config


def test_ctrl_c_after_a_checkpoint_says_resume(turns, tiny_model_dir, tmp_path, monkeypatch):
    import pivotrl.train.grpo as grpo

    monkeypatch.setattr(grpo, "build_trainer", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    out = tmp_path / "o"
    (out / "checkpoint-2").mkdir(parents=True)
    (out / "checkpoint-2" / "trainer_state.json").write_text("{}")
    result = run(*train_args(turns, tiny_model_dir, out, "--resume"))
    assert result.exit_code == 130, result.output
    assert "keeps checkpoint-2" in result.output
    assert given_again(result.output, train_args(turns, tiny_model_dir, out)) == "--resume"
    # a resumed run's ETA: its steps left at the median step time it recorded
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "step_time": 10.0}) + "\n" for s in (1, 2)))
    dry = run(*train_args(turns, tiny_model_dir, out, "--resume", "--max-steps", "8", "--dry-run"))
    assert "steps: 8 (resuming from checkpoint-2)" in dry.output and "ETA: 1m00s (6 steps" in dry.output
    assert (out / "checkpoint-2" / "trainer_state.json").exists()


def test_sft_plan_dry_run_and_ctrl_c(tiny_model_dir, tmp_path, monkeypatch):
    import pivotrl.train.sft as sft

    out = tmp_path / "s"
    args = ["sft", "--data", EXAMPLE, "--model", tiny_model_dir, "--output-dir", out, "--max-length", "2048"]
    result = run(*args, "--dry-run")
    assert result.exit_code == 0, result.output
    assert "trajectories per step: 8" in result.output and "token budget: max_length 2048" in result.output
    assert not out.exists()
    monkeypatch.setattr(sft, "build_sft_trainer", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    result = run(*args)
    assert result.exit_code == 130 and "--overwrite" in result.output, result.output
    assert json.loads((out / "run_plan.json").read_text())["plan"]["unit"] == "trajectories"
    assert (out / "run_config.yaml").exists()


def test_e2e_plan_dry_run_and_ctrl_c(tiny_model_dir, tmp_path, monkeypatch):
    import transformers

    from pivotrl.io.records import write_atomic
    from pivotrl_testbed.testbed.tasks import make_tasks

    from pivotrl.io.records import Message

    tasks = tmp_path / "tasks.jsonl"  # a trajectory file: e2e uses each one's opening messages only
    write_atomic(tasks, [t.model_copy(update={"messages": [*t.messages, Message(role="assistant", content="ok")]})
                         for t in make_tasks("toolshop", "train", 3)])
    out = tmp_path / "e"
    args = ["e2e", "--tasks", tasks, "--world", "toolshop", "--model", tiny_model_dir, "--output-dir", out,
            "--max-steps", "5", "--num-generations", "2", "--split", tmp_path / "none.split.json"]
    result = run(*args[:-2], "--dry-run")
    assert result.exit_code == 0, result.output
    assert "tasks: 3 (of 3 read)" in result.output and "steps: 5" in result.output
    assert "completions per step: 8" in result.output and not out.exists()
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    result = run(*args[:-2])
    assert result.exit_code == 130 and "--overwrite" in result.output, result.output
    assert (out / "run_plan.json").exists() and (out / "run_config.yaml").exists()


def test_profile_plan_dry_run_and_ctrl_c_exit_130_with_the_resume_command(turns, tiny_model_dir, tmp_path,
                                                                          monkeypatch):
    from pivotrl.sampling.hf import HFSampler

    three = first_lines(turns, 3, tmp_path / "t3.jsonl")
    out = tmp_path / "p.jsonl"
    args = ["profile", three, "--model", tiny_model_dir, "--out", out, "--k", "2", "--max-new-tokens", "4",
            "--no-progress"]
    result = run(*args, "--dry-run")
    assert result.exit_code == 0, result.output
    assert "turns: 3 (of 3 read)" in result.output and "samples: 6" in result.output
    assert list(tmp_path.glob("p.*")) == []
    monkeypatch.setattr(HFSampler, "sample", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    result = run(*args)
    assert result.exit_code == 130, result.output
    assert given_again(result.output, args) == "--resume"
    plan = json.loads((tmp_path / "p.plan.json").read_text())
    assert plan["plan"]["details"]["samples"] == 6 and plan["config"]["k"] == 2


def test_ctrl_c_in_a_prefetch_loop_stops_its_worker():
    """Ctrl-C while a chunk is sampled: the worker is stopped and waited for, so no thread is still
    inside the sampler when the interpreter exits (which aborted the process, SIGABRT, not 130)."""
    import signal

    from pivotrl.sampling.pipeline import prefetch

    running, ended = threading.Event(), threading.Event()

    def slow(item):
        running.set()
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # Python bytecode, as a model's forward runs between ops
                pass
        finally:
            ended.set()
        return item

    main = threading.main_thread().ident  # a real SIGINT to the main thread, as Ctrl-C sends
    # Python's own handler, whatever an earlier test or library left installed (a handler that
    # defers the interrupt would hold the main thread until the worker ends by itself).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=lambda: running.wait(10) and signal.pthread_kill(main, signal.SIGINT),
                         daemon=True).start()
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            list(prefetch(slow, range(3)))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert ended.is_set() and time.monotonic() - started < 30


def test_the_rl_run_configs_share_their_common_fields_instead_of_redeclaring_them():
    """E2ERunConfig takes its optimizer, checkpoint and group-RL fields from the same blocks as
    GRPORunConfig (one declaration, one help); it re-declares only its per-turn token budget and its
    step count (E2E has no epochs), with their own meaning."""
    from pivotrl.train.config import GRPORunConfig, GroupRLOptions, RunBasics, SFTRunConfig
    from pivotrl_testbed.e2e_config import E2ERunConfig

    assert issubclass(E2ERunConfig, RunBasics) and issubclass(E2ERunConfig, GroupRLOptions)
    assert issubclass(GRPORunConfig, RunBasics) and issubclass(GRPORunConfig, GroupRLOptions)
    assert issubclass(SFTRunConfig, RunBasics)
    shared = set(RunBasics.model_fields) | set(GroupRLOptions.model_fields)
    assert len(shared) == 18
    assert set(E2ERunConfig.__annotations__) & shared == {"max_completion_length"}


def test_a_quiet_launch_saves_the_plan_without_printing_it(tmp_path):
    """The demo runs many training segments and says itself what runs: their plans are saved in
    each run folder, not printed (a plan block per segment buried its progress lines)."""
    import io

    from pivotrl.io.run_plan import Launch, RunPlan, start_run
    from pivotrl.select import SelectConfig

    plan = RunPlan(verb="train", unit="pivots", items=8, steps=2, per_step=4)
    for quiet in (False, True):
        stream = io.StringIO()
        assert start_run(plan, SelectConfig(), tmp_path / f"{quiet}.json", None, Launch(stream=stream, quiet=quiet))
        assert ("pivotrl train: plan" in stream.getvalue()) is not quiet
        assert json.loads((tmp_path / f"{quiet}.json").read_text())["plan"]["steps"] == 2
