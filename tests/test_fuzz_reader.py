"""Mutated trajectory files never crash the reader, and every line is accounted for."""

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pivotrl.extract import extract_file
from pivotrl.io.empty import EmptyResultError
from pivotrl.io.records import Reject, Trajectory, read_records

SEED_LINES = open("examples/trajectories.jsonl").read().splitlines()


@st.composite
def mutated_line(draw):
    line = draw(st.sampled_from(SEED_LINES))
    kind = draw(st.sampled_from(["byte", "cut", "json", "keep", "break", "blank"]))
    if kind == "break":  # characters str.splitlines would split on: data here, not line ends
        i = draw(st.integers(0, len(line)))
        return line[:i] + draw(st.sampled_from(["\r", "\x0b", "\x1c", "\u2028", "\x85"])) + line[i:]
    if kind == "blank":
        return draw(st.sampled_from(["", " ", "\t", " \r", "\u00a0"]))
    if kind == "byte" and line:
        i = draw(st.integers(0, len(line) - 1))
        return line[:i] + draw(st.characters(blacklist_categories=["Cs"])) + line[i + 1:]
    if kind == "cut":
        return line[: draw(st.integers(0, len(line)))]
    if kind == "json":
        rec = json.loads(line)
        msgs = rec["messages"]
        target = draw(st.sampled_from(["role", "content", "tool_calls", "tool_call_id", "drop"]))
        i = draw(st.integers(0, len(msgs) - 1))
        junk = draw(st.one_of(st.none(), st.integers(), st.text(max_size=5),
                              st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)))
        if target == "drop":
            del msgs[i]
        else:
            msgs[i][target] = junk
        return json.dumps(rec)
    return line


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(mutated_line(), min_size=1, max_size=8))
def test_reader_never_crashes_and_accounts_for_every_line(tmp_path, lines):
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    n_lines = src.read_bytes().count(b"\n")  # only "\n" ends a line
    counts = {}
    results = list(read_records(src, Trajectory, counts=counts))
    ok = sum(isinstance(r, Trajectory) for _, r in results)
    rejected = sum(isinstance(r, Reject) for _, r in results)
    assert ok + rejected + counts.get("blank", 0) == n_lines
    try:
        summary = extract_file(src, tmp_path / "turns.jsonl")
    except EmptyResultError as exc:  # nothing to extract: an error, its summary still exact
        summary = exc.result
        assert summary.turns_train == 0
    assert summary.read == n_lines
    assert summary.trajectories + sum(summary.rejects.values()) + summary.blank == n_lines
    n_rejects = (tmp_path / "turns.rejects.jsonl").read_bytes().count(b"\n")
    assert n_rejects == sum(summary.rejects.values()) >= rejected  # + duplicate ids
    turn_ids = [json.loads(l)["id"] for l in (tmp_path / "turns.jsonl").read_text().split("\n") if l]
    assert len(turn_ids) == len(set(turn_ids))
