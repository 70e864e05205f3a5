"""Data verbs at the edges: nothing empty passes silently (extract), turn rows write a
trajectory's metadata once, and compact rows cannot expand without bound."""

from __future__ import annotations

import json
import tracemalloc

import pytest

import pivotrl.io.compact_rows as compact_rows
from pivotrl.extract import ExtractOptions, extract_file
from pivotrl.io.empty import EmptyResultError
from pivotrl.io.records import Reject, Trajectory, Turn, iter_valid, read_records
from pivotrl.io.turn_files import read_turns

EXAMPLE = "examples/trajectories.jsonl"


def tool_free(tmp_path, n=3):
    src = tmp_path / "chat.jsonl"
    src.write_text("".join(json.dumps({"id": f"c{i}", "metadata": {"source": "chat"}, "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}) + "\n"
        for i in range(n)))
    return src


def test_extract_of_only_bad_lines_is_an_error_naming_the_first(tmp_path):
    src = tmp_path / "bad.jsonl"
    src.write_text("{oops\nnot json either\n")
    with pytest.raises(EmptyResultError, match=r"bad.jsonl: 0 trajectories: all 2 lines were "
                       r"rejected.*first: not JSON") as err:
        extract_file(src, tmp_path / "turns.jsonl", allow_empty=True)  # bad input: never allowed
    assert err.value.flag is None and err.value.result.read == 2
    assert (tmp_path / "turns.rejects.jsonl").read_text().count("\n") == 2


def test_extract_keeping_no_turn_is_an_error_unless_allowed(tmp_path):
    src = tool_free(tmp_path)
    opts = ExtractOptions(only_tool_calls=True)
    with pytest.raises(EmptyResultError, match=r"0 turns: every turn of 3 trajectories was "
                       r"skipped \(3 not a tool call\); pass --allow-empty"):
        extract_file(src, tmp_path / "turns.jsonl", opts)
    summary = extract_file(src, tmp_path / "turns2.jsonl", opts, allow_empty=True)
    assert summary.trajectories == 3 and summary.turns_train == 0


@pytest.mark.parametrize("kind", ["directory", "parquet", "turns"])
def test_extract_names_input_that_is_not_trajectories(tmp_path, kind):
    if kind == "directory":
        src, match = tmp_path / "data", "is a directory"
        src.mkdir()
    elif kind == "parquet":
        pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
        src, match = tmp_path / "data.parquet", "is a Parquet file, not JSON Lines"
        pq.write_table(pa.table({"id": ["a"], "messages": ["[]"]}), src)
    else:
        src, match = tmp_path / "turns.jsonl", "file of turns, not trajectories"
        extract_file(EXAMPLE, src)
    with pytest.raises(EmptyResultError, match=match):
        extract_file(src, tmp_path / "out.jsonl")


def test_turn_rows_write_trajectory_metadata_once_and_readers_restore_it(tmp_path):
    meta = {"source": "unit", "workspace": {"files": {"a.py": "x = 1\n" * 50}}, "tags": [1, 2]}
    msgs = [{"role": "user", "content": "go"}]
    for r in range(6):
        msgs += [{"role": "assistant", "content": f"step {r}"}, {"role": "user", "content": "more"}]
    src = tmp_path / "t.jsonl"
    src.write_text(json.dumps({"id": "t", "metadata": meta, "messages": msgs[:-1]}) + "\n")
    out = tmp_path / "turns.jsonl"
    extract_file(src, out)
    assert out.read_text().count('"workspace"') == 1  # 6 turns, the metadata written once
    turns = list(iter_valid(out, Turn))
    assert [t.metadata for t in turns] == [{**meta, "message_index": 1 + 2 * r} for r in range(6)]
    full = tmp_path / "full.jsonl"
    extract_file(src, full, ExtractOptions(compact=False))
    assert [t.metadata for t in iter_valid(full, Turn)] == [t.metadata for t in turns]


def test_a_row_may_not_inherit_large_metadata(tmp_path):
    """Each expanded row copies the inherited dict: only small ones are inherited."""
    big = {f"k{i}": i for i in range(compact_rows.MAX_INHERITED_METADATA_KEYS + 1)}
    first = {"id": "t/0", "trajectory_id": "t", "turn": 0, "context": [{"role": "user", "content": "a"}],
             "expected": {"role": "assistant", "content": "b"}, "metadata": big}
    second = {"id": "t/1", "trajectory_id": "t", "turn": 1, "context_from": "t/0",
              "expected": {"role": "assistant", "content": "c"}, "metadata_from": "t/0",
              "metadata": {"k0": 5}}
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(first) + "\n" + json.dumps(second) + "\n")
    _, row = list(read_records(path, Turn))[1]
    assert isinstance(row, Reject) and row.field == "metadata_from"
    assert "at most 32 may be inherited" in row.reason
    # the writer never produces such a row: large metadata is written in full on every row
    src = tmp_path / "t.jsonl"
    src.write_text(json.dumps({"id": "t", "metadata": big, "messages": [
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]}) + "\n")
    extract_file(src, tmp_path / "turns.jsonl")
    assert [t.metadata["k0"] for t in iter_valid(tmp_path / "turns.jsonl", Turn)] == [0, 0]


def chained_rows(n: int) -> str:
    """A crafted file: one full row, then n tiny rows each continuing the one before it."""
    rows = [{"id": "t/0", "trajectory_id": "t", "turn": 0,
             "context": [{"role": "user", "content": "u"}],
             "expected": {"role": "assistant", "content": "a"}}]
    rows += [{"id": f"t/{i}", "trajectory_id": "t", "turn": i, "context_from": f"t/{i - 1}",
              "expected": {"role": "assistant", "content": "a"}} for i in range(1, n + 1)]
    return "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows)


def test_chained_compact_rows_stop_at_the_context_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(compact_rows, "MAX_CONTEXT_MESSAGES", 50)
    path = tmp_path / "chain.jsonl"
    path.write_text(chained_rows(400))
    turns, rejects = read_turns(path)
    # row i has a context of i + 1 messages: rows up to 49 pass, the rest are rejected
    assert len(turns) == 50 and max(len(t.context) for _, t in turns) == 50
    assert len(rejects) == 351 and "above the limit of 50" in rejects[0].reason


def test_memory_of_a_crafted_chain_is_bounded_by_the_limit(tmp_path, monkeypatch):
    """Held rows cost O(rows x limit), not O(rows^2): 3,000 chained rows read with a limit of
    100 hold under 1/5 of what they hold with no effective limit."""
    path = tmp_path / "chain.jsonl"
    path.write_text(chained_rows(3000))

    def peak(limit: int) -> int:
        monkeypatch.setattr(compact_rows, "MAX_CONTEXT_MESSAGES", limit)
        tracemalloc.start()
        read_turns(path)
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return top

    bounded, unbounded = peak(100), peak(10_000)
    assert bounded * 5 < unbounded, (bounded, unbounded)


def test_extract_skips_and_counts_turns_past_the_context_limit(tmp_path):
    msgs = [{"role": "user", "content": "go"}]
    for r in range(30):
        msgs += [{"role": "assistant", "content": f"s{r}"}, {"role": "user", "content": "ok"}]
    src = tmp_path / "long.jsonl"
    src.write_text(json.dumps({"id": "long", "messages": msgs[:-1]}) + "\n")
    summary = extract_file(src, tmp_path / "turns.jsonl", ExtractOptions(max_context_messages=20))
    # turn r has 2r + 1 context messages: turns 0..9 are kept
    assert summary.turns_train == 10 and summary.skipped["context longer than 20 messages"] == 20
    assert max(len(t.context) for t in iter_valid(tmp_path / "turns.jsonl", Turn)) == 19


def test_extract_holds_one_turn_of_a_long_trajectory_at_a_time(tmp_path):
    """Peak memory of extracting a 600-turn trajectory stays near the trajectory's own size
    (turns written as they are made), not turns x context."""
    msgs = [{"role": "user", "content": "go"}]
    for r in range(600):
        msgs += [{"role": "assistant", "content": f"step {r}"}, {"role": "user", "content": "next"}]
    line = json.dumps({"id": "long", "messages": msgs[:-1]})
    src = tmp_path / "long.jsonl"
    src.write_text(line + "\n")
    tracemalloc.start()
    Trajectory.model_validate_json(line)
    _, parsed = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    tracemalloc.start()
    extract_file(src, tmp_path / "turns.jsonl")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # all 600 turns with their context lists at once would be ~600 x 600 x 8 B = 2.9 MB more
    assert peak < 3 * parsed + 1_000_000, (peak, parsed)


def test_lazy_pivots_read_any_row_in_any_order_as_the_eager_reader_does(tmp_path):
    import random

    from pivotrl.io.turn_files import iter_pivots

    src = tmp_path / "many.jsonl"
    base = [json.loads(line) for line in open(EXAMPLE)]
    src.write_text("".join(json.dumps({**b, "id": f"{b['id']}-{i}"}) + "\n"
                           for i in range(5) for b in base))
    out = tmp_path / "turns.jsonl"
    extract_file(src, out)
    eager = list(iter_valid(out, Turn))
    lazy = iter_pivots(out)
    order = list(range(len(eager)))
    random.Random(0).shuffle(order)
    assert len(lazy) == len(eager) > len(base)
    assert [lazy[i] for i in order] == [eager[i] for i in order]  # compact chains re-read
    assert lazy[-1] == eager[-1] and lazy[2:4] == eager[2:4] and list(lazy) == eager
    with pytest.raises(IndexError):
        lazy[len(eager)]
    lazy.close()


def test_export_of_nothing_is_an_error_naming_the_file_kind(tmp_path):
    from pivotrl.export import export_file

    with pytest.raises(EmptyResultError, match="file of trajectories, not turns; run `pivotrl extract`"):
        export_file(EXAMPLE, tmp_path / "rows.jsonl", "nemo-gym")
    (tmp_path / "d").mkdir()
    with pytest.raises(EmptyResultError, match="is a directory"):
        export_file(tmp_path / "d", tmp_path / "rows.jsonl", "nemo-gym")


def test_the_rule_names_a_trajectory_file_given_where_turns_are_expected(tmp_path):
    """What `profile` reports when handed trajectories: every line rejected as a Turn, and the
    rule says why and what to run, without a flag (there is nothing to allow)."""
    from pivotrl.io.empty import require_some

    rejects = [r for _, r in read_records(EXAMPLE, Turn)]
    assert rejects and all(isinstance(r, Reject) for r in rejects)
    with pytest.raises(EmptyResultError, match=r"0 turns: this is a file of trajectories, not "
                       r"turns; run `pivotrl extract` on it first") as err:
        require_some(0, "turns", EXAMPLE, rejected=len(rejects), first_reject=rejects[0],
                     expects="turns", allow_empty=False)
    assert err.value.flag is None and "--allow-empty" not in str(err.value)
