"""`pivotrl evaluate --turns`: turn accuracy on held-out turns of any data set, with a 95%
interval clustered by trajectory (pivotrl.evaluate.turns); and shard-first reading of turns files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pivotrl.evaluate.turns import (
    TurnEvalConfig,
    clustered_accuracy,
    evaluate_turns_file,
    items_path,
    turn_seed,
    wilson,
)
from pivotrl.io.turn_files import read_turns, shard_of
from pivotrl.sampling.base import Completion

TOOLS = [{"type": "function", "function": {"name": "get_order", "description": "Look up an order.",
          "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}}}}]


def turn(traj: int, k: int) -> dict:
    order = f"O-{traj}{k}"
    return {"id": f"tr{traj}/{k}", "trajectory_id": f"tr{traj}", "turn": k, "tools": TOOLS,
            "context": [{"role": "user", "content": f"Where is order {order}?"}],
            "expected": {"role": "assistant", "tool_calls": [{"id": "c0", "type": "function", "function": {
                "name": "get_order", "arguments": json.dumps({"order_id": order})}}]}}


def write_turns(path: Path, rows: list[dict], extra_lines: tuple[str, ...] = ()) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "".join(x + "\n" for x in extra_lines))
    return path


def call(order: str) -> str:
    return '<tool_call>\n{"name": "get_order", "arguments": {"order_id": "%s"}}\n</tool_call>' % order


class ScriptedSampler:
    """Answers each prompt with the right call when `right(prompt)`, else a wrong one; records
    the seeds it was given per prompt."""

    name = "scripted"

    def __init__(self, right):
        self.right = right
        self.seeds: dict[str, int] = {}

    def sample(self, prompts, n, params, seeds=None):
        out = []
        for prompt, seed in zip(prompts, seeds):
            order = prompt.split("Where is order ")[1].split("?")[0]
            self.seeds[order] = seed
            text = call(order) if self.right(order) else call("O-wrong")
            out.append([Completion(text, 10, 20, "stop")] * n)
        return out


# ---------------------------------------------------------------- the interval


def test_wilson_matches_the_textbook_value():
    lo, hi = wilson(0.5, 100)
    assert lo == pytest.approx(0.4038, abs=1e-4) and hi == pytest.approx(0.5962, abs=1e-4)


def test_correlated_turns_count_about_once_per_trajectory():
    # 10 trajectories x 5 turns, every turn of a trajectory the same: ~10 observations, not 50.
    values = [float(t < 5) for t in range(10) for _ in range(5)]
    clusters = [f"tr{t}" for t in range(10) for _ in range(5)]
    res = clustered_accuracy(values, clusters)
    assert res["accuracy"] == 0.5 and res["turns"] == 50 and res["clusters"] == 10
    assert 4.5 < res["design_effect"] < 6.0 and 8 < res["effective_n"] < 11
    assert res["ci95"][1] - res["ci95"][0] > (wilson(0.5, 50)[1] - wilson(0.5, 50)[0]) * 2


def test_independent_looking_turns_keep_the_plain_interval():
    # Each trajectory half right, half wrong: clustering changes nothing (design effect floor 1).
    values = [float(k % 2) for _ in range(10) for k in range(4)]
    clusters = [f"tr{t}" for t in range(10) for _ in range(4)]
    res = clustered_accuracy(values, clusters)
    assert res["design_effect"] == 1.0 and res["ci95"] == list(wilson(0.5, 40))


def test_all_right_still_has_an_interval_and_one_trajectory_is_one_observation():
    res = clustered_accuracy([1.0] * 12, [f"tr{i % 4}" for i in range(12)])
    assert res["accuracy"] == 1.0 and res["ci95"][1] == 1.0 and res["ci95"][0] < 0.9
    one = clustered_accuracy([1.0, 0.0, 1.0], ["a", "a", "a"])
    assert one["effective_n"] == 1.0 and one["ci95"] == list(wilson(2 / 3, 1.0))
    assert clustered_accuracy([], [])["accuracy"] is None
    none = clustered_accuracy([0.0] * 6, ["a", "b", "c"] * 2)
    assert none["ci95"][0] == 0.0 < none["ci95"][1]


# ---------------------------------------------------------------- scoring a file


def test_accuracy_of_a_scripted_model_through_the_verifier(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    from pivotrl.verifiers import get_verifier

    rows = [turn(t, k) for t in range(4) for k in range(3)]
    path = write_turns(tmp_path / "eval.jsonl", rows, extra_lines=("{not json",))
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    right = lambda order: order.startswith(("O-0", "O-1", "O-2")) or order == "O-32"  # noqa: E731
    runs = {}
    for chunk in (2, 64):
        sampler = ScriptedSampler(right)
        cfg = TurnEvalConfig(chunk_turns=chunk, seed=7, max_new_tokens=16)
        out = tmp_path / f"r{chunk}.json"
        runs[chunk] = evaluate_turns_file(path, out, sampler, get_verifier("toolcall"), tok, cfg)
        assert sampler.seeds == {f"O-{t}{k}": turn_seed(7, f"tr{t}/{k}") for t in range(4) for k in range(3)}
    res = runs[2]
    assert res["accuracy"] == pytest.approx(10 / 12) and res["turns"] == 12 and res["clusters"] == 4
    assert res["rejected_lines"] == 1 and res["invalid_samples"] == 0
    assert res["ci95"][0] < 10 / 12 < res["ci95"][1]
    assert {k: v for k, v in res.items() if k != "seconds"} == {k: v for k, v in runs[64].items()
                                                               if k not in ("seconds", "settings")} | {
        "settings": res["settings"]}
    items = [json.loads(line) for line in items_path(tmp_path / "r2.json").read_text().splitlines()]
    assert [i["id"] for i in items] == [r["id"] for r in rows]
    assert [i["success"] for i in items if i["trajectory_id"] == "tr3"] == [0.0, 0.0, 1.0]
    assert (tmp_path / "r2.rejects.jsonl").exists()


def test_an_output_never_overwrites_the_input(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    from pivotrl.verifiers import get_verifier

    path = write_turns(tmp_path / "eval.items.jsonl", [turn(0, 0)])
    before = path.read_text()
    with pytest.raises(ValueError, match="overwrite"):
        evaluate_turns_file(path, tmp_path / "eval.json", ScriptedSampler(lambda o: True),
                            get_verifier("toolcall"), AutoTokenizer.from_pretrained(tiny_model_dir),
                            TurnEvalConfig())
    assert path.read_text() == before


def test_cli_evaluate_turns_with_the_hf_model(tmp_path, tiny_model_dir):
    from typer.testing import CliRunner

    from pivotrl.cli import app

    path = write_turns(tmp_path / "eval.jsonl", [turn(t, k) for t in range(3) for k in range(2)])
    out = tmp_path / "result.json"
    res = CliRunner().invoke(app, ["evaluate", "--turns", str(path), "--model", str(tiny_model_dir),
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["turns"] == 6 and doc["clusters"] == 3 and doc["samples"] == 6
    assert doc["ci95"][0] <= doc["accuracy"] <= doc["ci95"][1]
    assert len(items_path(out).read_text().splitlines()) == 6
    both = CliRunner().invoke(app, ["evaluate", "--turns", str(path), "--model", str(tiny_model_dir),
                                    "--out", str(out), "--testbed", str(tmp_path)])
    assert both.exit_code == 2
    unknown = CliRunner().invoke(app, ["evaluate", "--turns", str(path), "--model", str(tiny_model_dir),
                                       "--out", str(out), "--verifier", "no-such-verifier"])
    assert unknown.exit_code == 2 and "no-such-verifier" in unknown.output


# ---------------------------------------------------------------- shard-first reading


def test_sharded_reading_partitions_the_file_and_still_rejects(tmp_path):
    rows = [turn(t, k) for t in range(6) for k in range(3)]
    dup = dict(rows[4], context=[{"role": "user", "content": "a second copy"}])
    path = write_turns(tmp_path / "turns.jsonl", rows + [dup], extra_lines=('{"id": 5}', "[1, 2]"))
    every, rejects = read_turns(path)
    assert len(every) == 18 and len(rejects) == 3  # the duplicate and the two bad lines
    seen = []
    for i in range(4):
        mine, shard_rejects = read_turns(path, (i, 4))
        assert all(shard_of(t.id, 4) == i for _, t in mine)
        seen += mine
        # Bad lines have no trustworthy id: every shard reports them; the duplicate, its shard only.
        dups = [r for r in shard_rejects if "duplicate" in r.reason]
        assert len(shard_rejects) - len(dups) == 2
        assert len(dups) == (1 if shard_of(rows[4]["id"], 4) == i else 0)
    assert sorted(seen, key=lambda x: x[0]) == every


# ---------------------------------------------------------------- prompt caps and backends


@pytest.mark.slow
def test_evaluate_turns_through_pivotrl_serve_equals_hf(tmp_path, tiny_model_dir):
    from typer.testing import CliRunner

    from pivotrl.cli import app
    from test_serve_openai import start_server

    path = write_turns(tmp_path / "eval.jsonl", [turn(t, k) for t in range(2) for k in range(2)])
    proc, url = start_server(tiny_model_dir)
    try:
        docs = {}
        for backend in ("hf", "openai"):
            out = tmp_path / f"{backend}.json"
            res = CliRunner().invoke(app, ["evaluate", "--turns", str(path), "--model", str(tiny_model_dir),
                                           "--out", str(out), "--backend", backend]
                                     + (["--base-url", url] if backend == "openai" else []))
            assert res.exit_code == 0, res.output
            docs[backend] = [json.loads(line) for line in items_path(out).read_text().splitlines()]
            assert json.loads(out.read_text())["settings"]["backend"] == backend
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    # greedy on the same weights: the same actions, whichever engine wrote them
    assert [i["completions"] for i in docs["openai"]] == [i["completions"] for i in docs["hf"]]
    assert len(docs["hf"]) == 4
