"""Inputs and outputs: no verb overwrites an input, every line is read one way and accounted for."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from typer.testing import CliRunner

from pivotrl.cli import app
from pivotrl.extract import extract_file

GOOD = {"id": "t1", "messages": [{"role": "user", "content": "hi"},
                                 {"role": "assistant", "content": "hello"}]}


def traj(i: int, **extra) -> str:
    return json.dumps({**GOOD, "id": f"t{i}", **extra})


def write(path, lines: list[str]) -> os.PathLike:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_extract_refuses_eval_out_equal_to_out(tmp_path):
    src = write(tmp_path / "in.jsonl", [traj(i) for i in range(20)])
    out = tmp_path / "turns.jsonl"
    res = CliRunner().invoke(app, ["extract", str(src), "--out", str(out), "--eval-fraction",
                                   "0.5", "--eval-out", str(out)])
    assert res.exit_code == 2 and "same file" in " ".join(res.output.split())
    assert not out.exists()


@pytest.mark.parametrize("link", ["same", "symlink", "hardlink"])
def test_extract_refuses_to_write_onto_its_input(tmp_path, link):
    src = write(tmp_path / "in.jsonl", [traj(i) for i in range(3)])
    before = src.read_bytes()
    out = tmp_path / "out.jsonl"
    if link == "same":
        out = tmp_path / "sub" / ".." / "in.jsonl"
        (tmp_path / "sub").mkdir()
    elif link == "symlink":
        out.symlink_to(src)
    else:
        os.link(src, out)
    res = CliRunner().invoke(app, ["extract", str(src), "--out", str(out)])
    assert res.exit_code == 2 and "same file" in " ".join(res.output.split())
    assert src.read_bytes() == before


def test_verify_refuses_out_equal_to_its_input(tmp_path):
    cases = write(tmp_path / "cases.jsonl", ['{"id": "x"}'])
    res = CliRunner().invoke(app, ["verify", str(cases), "--out", str(cases)])
    assert res.exit_code == 2
    assert cases.read_text() == '{"id": "x"}\n'


def test_verify_answers_exactly_one_line_per_input_line(tmp_path):
    """A lone CR (and other characters str.splitlines breaks on) inside a JSON line is data."""
    case = {"id": "c1", "trajectory_id": "t", "turn": 0, "context": [{"role": "user",
            "content": "a\rb\x0bc\u2028d"}], "expected": {"role": "assistant", "content": "ok"},
            "candidate": {"content": "ok"}}
    # a raw CR is JSON whitespace between tokens; U+2028 is allowed raw inside strings
    lines = [json.dumps(case, ensure_ascii=False).replace(', "turn"', ',\r"turn"')] * 3
    lines += ["", "not json"]
    cases = write(tmp_path / "cases.jsonl", lines)
    out = tmp_path / "res.jsonl"
    res = CliRunner().invoke(app, ["verify", str(cases), "--verifier", "exact", "--out", str(out)])
    assert res.exit_code == 0, res.output
    got = out.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(got) == 5
    assert [json.loads(g)["id"] for g in got] == ["c1", "c1", "c1", None, None]


def _nested(depth: int) -> dict:
    meta: dict = {}
    for _ in range(depth):
        meta = {"x": meta}
    return meta


# (case, the middle line's bytes, what becomes of it: "ok", "blank" or a reject reason)
LINE_RULES = [
    ("bom", b"\xef\xbb\xbf" + traj(1).encode(), "ok"),  # only at the start of the file
    ("whitespace", b"   \t\r", "blank"),
    ("empty", b"", "blank"),
    ("deep_json", b"[" * 100_000 + b"]" * 100_000, "nested deeper than 64"),
    ("deep_metadata", traj(1, metadata=_nested(300)).encode(), "nested deeper than 64"),
    ("invalid_utf8", traj(1).encode()[:-1] + b', "domain": "\xff\xfe"}', "not UTF-8"),
    ("duplicate_id", traj(0).encode(), "duplicate trajectory id 't0' (first on line 1)"),
]


@pytest.mark.parametrize("case,line,expect", LINE_RULES, ids=[c[0] for c in LINE_RULES])
def test_each_line_rule_is_applied_and_counted(tmp_path, case, line, expect):
    src = tmp_path / "in.jsonl"
    first = traj(0).encode()
    if case == "bom":  # a BOM belongs to the first line of a file
        first, line = line, traj(2).encode()
    src.write_bytes(first + b"\n" + line + b"\n" + traj(3).encode() + b"\n")
    summary = extract_file(src, tmp_path / "turns.jsonl")
    rejects = [json.loads(l) for l in (tmp_path / "turns.rejects.jsonl").read_text().splitlines()]
    assert summary.read == 3  # read = processed + rejected + blank
    assert summary.trajectories + sum(summary.rejects.values()) + summary.blank == 3
    if expect == "ok":
        assert summary.trajectories == 3 and rejects == []
    elif expect == "blank":
        assert (summary.trajectories, summary.blank, rejects) == (2, 1, [])
    else:
        assert summary.trajectories == 2 and [r["line"] for r in rejects] == [2]
        assert expect in rejects[0]["reason"]
    turn_ids = [json.loads(l)["id"] for l in (tmp_path / "turns.jsonl").read_text().splitlines()]
    assert len(turn_ids) == len(set(turn_ids)) == summary.trajectories


HOLD_LOCK = """
import sys, time
from pivotrl.io.outputs import output_lock
with output_lock(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(60)
"""


def test_profile_out_is_locked_against_a_second_run_but_not_by_a_dead_one(tmp_path):
    from pivotrl.profile.loop import ProfileConfig
    from pivotrl.profile.runs import profile_file

    out = tmp_path / "profile.jsonl"
    turns = write(tmp_path / "turns.jsonl", [])
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(out)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        with pytest.raises(ValueError, match="being written by another run"):
            profile_file(turns, out, None, None, None, ProfileConfig(k=2))
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    assert out.with_name("profile.jsonl.lock").exists()  # left behind by the killed run
    from pivotrl.io.outputs import output_lock

    taken = threading.Event()

    def take() -> None:
        with output_lock(out):  # a stale lock file does not block the resume
            taken.set()

    worker = threading.Thread(target=take, daemon=True)
    worker.start()
    assert taken.wait(60)  # bounds a hang: a lock held by a dead process would block for ever


@pytest.mark.parametrize("argv", [
    ["select", "{f}", "--out", "{f}"],
    ["export", "{f}", "--format", "nemo-gym", "--out", "{f}"],
    ["import", "nemo-gym", "{f}", "--out", "{f}"],
    ["profile", "{f}", "--model", "none", "--out", "{f}"],
    ["profile", "{g}", "{f}", "--merge", "--out", "{f}"],
    ["extract", "{f}", "--out", "{h}"],  # the rejects file of --out {h} is {f}
])
def test_every_verb_refuses_to_overwrite_an_input(tmp_path, argv):
    f = write(tmp_path / "data.rejects.jsonl", ['{"id": "keep me"}'])
    g = write(tmp_path / "other.jsonl", [traj(1)])
    h = tmp_path / "data.jsonl"
    args = [a.format(f=f, g=g, h=h) for a in argv]
    before = f.read_bytes()
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and "same file" in " ".join(res.output.split()), res.output
    assert f.read_bytes() == before


def test_evaluate_refuses_to_write_its_result_onto_an_input(tmp_path):
    turns = write(tmp_path / "turns.jsonl", ['{"id": "keep me"}'])
    res = CliRunner().invoke(app, ["evaluate", "--model", str(tmp_path), "--turns", str(turns),
                                   "--out", str(turns)])
    assert res.exit_code == 2 and "same file" in " ".join(res.output.split())
    assert turns.read_text() == '{"id": "keep me"}\n'


def test_a_run_folder_is_refused_unless_resumed_or_overwritten_and_overwrite_clears_only_the_run(tmp_path):
    from pivotrl.io.outputs import OutputExistsError, claim_output
    from pivotrl.io.run_folder import claim_run_folder

    run = tmp_path / "run"
    claim = dict(model=tmp_path / "model", inputs=[])
    claim_run_folder(run, **claim, resume=False, overwrite=False)  # missing: nothing to do
    (run / "checkpoint-2").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    (run / "notes.md").write_text("mine\n")  # not written by a run: --overwrite keeps it
    (run / "pivotrl_run.json").write_text('{"wrote": ["config.json"]}')
    (run / "config.json").write_text("{}")
    with pytest.raises(OutputExistsError, match=r"checkpoint-2, metrics.jsonl, …\).*--resume.*--overwrite"):
        claim_run_folder(run, **claim, resume=False, overwrite=False)
    claim_run_folder(run, **claim, resume=True, overwrite=False)
    assert (run / "metrics.jsonl").read_text().count("\n") == 2
    with pytest.raises(ValueError, match="exclude each other"):
        claim_run_folder(run, **claim, resume=True, overwrite=True)
    claim_run_folder(run, **claim, resume=False, overwrite=True)
    assert sorted(p.name for p in run.iterdir()) == ["notes.md"]
    mine = tmp_path / "mine"  # no run's folder (a model folder has config.json too): never cleared
    (mine / "notes").mkdir(parents=True)
    (mine / "config.json").write_text("{}")
    for resume, overwrite in ((False, True), (True, False), (False, False)):
        # no flag is suggested that would be refused next
        with pytest.raises(OutputExistsError, match="but no run.*only what a run wrote; choose another output$"):
            claim_run_folder(mine, **claim, resume=resume, overwrite=overwrite)
    assert (mine / "notes").is_dir() and (mine / "config.json").is_file()
    out = write(tmp_path / "profile.jsonl", ['{"id": "a"}'])
    stats = write(tmp_path / "profile.stats.json", ["{}"])
    with pytest.raises(OutputExistsError, match="1 lines"):
        claim_output(out, resume=False, overwrite=False)
    claim_output(out, resume=False, overwrite=True, companions=[stats])
    assert not out.exists() and not stats.exists()


@pytest.mark.parametrize("verb,flags", [
    ("train", ["--pivots", "{p}", "--model", "{m}"]),
    ("sft", ["--data", "{p}", "--model", "{m}"]),
])
def test_train_and_sft_refuse_an_output_folder_with_a_run_in_it(tmp_path, verb, flags):
    run = tmp_path / "run"
    (run / "checkpoint-4").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(f'{{"step": {i}}}\n' for i in range(1, 5)))
    p = write(tmp_path / "data.jsonl", [traj(1)])
    args = [a.format(p=p, m=tmp_path / "model") for a in flags]
    res = CliRunner().invoke(app, [verb, *args, "--output-dir", str(run)], env={"COLUMNS": "300"})
    assert res.exit_code == 1 and "already holds" in res.output and "--overwrite" in res.output, res.output
    assert (run / "metrics.jsonl").read_text().count("\n") == 4 and (run / "checkpoint-4").is_dir()


def test_e2e_refuses_an_output_folder_with_a_run_in_it(tmp_path):
    from pivotrl.io.outputs import OutputExistsError
    from pivotrl_testbed.e2e import E2ERunConfig, train_e2e

    run = tmp_path / "run"
    run.mkdir()
    (run / "train.log").write_text("step 1/2\n")
    with pytest.raises(OutputExistsError):
        train_e2e(E2ERunConfig(world="toolshop", tasks=tmp_path / "t.jsonl", model=str(tmp_path / "model"),
                               output_dir=run))
    assert (run / "train.log").read_text() == "step 1/2\n"


def test_profile_continues_only_with_resume_and_starts_over_with_overwrite(tmp_path, tiny_model_dir):
    turns, few = tmp_path / "turns.jsonl", tmp_path / "few.jsonl"
    few.write_text("".join(open("examples/trajectories.jsonl").readlines()[:4]))  # a few turns do
    extract_file(few, turns)
    out = tmp_path / "profile.jsonl"
    base = ["profile", str(turns), "--model", str(tiny_model_dir), "--k", "1", "--max-new-tokens", "2",
            "--out", str(out), "--no-progress"]
    assert CliRunner().invoke(app, base).exit_code == 0
    before = out.read_text()
    again = CliRunner().invoke(app, base, env={"COLUMNS": "300"})
    assert again.exit_code == 1 and "--resume" in again.output and out.read_text() == before
    assert CliRunner().invoke(app, base + ["--resume"]).exit_code == 0 and out.read_text() == before
    assert CliRunner().invoke(app, base + ["--overwrite"]).exit_code == 0
    assert out.read_text() == before  # the same seeds: the same profiles, written anew
    assert len(json.loads((tmp_path / "profile.stats.json").read_text())["runs"]) == 1
    assert not (tmp_path / "profile.jsonl.lock").exists()  # a finished run leaves no lock file


def test_a_start_that_failed_before_any_result_does_not_block_the_next(tmp_path):
    from pivotrl.io.run_folder import claim_run_folder

    run = tmp_path / "run"
    (run / ".prompt_cache").mkdir(parents=True)
    (run / "prompts.rank0.jsonl").write_text("{}\n")
    (run / "pivotrl_run.json").write_text("{}")
    claim_run_folder(run, model="m", inputs=[], resume=False, overwrite=False)


def test_another_process_writing_the_record_does_not_block_a_start(tmp_path):
    """Under several processes one claims the folder while the main process writes the record:
    the record's temporary (io.atomic, before its rename) is part of the start, not a run."""
    from pivotrl.io.outputs import OutputExistsError
    from pivotrl.io.run_folder import claim_run_folder

    run = tmp_path / "run"
    run.mkdir()
    (run / ".pivotrl_run.json.hj2rv66s.tmp").write_text("{")
    claim_run_folder(run, model="m", inputs=[], resume=False, overwrite=False)
    (run / ".metrics.jsonl.x1.tmp").write_text("{")  # not a start's file: something is there
    with pytest.raises(OutputExistsError):
        claim_run_folder(run, model="m", inputs=[], resume=False, overwrite=False)


def test_a_misspelt_yaml_key_names_the_field_it_is_closest_to(tmp_path):
    """As a mistyped flag does: the run file's `learnin_rate` and `lora.alhpa` name their fields;
    a key close to nothing is refused without a guess."""
    from typer.testing import CliRunner

    from pivotrl.cli import app

    run_yaml = tmp_path / "run.yaml"
    run_yaml.write_text("pivots: p.jsonl\nmodel: m\nlearnin_rate: 1.0e-4\nlora: {alhpa: 8}\nzzzz: 1\n")
    result = CliRunner().invoke(app, ["train", "--config", str(run_yaml), "--dry-run"], env={"COLUMNS": "400"})
    assert result.exit_code == 2, result.output
    out = " ".join(result.output.split())
    assert "learnin_rate: Extra inputs are not permitted (did you mean 'learning_rate'?)" in out
    assert "lora.alhpa: Extra inputs are not permitted (did you mean 'alpha'?)" in out
    assert "zzzz: Extra inputs are not permitted;" in out or out.rstrip().endswith("zzzz: Extra inputs are not permitted")
