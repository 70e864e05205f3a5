import json

import pytest
from typer.testing import CliRunner

from pivotrl.cli import app
from pivotrl.extract import ExtractOptions, eval_split, extract_file, extract_turns
from pivotrl.io.records import Trajectory, Turn, iter_valid

EXAMPLE = "examples/trajectories.jsonl"


def load_example():
    return [Trajectory.model_validate_json(l) for l in open(EXAMPLE)]


def test_every_assistant_message_becomes_a_turn_with_full_context():
    traj = load_example()[0]
    turns, skipped = extract_turns(traj, ExtractOptions())
    assert [t.id for t in turns] == ["weather-0/0", "weather-0/1"]
    first, second = turns
    assert [m.role for m in first.context] == ["system", "user"]
    assert first.expected.tool_calls[0].function.name == "get_weather"
    assert [m.role for m in second.context] == ["system", "user", "assistant", "tool"]
    assert second.expected.content.startswith("It is")
    assert first.tools == traj.tools and first.metadata["source"] == "example"
    assert not skipped


def test_earlier_reasoning_dropped_by_default_and_kept_on_request():
    traj = load_example()[0]
    dropped, _ = extract_turns(traj, ExtractOptions())
    kept, _ = extract_turns(traj, ExtractOptions(keep_reasoning=True))
    assert dropped[1].context[2].reasoning_content is None
    assert kept[1].context[2].reasoning_content == "I should call the tool."
    # The expected action itself keeps its own reasoning either way.
    assert dropped[0].expected.reasoning_content == "I should call the tool."


def test_skip_rules():
    traj = load_example()[0]
    only_calls, skipped = extract_turns(traj, ExtractOptions(only_tool_calls=True))
    assert [t.turn for t in only_calls] == [0] and skipped["not a tool call"] == 1
    by_regex, skipped = extract_turns(traj, ExtractOptions(skip_content_regex=r"°C"))
    assert [t.turn for t in by_regex] == [0] and skipped["content matched skip regex"] == 1


def test_split_is_by_trajectory_seeded_and_complete(tmp_path):
    src = tmp_path / "many.jsonl"
    base = json.loads(open(EXAMPLE).readline())
    with open(src, "w") as fh:
        for i in range(200):
            fh.write(json.dumps({**base, "id": f"t{i}"}) + "\n")
    out, ev = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    s = extract_file(src, out, ExtractOptions(eval_fraction=0.25, seed=3), eval_out=ev)
    train_ids = {t.trajectory_id for t in iter_valid(out, Turn)}
    eval_ids = {t.trajectory_id for t in iter_valid(ev, Turn)}
    assert not train_ids & eval_ids
    assert len(train_ids | eval_ids) == 200
    assert len(eval_ids) == 50 and not s.warnings
    assert s.turns_train + s.turns_eval == 400
    ids = [f"t{i}" for i in range(200)]
    assert eval_ids == eval_split(ids, 0.25, 3)[0]
    assert eval_ids != eval_split(ids, 0.25, 4)[0]


@pytest.mark.parametrize("n,fraction,held,warned", [(8, 0.25, 2, True), (40, 0.2, 8, True), (8, 0.01, 1, True),
                                                    (100, 0.1, 10, False), (101, 0.1, 10, False),
                                                    (1, 0.5, 0, True), (3, 0.9, 2, True), (10, 0.0, 0, False)])
def test_the_eval_split_is_exact_never_empty_and_warned_when_small(n, fraction, held, warned):
    """round(F × N) trajectories, at least one (and one left to train on), whatever the seed."""
    ids = [f"traj-{i}" for i in range(n)]
    for seed in range(5):
        chosen, warning = eval_split(ids, fraction, seed)
        assert len(chosen) == held and chosen <= set(ids)
        assert (warning is not None) is warned


def test_cli_extract_warns_about_a_tiny_eval_split(tmp_path):
    src = tmp_path / "in.jsonl"
    good = json.loads(open(EXAMPLE).readline())
    src.write_text("".join(json.dumps({**good, "id": f"g{i}"}) + "\n" for i in range(8)))
    res = CliRunner().invoke(app, ["extract", str(src), "--out", str(tmp_path / "t.jsonl"), "--eval-fraction",
                                   "0.25"], env={"COLUMNS": "300"})
    assert res.exit_code == 0, res.output
    assert "holds out 2: fewer than 10 held-out trajectories" in res.output
    assert len(json.loads((tmp_path / "t.split.json").read_text())["eval"]) == 2


def test_cli_extract_writes_rejects_next_to_output_with_line_numbers(tmp_path):
    src = tmp_path / "in.jsonl"
    good = open(EXAMPLE).readline().strip()
    other = json.dumps({**json.loads(good), "id": "another-id"})
    src.write_text("\n".join([good, "{oops", good.replace('"tool"', '"robot"'), other]) + "\n")
    out = tmp_path / "turns.jsonl"
    result = CliRunner().invoke(app, ["extract", str(src), "--out", str(out), "--max-rejects", "2"])
    assert result.exit_code == 0, result.output
    rejects = [json.loads(l) for l in (tmp_path / "turns.rejects.jsonl").read_text().splitlines()]
    assert [r["line"] for r in rejects] == [2, 3]
    assert "not JSON" in rejects[0]["reason"] and "robot" in rejects[1]["reason"]
    assert len(out.read_text().splitlines()) == 4
    strict = CliRunner().invoke(app, ["extract", str(src), "--out", str(out), "--strict"])
    assert strict.exit_code == 1


def test_cli_missing_input_is_a_clear_error(tmp_path):
    result = CliRunner().invoke(app, ["extract", str(tmp_path / "nope.jsonl"), "--out",
                                      str(tmp_path / "o.jsonl")])
    text = " ".join(result.output.split())  # rich wraps long lines
    assert result.exit_code == 2 and "no such file" in text and "nope.jsonl" in text


def test_rejects_over_the_limit_fail_after_writing_and_the_first_lines_are_shown(tmp_path):
    """Bad lines make extract exit 1 unless --max-rejects allows them; the outputs and the rejects
    file are written either way, and the summary shows the first rejected lines in full."""
    src = tmp_path / "in.jsonl"
    good = json.loads(open(EXAMPLE).readline())
    lines = [json.dumps({**good, "id": f"g{i}"}) for i in range(3)] + ["{oops", '{"id": "x"}']
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "turns.jsonl"
    res = CliRunner().invoke(app, ["extract", str(src), "--out", str(out)], env={"COLUMNS": "400"})
    assert res.exit_code == 1 and "2 of 5 lines rejected, more than --max-rejects 0" in res.output
    # however narrow the terminal, each rejected line is shown whole (folded, not cut)
    table = "".join(c for c in res.output.split("first rejected lines")[1] if c not in "│ \n")
    assert f"{src}:4:notJSON" in table and f"{src}:5[messages]:missingfield'messages'" in table
    assert len(out.read_text().splitlines()) == 6
    assert len((tmp_path / "turns.rejects.jsonl").read_text().splitlines()) == 2
    assert CliRunner().invoke(app, ["extract", str(src), "--out", str(out), "--max-rejects", "2"]).exit_code == 0
    assert extract_file(src, out, ExtractOptions(max_rejects=-1)).turns_train == 6


def test_unknown_top_level_fields_travel_in_each_turns_metadata():
    traj = Trajectory.model_validate({**json.loads(open(EXAMPLE).readline()), "source": "crawl-3",
                                      "metadata": {"source": "mine", "k": 1}})
    turns, _ = extract_turns(traj, ExtractOptions())
    assert all(t.metadata["source"] == "mine" and t.metadata["k"] == 1 for t in turns)  # metadata wins
    other = Trajectory.model_validate({**json.loads(open(EXAMPLE).readline()), "license": "cc-by"})
    assert all(t.metadata["license"] == "cc-by" for t in extract_turns(other, ExtractOptions())[0])
