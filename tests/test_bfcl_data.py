"""BFCL multi-turn → Trajectories, judged by BFCL's own multi_turn_checker, and the BFCL World.

Every task of the four multi-turn categories is built and replayed (≈ 5 s of CPU for all 800):
the expert tool calls, decoded per turn in BFCL's format, must pass `multi_turn_checker`.
"""

from __future__ import annotations

import json
import sys

import pytest

pytest.importorskip("bfcl_eval")

from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import (  # noqa: E402
    multi_turn_checker, multi_turn_irrelevance_checker)

from pivotrl_testbed.bfcl import (ADDITIONAL_FUNCTION_PROMPT, CATEGORIES, decode_turns,  # noqa: E402
                               forget_instances, fresh_model_name, install_model_config_stub,
                               load_category, parse_call, to_openai_tool, write_bfcl)
from pivotrl_testbed.bfcl_world import BfclWorld  # noqa: E402
from pivotrl.io.records import Trajectory, iter_valid, read_records  # noqa: E402
from pivotrl.verifiers.world import make_world, world_at_turn  # noqa: E402

# Tasks that cannot pass BFCL's checker when replayed from the ground truth, with the reason.
# Empty for bfcl-eval==2026.3.23: every task passes. A new BFCL release with a data bug must be
# listed here explicitly, never skipped silently.
KNOWN_FAILURES: dict[str, str] = {}

USER_TURNS = {"base": 734, "miss_func": 934, "miss_param": 934, "long_context": 734}


@pytest.fixture(scope="module")
def bfcl(tmp_path_factory):
    out = tmp_path_factory.mktemp("bfcl") / "bfcl.jsonl"
    summary = write_bfcl(out)
    trajs = list(iter_valid(out, Trajectory))
    return out, summary, trajs


def _check(traj: Trajectory, decoded=None) -> dict:
    wc = traj.metadata["world_config"]
    entry = {"id": wc["id"], "initial_config": wc["initial_config"],
             "involved_classes": wc["involved_classes"]}
    name = fresh_model_name("pivotrl_test")
    try:
        return multi_turn_checker(decoded if decoded is not None else decode_turns(traj.messages),
                                  traj.metadata["goal"]["ground_truth"], entry,
                                  traj.metadata["category"], name)
    finally:
        forget_instances(name)


def test_counts_per_category(bfcl):
    out, summary, trajs = bfcl
    assert summary.trajectories == {c: 200 for c in CATEGORIES}
    assert summary.user_turns == USER_TURNS
    for c in CATEGORIES:  # every ground-truth call became one expert tool call
        assert summary.tool_calls[c] == sum(len(t) for _, gt in load_category(c) for t in gt)
    # the file is valid Trajectory JSONL: no rejects when read like any user file
    assert all(not hasattr(r, "reason") for _, r in read_records(out, Trajectory))
    assert len({t.id for t in trajs}) == 800


def test_every_task_passes_bfcl_multi_turn_checker(bfcl):
    _, _, trajs = bfcl
    failures = {}
    for traj in trajs:
        result = _check(traj)
        gt = traj.metadata["goal"]["ground_truth"]
        irrelevance = multi_turn_irrelevance_checker(decode_turns(traj.messages), gt)
        if not result["valid"] or not irrelevance["valid"]:
            failures[traj.id] = result.get("error_type") or irrelevance.get("error_type")
    assert {k: failures[k] for k in failures if k not in KNOWN_FAILURES} == {}
    assert set(KNOWN_FAILURES) <= set(failures), "a known failure now passes: update the list"


def test_checker_rejects_a_wrong_expert(bfcl):
    _, _, trajs = bfcl
    traj = next(t for t in trajs if t.id == "multi_turn_base_0")
    decoded = decode_turns(traj.messages)
    wrong = json.loads(json.dumps(decoded))
    wrong[0][-1] = [wrong[0][-1][0].replace("'", "'x", 1)]  # one argument changed
    assert _check(traj)["valid"]
    assert not _check(traj, wrong)["valid"]
    dropped = json.loads(json.dumps(decoded))
    dropped[0] = dropped[0][:-1]
    assert not _check(traj, dropped)["valid"]


def test_trajectory_shape(bfcl):
    _, _, trajs = bfcl
    for traj in trajs:
        msgs = traj.messages
        assert msgs[0].role == "user" and msgs[-1].role == "assistant" and msgs[-1].content
        for i, m in enumerate(msgs):
            if m.role == "user" and i:  # each user turn is closed by an assistant text message
                assert msgs[i - 1].role == "assistant" and msgs[i - 1].content
            if m.role == "assistant" and m.tool_calls:
                assert len(m.tool_calls) == 1 and msgs[i + 1].role == "tool"
                assert msgs[i + 1].tool_call_id == m.tool_calls[0].id
        assert traj.domain == f"bfcl_{traj.metadata['category']}"
        assert traj.metadata["world"] == "bfcl"


def test_miss_func_holds_the_function_back_until_bfcl_adds_it(bfcl):
    _, _, trajs = bfcl
    traj = next(t for t in trajs if t.id == "multi_turn_miss_func_0")  # sort held out at turn 3
    names = {t["function"]["name"] for t in traj.tools}
    assert "sort" not in names and "mv" in names
    users = [m for m in traj.messages if m.role == "user"]
    added = users[3]
    assert added.content.endswith(ADDITIONAL_FUNCTION_PROMPT)
    assert [t["function"]["name"] for t in added.model_extra["tools"]] == ["sort"]
    # the expert says it cannot act in the turn before, and calls sort right after the addition
    i = traj.messages.index(added)
    assert traj.messages[i - 1].content and not traj.messages[i - 1].tool_calls
    assert traj.messages[i + 1].tool_calls[0].function.name == "sort"
    assert traj.messages[i + 1].tool_calls[0].args() == {"file_name": "final_report.pdf"}


def test_tool_schemas_are_json_schema():
    import bfcl_eval  # noqa: F401
    from pivotrl_testbed.bfcl import func_docs

    bad = {"dict", "float", "tuple", "any"}

    def types(node):
        if isinstance(node, dict):
            if isinstance(node.get("type"), str):
                yield node["type"]
            for v in node.values():
                yield from types(v)
        elif isinstance(node, list):
            for v in node:
                yield from types(v)

    docs = func_docs(["GorillaFileSystem", "TradingBot", "TravelAPI", "VehicleControlAPI",
                      "MathAPI", "MessageAPI", "TwitterAPI", "TicketAPI"])
    tools = [to_openai_tool(d) for d in docs]
    assert not bad & set(types(tools))
    assert all(t["function"]["parameters"]["type"] == "object" for t in tools)
    assert all("response" not in t["function"] for t in tools)
    # a float parameter became number
    buy = next(t for t in tools if t["function"]["name"] == "place_order")
    assert buy["function"]["parameters"]["properties"]["price"]["type"] == "number"


def test_parse_call_names_positional_arguments():
    assert parse_call("sort('final_report.pdf')", ["GorillaFileSystem"]) == (
        "sort", {"file_name": "final_report.pdf"})
    assert parse_call("cd(folder='..')", ["GorillaFileSystem"]) == ("cd", {"folder": ".."})
    with pytest.raises(ValueError):
        parse_call("os.system('ls')", ["GorillaFileSystem"])


def test_model_config_stub_lets_ast_checker_import(monkeypatch):
    for name in [m for m in sys.modules if m.startswith("bfcl_eval.eval_checker.ast_eval")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delitem(sys.modules, "bfcl_eval.constants.model_config", raising=False)
    install_model_config_stub()
    from bfcl_eval.eval_checker.ast_eval import ast_checker

    assert ast_checker.convert_func_name("a.b", "any_model") == "a.b"
    assert "anthropic" not in sys.modules


# ---------------------------------------------------------------- the World


def _replay(traj: Trajectory, world: BfclWorld, mark_turns: bool) -> dict[str, str]:
    world.reset(traj.metadata["world_config"])
    observations = {}
    for m in traj.messages:
        if m.role == "user" and mark_turns:
            world.begin_turn()
        for c in m.tool_calls or []:
            observations[c.id] = world.execute(c.function.name, c.args())
    return observations


def test_world_reproduces_every_backend_observation_and_succeeds(bfcl):
    _, _, trajs = bfcl
    mismatches, failed = [], []
    for traj in trajs:
        world = make_world("bfcl")
        observations = _replay(traj, world, mark_turns=True)
        for m in traj.messages:
            if m.role == "tool" and observations[m.tool_call_id] != m.content:
                mismatches.append((traj.id, m.tool_call_id))
        if not world.success(traj.metadata["goal"], traj.messages[-1].content):
            failed.append(traj.id)
    assert mismatches == [] and failed == []


def test_world_success_without_turn_marks_and_failure_on_wrong_state(bfcl):
    _, _, trajs = bfcl
    traj = next(t for t in trajs if t.id == "multi_turn_base_0")
    world = BfclWorld()
    _replay(traj, world, mark_turns=False)
    assert world.success(traj.metadata["goal"], None)
    # the same episode with one state-changing call missing fails, with and without turn marks
    for marks in (True, False):
        world = BfclWorld()
        world.reset(traj.metadata["world_config"])
        calls = [c for m in traj.messages for c in (m.tool_calls or [])]
        skip = next(i for i, c in enumerate(calls) if c.function.name in ("mkdir", "mv", "touch", "cp"))
        for m in traj.messages:
            if m.role == "user" and marks:
                world.begin_turn()
            for c in m.tool_calls or []:
                if c is not calls[skip]:
                    world.execute(c.function.name, c.args())
        assert not world.success(traj.metadata["goal"], None)


def test_world_snapshot_tracks_state_and_worlds_are_independent(bfcl):
    _, _, trajs = bfcl
    traj = next(t for t in trajs if t.id == "multi_turn_base_0")
    a, b = BfclWorld(), BfclWorld()
    a.reset(traj.metadata["world_config"])
    b.reset(traj.metadata["world_config"])
    json.dumps(a.snapshot())  # JSON-able
    assert a.snapshot() == b.snapshot()
    a.execute("mkdir", {"dir_name": "fresh_dir"})
    assert a.snapshot() != b.snapshot()
    b.execute("mkdir", {"dir_name": "fresh_dir"})
    assert a.snapshot() == b.snapshot()
    a.execute("ls", {})  # a read-only call leaves the state alone
    assert a.snapshot() == b.snapshot()


def test_world_hostile_calls_are_observations(bfcl, tmp_path):
    _, _, trajs = bfcl
    traj = next(t for t in trajs if t.id == "multi_turn_base_0")
    world = BfclWorld()
    world.reset(traj.metadata["world_config"])
    world.begin_turn()
    before = world.snapshot()
    secret = tmp_path / "secret.txt"
    secret.write_text("top")
    assert world.execute("open", {"file": str(secret)}) == "Error during execution: name 'open' is not defined"
    assert "not allowed" in world.execute("exit", {})
    out = world.execute("cd", {"folder": "document", "x=__import__('os').system('touch pwned'),y": 1})
    assert out.startswith("Error during execution")
    assert world.execute("cd", "not a dict").startswith("Error during execution")  # type: ignore[arg-type]
    assert isinstance(world.execute("cd", {"folder": 3}), str)
    assert world.snapshot() == before  # none of these changed the public state
    assert not (tmp_path / "pwned").exists()
    # unsafe calls never reach BFCL's eval-based checker
    assert all(text is None for text, _ in world.turns[-1][:3])
    # a turn whose ground truth is empty passes when no real call was made
    assert world.success({"ground_truth": [[]]}, None) is True


def test_world_at_turn_rebuilds_the_state_from_a_turn(bfcl):
    from pivotrl.extract import ExtractOptions, extract_turns

    _, _, trajs = bfcl
    traj = next(t for t in trajs if t.id == "multi_turn_base_0")
    turns, _ = extract_turns(traj, ExtractOptions())
    last = turns[-1]
    world = world_at_turn(last)
    replayed = BfclWorld()
    _replay(traj, replayed, mark_turns=False)
    assert world.snapshot() == replayed.snapshot()


def test_cli_data_bfcl(tmp_path):
    from typer.testing import CliRunner

    from pivotrl.cli import app

    out = tmp_path / "base.jsonl"
    result = CliRunner().invoke(app, ["data", "bfcl", "--out", str(out), "--categories", "base"])
    assert result.exit_code == 0, result.output
    assert sum(1 for _ in out.open()) == 200
    bad = CliRunner().invoke(app, ["data", "bfcl", "--out", str(tmp_path / "x.jsonl"),
                                   "--categories", "nope"])
    assert bad.exit_code == 2 and "unknown categories" in bad.output
    assert not (tmp_path / "x.jsonl").exists()
