import json
import os
import subprocess
import sys
import textwrap

import pytest

from pivotrl.io.records import (AppendWriter, Reject, RecordError, Trajectory, done_ids, read_records,
                             rejects_path, repair_tail, write_atomic)

GOOD = {"id": "t1", "tools": [], "messages": [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "tool_calls": [{"id": "a", "type": "function",
                                          "function": {"name": "f", "arguments": {"x": 1}}}]},
    {"role": "tool", "tool_call_id": "a", "content": "ok"},
    {"role": "assistant", "content": "done"}]}


def write_lines(path, lines):
    path.write_text("".join((l if isinstance(l, str) else json.dumps(l)) + "\n" for l in lines))
    return path


def bad(**changes):
    rec = json.loads(json.dumps(GOOD))
    for key, value in changes.items():
        if key == "messages":
            rec["messages"] = value
        else:
            rec[key] = value
    return rec


CASES = [
    ("{not json", "not JSON", ""),
    ('["a list"]', "expected a JSON object", ""),
    ({"id": "x"}, "missing field 'messages'", "messages"),
    (bad(messages=[{"role": "robot", "content": "x"}]), "unknown role 'robot'", "messages.0.role"),
    (bad(messages=[{"role": "user", "content": "q"}, {"role": "tool", "tool_call_id": "zz",
                                                     "content": "r"}]),
     "matches no earlier tool call", "messages[1].tool_call_id"),
    (bad(messages=[{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [
        {"id": "a", "function": {"name": "f", "arguments": "{bad json"}}]}]),
     "invalid JSON", "messages[1].tool_calls[0].function.arguments"),
    (bad(messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "  "}]),
     "neither content nor tool_calls", "messages[1]"),
    (bad(messages=[]), "no messages", "messages"),
    # Two values for one key: parsers differ on which wins, so the expert's call is ambiguous
    # and keeping either value would silently lose the other.
    (bad(messages=[{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [
        {"id": "a", "function": {"name": "f", "arguments": '{"x": 1, "x": 2}'}}]}]),
     "duplicate key 'x'", "messages[1].tool_calls[0].function.arguments"),
    ('{"id": "a", "id": "b", "messages": []}', "duplicate key 'id'", ""),
    ('{"id": "a", "messages": [{"role": "user", "role": "tool", "content": "q"}]}',
     "duplicate key 'role'", ""),
]


@pytest.mark.parametrize("line,reason,field", CASES)
def test_each_bad_line_is_rejected_with_file_line_field_and_reason(tmp_path, line, reason, field):
    path = write_lines(tmp_path / "in.jsonl", [GOOD, line, GOOD])
    results = list(read_records(path, Trajectory))
    assert [lineno for lineno, _ in results] == [1, 2, 3]
    assert isinstance(results[0][1], Trajectory) and isinstance(results[2][1], Trajectory)
    rej = results[1][1]
    assert isinstance(rej, Reject)
    assert rej.line == 2 and rej.file == str(path)
    assert reason in rej.reason
    assert rej.field == field
    with pytest.raises(RecordError, match=r"in\.jsonl:2"):
        list(read_records(path, Trajectory, strict=True))


def test_arguments_as_string_or_object_and_unknown_fields_kept(tmp_path):
    rec = bad()
    rec["custom"] = {"keep": True}
    rec["messages"][1]["tool_calls"][0]["function"]["arguments"] = '{"x": 2}'
    rec["messages"][0]["lang"] = "en"
    path = write_lines(tmp_path / "in.jsonl", [rec, GOOD])
    (_, a), (_, b) = read_records(path, Trajectory)
    assert a.messages[1].tool_calls[0].args() == {"x": 2}
    assert b.messages[1].tool_calls[0].args() == {"x": 1}
    out = tmp_path / "out.jsonl"
    write_atomic(out, [a])
    again = json.loads(out.read_text())
    assert again["custom"] == {"keep": True} and again["messages"][0]["lang"] == "en"


def test_atomic_write_leaves_old_file_when_interrupted(tmp_path):
    out = tmp_path / "out.jsonl"
    write_atomic(out, [{"id": "old"}])

    def records():
        yield {"id": "new"}
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomic(out, records())
    assert out.read_text() == '{"id": "old"}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]


def test_append_writer_survives_kill_and_repairs_torn_tail(tmp_path):
    out = tmp_path / "out.jsonl"
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(os.getcwd() + '/src')!r})
        from pivotrl.io.records import AppendWriter
        w = AppendWriter({str(out)!r})
        for i in range(3):
            w.write({{"id": str(i)}})
        w._fh.write('{{"id": "torn"')   # a record half written when the process dies
        w._fh.flush()
        os._exit(9)
    """)
    subprocess.run([sys.executable, "-c", script], check=False)
    assert out.read_text().endswith('{"id": "torn"')
    assert done_ids(out) == {"0", "1", "2"}
    with AppendWriter(out) as w:
        w.write({"id": "3"})
    assert [json.loads(l)["id"] for l in out.read_text().splitlines()] == ["0", "1", "2", "3"]
    assert repair_tail(out) == 4


def test_rejects_path_sits_next_to_output(tmp_path):
    assert rejects_path(tmp_path / "turns.jsonl") == tmp_path / "turns.rejects.jsonl"
    assert "reject" in rejects_path("x/out").name


def test_every_record_field_is_documented_and_samples_declare_their_fields():
    from pivotrl.io import records

    models = [records.FunctionCall, records.ToolCall, records.Message, records.Trajectory,
              records.Turn, records.Sample, records.Profile]
    for model in models:
        for name, info in model.model_fields.items():
            assert info.description, f"{model.__name__}.{name} has no description"
    # what profiling writes into a sample is declared, not an undocumented extra
    assert {"finish_reason", "tokens"} <= set(records.Sample.model_fields)


def test_one_atomic_writer_in_the_code_base():
    """Temp-file-then-rename lives in io.atomic.atomic_path only; everything else calls it."""
    import re
    from pathlib import Path

    import pivotrl

    src = Path(pivotrl.__file__).parent
    pattern = re.compile(r"mkstemp|os\.replace\(|os\.rename\(|\.tmp\"\)|tmp\.replace\(")
    offenders = [f"{p.relative_to(src)}:{i}" for p in src.rglob("*.py")
                 for i, line in enumerate(p.read_text().splitlines(), 1)
                 if pattern.search(line) and p.name != "atomic.py"
                 and not line.lstrip().startswith("#")]
    # directories, not file writers: the sandbox's skeleton root is renamed into place, and
    # workspace.remove_tree moves subdirectories up to flatten a tree it deletes
    assert [o for o in offenders if not o.startswith(("sandbox/skeleton.py", "sandbox/workspace.py"))] == []


def test_atomic_writer_leaves_the_old_file_when_interrupted(tmp_path):
    from pivotrl.io.records import AtomicWriter, write_text_atomic

    out = tmp_path / "out.jsonl"
    write_text_atomic(out, "old\n")
    with pytest.raises(RuntimeError):
        with AtomicWriter(out) as w:
            w.write({"a": 1})
            raise RuntimeError("killed")
    assert out.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]
    write_atomic(out, [{"a": 1}])
    assert out.read_text() == '{"a": 1}\n' and oct(out.stat().st_mode & 0o777) != "0o600"


def _call(name, id=None):
    return {**({"id": id} if id else {}), "type": "function", "function": {"name": name, "arguments": {}}}


def _traj(*messages):
    return {"id": "p", "messages": [{"role": "user", "content": "q"}, *messages]}


def _read_one(tmp_path, rec):
    path = write_lines(tmp_path / "in.jsonl", [rec])
    [(_, result)] = list(read_records(path, Trajectory))
    return result


def test_id_less_calls_and_results_are_paired_by_order(tmp_path):
    """The common id-less layout: an assistant's calls, then its results in the same order."""
    rec = _traj({"role": "assistant", "tool_calls": [_call("f"), _call("g")]},
                {"role": "tool", "content": "F"}, {"role": "tool", "name": "g", "content": "G"},
                {"role": "assistant", "tool_calls": [_call("f")]}, {"role": "tool", "content": "F2"},
                {"role": "assistant", "content": "done"})
    traj = _read_one(tmp_path, rec)
    assert isinstance(traj, Trajectory), traj
    m = traj.messages
    calls = [c.id for c in m[1].tool_calls] + [m[4].tool_calls[0].id]
    assert len(set(calls)) == 3 and None not in calls
    assert [m[2].tool_call_id, m[3].tool_call_id, m[5].tool_call_id] == calls


def test_a_call_without_id_takes_its_results_id(tmp_path):
    rec = _traj({"role": "assistant", "tool_calls": [_call("f")]},
                {"role": "tool", "tool_call_id": "r1", "content": "F"}, {"role": "assistant", "content": "ok"})
    traj = _read_one(tmp_path, rec)
    assert isinstance(traj, Trajectory), traj
    assert traj.messages[1].tool_calls[0].id == "r1"


def test_ids_win_over_order(tmp_path):
    """Results that name their calls may come in any order; only the rest is paired by order."""
    rec = _traj({"role": "assistant", "tool_calls": [_call("f", "a"), _call("g", "b"), _call("h")]},
                {"role": "tool", "tool_call_id": "b", "content": "G"}, {"role": "tool", "content": "H"},
                {"role": "tool", "tool_call_id": "a", "content": "F"})
    rec["messages"].append({"role": "assistant", "content": "ok"})
    traj = _read_one(tmp_path, rec)
    assert isinstance(traj, Trajectory), traj
    assert traj.messages[3].tool_call_id == traj.messages[1].tool_calls[2].id is not None


AMBIGUOUS = [
    # two calls, one result, no ids: which call does it answer?
    ((_call("f"), _call("g")), [{"role": "tool", "content": "F"}],
     "messages[2].tool_call_id", "pairing by order is ambiguous"),
    # the call lacks the id its result names, and a second call makes the order ambiguous
    ((_call("f"), _call("g")), [{"role": "tool", "tool_call_id": "x", "content": "F"}],
     "messages[1].tool_calls[0].id", "tool call without id"),
    # both have ids, and they differ: a real mismatch, the result is at fault
    ((_call("f", "a"),), [{"role": "tool", "tool_call_id": "x", "content": "F"}],
     "messages[2].tool_call_id", "matches no earlier tool call"),
    # the result names another tool than the call it would be paired with
    ((_call("f"),), [{"role": "tool", "name": "g", "content": "G"}], "messages[2].name", "pairing by order"),
]


@pytest.mark.parametrize("calls,results,field,reason", AMBIGUOUS)
def test_ambiguous_pairing_is_rejected_naming_the_field_at_fault(tmp_path, calls, results, field, reason):
    rec = _traj({"role": "assistant", "tool_calls": list(calls)}, *results, {"role": "assistant", "content": "ok"})
    rej = _read_one(tmp_path, rec)
    assert isinstance(rej, Reject)
    assert rej.field == field and reason in rej.reason, rej


def test_a_result_without_a_call_before_it_is_rejected(tmp_path):
    rej = _read_one(tmp_path, _traj({"role": "tool", "content": "?"}, {"role": "assistant", "content": "ok"}))
    assert isinstance(rej, Reject) and rej.field == "messages[1].tool_call_id"
    assert "no tool call right before it" in rej.reason
