"""Compact Turn rows (pivotrl.io.compact_rows): a row continues the previous row's context instead of
copying it. Full and compact files read back to the same Turns; a broken or hostile chain is a
Reject naming file, line and field; shards, profiling resume and shard merge keep every chain."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pivotrl.extract import ExtractOptions, extract_file, extract_turns
from pivotrl.io.records import (
    AppendWriter,
    Profile,
    RecordError,
    Reject,
    Trajectory,
    Turn,
    iter_valid,
    read_records,
    write_atomic,
)
from pivotrl.io.turn_files import read_turns, shard_of
from pivotrl.profile.loop import ProfileConfig
from pivotrl.profile.runs import MergeError, merge_profiles, profile_file
from pivotrl.sampling.base import Completion
from pivotrl.sampling.hf import HFSampler
from pivotrl.verifiers.base import Score

TOOLS = [{"type": "function", "function": {"name": "get_order", "parameters": {
    "type": "object", "properties": {"order_id": {"type": "string"}}}}}]


def trajectory(t: int, rounds: int = 3, tools=TOOLS) -> dict:
    """System, user, then rounds of (assistant call with reasoning, tool output), a final answer."""
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": f"Where is O-{t}?"}]}]
    for r in range(rounds):
        messages.append({"role": "assistant", "content": None, "reasoning_content": f"think {t}.{r}",
                         "tool_calls": [{"id": f"c{r}", "type": "function", "function": {
                             "name": "get_order", "arguments": json.dumps({"order_id": f"O-{t}"})}}]})
        messages.append({"role": "tool", "tool_call_id": f"c{r}", "content": f"status {r}",
                         "name": "get_order"})
    messages.append({"role": "assistant", "content": f"O-{t} shipped.", "reasoning_content": "done"})
    return {"id": f"traj-{t}", "domain": "shop" if t % 2 else "bank", "tools": tools,
            "messages": messages, "metadata": {"user": t, "flag": True, "w": 1.0}}


def write_trajectories(path: Path, n: int = 5) -> Path:
    # trajectory 3 has other tools: tools_from must not cross into it
    path.write_text("".join(json.dumps(trajectory(t, tools=TOOLS if t != 3 else [])) + "\n"
                            for t in range(n)))
    return path


def dumps(turns) -> list[str]:
    return [t.model_dump_json(exclude_none=True) for t in turns]


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.mark.parametrize("keep_reasoning", [False, True])
def test_compact_and_full_files_read_back_to_the_extracted_turns(tmp_path, keep_reasoning):
    src = write_trajectories(tmp_path / "traj.jsonl")
    truth = [t for line in src.read_text().splitlines() for t in extract_turns(
        Trajectory.model_validate_json(line), ExtractOptions(keep_reasoning=keep_reasoning))[0]]
    compact, full = tmp_path / "compact.jsonl", tmp_path / "full.jsonl"
    extract_file(src, compact, ExtractOptions(keep_reasoning=keep_reasoning))
    extract_file(src, full, ExtractOptions(keep_reasoning=keep_reasoning, compact=False))
    assert dumps(iter_valid(compact, Turn)) == dumps(iter_valid(full, Turn)) == dumps(truth)
    rows = lines(compact)
    continued = [r for r in rows if "context_from" in r]
    assert len(continued) == len(rows) - 5  # every turn but each trajectory's first
    assert all("context" not in r and r["context_from"] == rows[i - 1]["id"]
               for i, r in enumerate(rows) if "context_from" in r)
    # the earlier turn's reasoning is dropped from the context unless --keep-reasoning
    assert all(r.get("context_strip_reasoning", False) is not keep_reasoning for r in continued)
    # not after each trajectory's first row, nor in trajectory 3 (no tools: nothing to save)
    assert sum("tools_from" in r for r in rows) == len(rows) - 5 - 3
    assert compact.stat().st_size < 0.7 * full.stat().st_size  # short contexts here: bench/ has more
    assert all("context" in r and "context_from" not in r for r in lines(full))
    # writing the expanded rows again (full or compact) changes nothing
    write_atomic(tmp_path / "again.jsonl", iter_valid(compact, Turn))
    assert (tmp_path / "again.jsonl").read_text() == compact.read_text()
    write_atomic(tmp_path / "again_full.jsonl", iter_valid(compact, Turn), compact=False)
    assert (tmp_path / "again_full.jsonl").read_text() == full.read_text()


def test_blank_lines_are_not_rows_and_do_not_break_a_chain(tmp_path):
    compact = tmp_path / "turns.jsonl"
    extract_file(write_trajectories(tmp_path / "traj.jsonl", 1), compact)
    spaced = tmp_path / "spaced.jsonl"
    spaced.write_text(compact.read_text().replace("\n", "\n \n"))
    assert dumps(iter_valid(spaced, Turn)) == dumps(iter_valid(compact, Turn))


def test_a_file_with_whole_contexts_written_by_hand_still_reads(tmp_path):
    src = write_trajectories(tmp_path / "traj.jsonl", 2)
    truth = [t for line in src.read_text().splitlines()
             for t in extract_turns(Trajectory.model_validate_json(line), ExtractOptions())[0]]
    old = tmp_path / "old.jsonl"
    old.write_text("".join(json.dumps(t.model_dump(mode="json")) + "\n" for t in truth))
    assert dumps(iter_valid(old, Turn)) == dumps(truth)


def test_a_broken_chain_is_a_reject_naming_file_line_and_field(tmp_path):
    compact = tmp_path / "turns.jsonl"
    extract_file(write_trajectories(tmp_path / "traj.jsonl", 2), compact)
    text = compact.read_text().splitlines()
    filtered = tmp_path / "filtered.jsonl"
    filtered.write_text("\n".join(text[:1] + text[2:]) + "\n")  # someone dropped traj-0/1
    got = [rec for _, rec in read_records(filtered, Turn)]
    bad = got[1]
    assert isinstance(bad, Reject) and bad.file == str(filtered) and bad.line == 2
    assert bad.field == "context_from" and "'traj-0/1'" in bad.reason and "traj-0/0" in bad.reason
    # the rows after it continue a rejected row: rejected too, saying so; the next trajectory reads
    assert isinstance(got[2], Reject) and "line 2) was rejected" in got[2].reason
    assert [r.id for r in got if not isinstance(r, Reject)] == ["traj-0/0"] + [
        f"traj-1/{k}" for k in range(4)]
    with pytest.raises(RecordError, match=r"filtered.jsonl:2 \[context_from\]"):
        list(iter_valid(filtered, Turn))
    # a torn (not JSON) line in the middle breaks the chain the same way
    torn = tmp_path / "torn.jsonl"
    torn.write_text("\n".join(text[:1] + ['{"id": "traj-0/1", "tur'] + text[2:]) + "\n")
    rejected = [rec for _, rec in read_records(torn, Turn) if isinstance(rec, Reject)]
    assert [r.line for r in rejected] == [2, 3, 4]  # line 5 starts traj-1: a full row


def without(row: dict, key: str) -> dict:
    return {k: v for k, v in row.items() if k != key}


def hostile_rows(tmp_path: Path) -> dict[str, tuple[dict, str, str]]:
    """name -> (row after traj-0/0, expected field, words of the reason)."""
    extract_file(write_trajectories(tmp_path / "traj.jsonl", 1), tmp_path / "t.jsonl")
    rows = lines(tmp_path / "t.jsonl")
    first, second = rows[0], rows[1]
    assert second["context_from"] == "traj-0/0"
    return {
        "itself": ({**second, "context_from": "traj-0/1"}, "context_from", "names the row itself"),
        "a later row": ({**second, "context_from": "traj-0/3"}, "context_from", "previous row is"),
        "another trajectory": ({**second, "trajectory_id": "traj-9"}, "context_from",
                               "of trajectory 'traj-0'"),
        "not an earlier turn": ({**second, "turn": 0}, "context_from", "not an earlier turn"),
        "tools of another trajectory": ({**without(first, "tools"), "id": "x/1", "turn": 1,
                                         "trajectory_id": "x", "tools_from": "traj-0/0"},
                                        "tools_from", "of trajectory 'traj-0'"),
        "both tools and tools_from": ({**second, "tools": TOOLS}, "tools_from", "not both"),
        "both context and context_from": ({**second, "context": first["context"]}, "context_from",
                                          "not both"),
        "tail without context_from": ({**first, "id": "traj-0/1", "turn": 1, "context_tail": []},
                                      "context_tail", "without 'context_from'"),
        "reference not a string": ({**second, "context_from": ["traj-0/0"]}, "context_from",
                                   "must be the id"),
        "tail not a list": ({**second, "context_tail": {"role": "user"}}, "context_tail",
                            "must be a list"),
        "bad message in the tail": ({**second, "context_tail": [{"role": "robot"}]},
                                    "context_tail.0.role", "unknown role"),
        "strip flag not a bool": ({**second, "context_strip_reasoning": "yes"},
                                  "context_strip_reasoning", "true or false"),
        "first row of a file": (None, "context_from", "no row before it"),
    }


@pytest.mark.parametrize("name", ["itself", "a later row", "another trajectory",
                                  "not an earlier turn", "tools of another trajectory",
                                  "both tools and tools_from",
                                  "both context and context_from", "tail without context_from",
                                  "reference not a string", "tail not a list",
                                  "bad message in the tail", "strip flag not a bool",
                                  "first row of a file"])
def test_a_hostile_row_is_rejected_not_crashed(tmp_path, name):
    row, field, words = hostile_rows(tmp_path)[name]
    rows = lines(tmp_path / "t.jsonl")
    lines_before = [rows[0]] if row is not None else []
    row = row if row is not None else rows[1]
    path = tmp_path / "hostile.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [*lines_before, row]))
    got = [rec for _, rec in read_records(path, Turn)]
    bad = got[-1]
    assert isinstance(bad, Reject) and bad.field == field and words in bad.reason, bad
    assert bad.line == len(got) and bad.file == str(path)


def test_shards_partition_the_turns_and_each_is_expanded(tmp_path):
    compact = tmp_path / "turns.jsonl"
    extract_file(write_trajectories(tmp_path / "traj.jsonl", 6), compact)
    every = {t.id: t.model_dump_json() for _, t in read_turns(compact)[0]}
    seen: dict[str, str] = {}
    for i in range(3):
        turns, rejects = read_turns(compact, (i, 3))
        assert not rejects and all(shard_of(t.id, 3) == i for _, t in turns)
        assert not set(seen) & {t.id for _, t in turns}
        seen.update({t.id: t.model_dump_json() for _, t in turns})
    assert seen == every and len(every) == 24
    # turns of one trajectory share their messages instead of copying them
    turns = [t for _, t in read_turns(compact)[0] if t.trajectory_id == "traj-0"]
    assert turns[3].context[0] is turns[0].context[0]


class Answers:
    """Answers 'ok' to every prompt; fails on call number `fail_at` (a killed run)."""

    name = "scripted"

    def __init__(self, fail_at: int | None = None):
        self.calls, self.fail_at = 0, fail_at

    def sample(self, prompts, n, params, seeds=None):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("killed")
        return [[Completion(f"ok{len(p) % 3}", 3, 1, "stop") for _ in range(n)] for p in prompts]


class Length:
    name = "length"

    def score(self, turn, action) -> Score:
        return Score(float(len(action.content or "") % 2), True) if action else Score(0.0, False)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return HFSampler(str(tiny_model_dir)).tokenizer


def test_resumed_profiling_and_shard_merge_keep_every_chain(tmp_path, tokenizer):
    turns = tmp_path / "turns.jsonl"
    extract_file(write_trajectories(tmp_path / "traj.jsonl", 3), turns)
    cfg = ProfileConfig(k=2, chunk_turns=3, max_new_tokens=4)
    whole = tmp_path / "whole.jsonl"
    profile_file(turns, whole, Answers(), Length(), tokenizer, cfg, progress=False)
    cut = tmp_path / "cut.jsonl"
    with pytest.raises(RuntimeError, match="killed"):  # dies after 2 chunks of 3 turns
        profile_file(turns, cut, Answers(fail_at=3), Length(), tokenizer, cfg, progress=False)
    assert len(cut.read_text().splitlines()) == 6
    profile_file(turns, cut, Answers(), Length(), tokenizer, cfg.model_copy(update={"resume": True}),
                 progress=False)
    rows = lines(cut)
    assert "context_from" in rows[5] and "context_from" not in rows[6]  # the resume starts full
    assert dumps(iter_valid(cut, Profile)) == dumps(iter_valid(whole, Profile))
    assert sum("context_from" in r for r in lines(whole)) == 12 - 3
    # shards profiled apart, one of them out of TURNS order, merge back to the unsharded run
    parts = []
    for i in range(2):
        part = tmp_path / f"p{i}.jsonl"
        profile_file(turns, part, Answers(), Length(), tokenizer,
                     cfg.model_copy(update={"shard": f"{i}/2"}), progress=False)
        parts.append(part)
    shard0 = list(iter_valid(parts[0], Profile))
    write_atomic(parts[0], shard0[len(shard0) // 2:] + shard0[:len(shard0) // 2])
    merged = tmp_path / "merged.jsonl"
    merge_profiles(turns, parts, merged)
    assert dumps(iter_valid(merged, Profile)) == dumps(iter_valid(whole, Profile))
    # a shard whose chain was broken by hand is refused, naming the line, and nothing is written
    rows = lines(parts[1])
    broken = [i for i, r in enumerate(rows) if "context_from" in r][0]
    rows[broken]["context_from"] = "traj-9/0"
    parts[1].write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(MergeError, match=rf"p1.jsonl:{broken + 1} \[context_from\]"):
        merge_profiles(turns, parts, tmp_path / "m2.jsonl")
    assert not (tmp_path / "m2.jsonl").exists()


def test_profiling_streams_its_turns_instead_of_holding_the_shard(tmp_path, tokenizer, monkeypatch):
    import pivotrl.profile.runs as profiling

    turns = tmp_path / "turns.jsonl"
    extract_file(write_trajectories(tmp_path / "traj.jsonl", 3), turns)
    passes: list[list[int]] = []  # turns yielded so far by each read of the file
    real = profiling.scan_turns

    def counted(path, shard=None):
        passes.append([0])
        for item in real(path, shard):
            passes[-1][0] += 1
            yield item

    class Probe(Answers):
        read_when_sampling: list[int] = []

        def sample(self, prompts, n, params, seeds=None):
            self.read_when_sampling.append(passes[-1][0])
            return super().sample(prompts, n, params, seeds)

    monkeypatch.setattr(profiling, "scan_turns", counted)
    profile_file(turns, tmp_path / "p.jsonl", Probe(), Length(), tokenizer,
                 ProfileConfig(k=1, chunk_turns=2, max_new_tokens=4), progress=False)
    assert [p[0] for p in passes] == [12, 12]  # ids first, then the turns themselves
    assert Probe.read_when_sampling[0] <= 4  # chunk 1 (and 2, prefetched), not all 12
    assert len(list(iter_valid(tmp_path / "p.jsonl", Profile))) == 12


def test_a_new_append_writer_starts_with_a_full_row(tmp_path):
    src = write_trajectories(tmp_path / "traj.jsonl", 1)
    turns = extract_turns(Trajectory.model_validate_json(src.read_text()), ExtractOptions())[0]
    out = tmp_path / "a.jsonl"
    for part in (turns[:2], turns[2:]):
        with AppendWriter(out) as w:
            for t in part:
                w.write(t)
    assert ["context_from" in r for r in lines(out)] == [False, True, False, True]
    assert dumps(iter_valid(out, Turn)) == dumps(turns)


def extracted_both_ways(tmp_path):
    """[("compact", turns file), ("full", turns file)] of the same two trajectories."""
    src = write_trajectories(tmp_path / "traj.jsonl", 2)
    out = []
    for name in ("compact", "full"):
        turns = tmp_path / f"{name}.jsonl"
        extract_file(src, turns, ExtractOptions(compact=name == "compact"))
        out.append((name, turns))
    return out


def test_verify_cases_made_from_a_compact_file_score_like_full_ones(tmp_path):
    from pivotrl.evaluate.cases import verify_file

    answers = []
    for name, turns in extracted_both_ways(tmp_path):
        cases = tmp_path / f"{name}.cases.jsonl"
        cases.write_text("".join(json.dumps({**r, "candidate": r["expected"]}) + "\n"
                                 for r in lines(turns)))
        verify_file(cases, "toolcall", out_path=tmp_path / f"{name}.out.jsonl")
        answers.append(lines(tmp_path / f"{name}.out.jsonl"))
    assert answers[0] == answers[1] and all(a["valid"] and a["reward"] == 1.0 for a in answers[0])
    # a case whose row it continues is gone: that line says why, the next trajectory still scores
    text = (tmp_path / "compact.cases.jsonl").read_text().splitlines()
    (tmp_path / "cut.jsonl").write_text("\n".join(text[1:]) + "\n")
    verify_file(tmp_path / "cut.jsonl", "toolcall", out_path=tmp_path / "cut.out.jsonl")
    got = lines(tmp_path / "cut.out.jsonl")
    assert got[0]["reason"].startswith("line 1: field context_from: continues row 'traj-0/0'")
    assert [a["valid"] for a in got] == [False] * 3 + [True] * 4


@pytest.mark.parametrize("fmt", ["nemo-gym", "verl"])
def test_exports_of_a_compact_file_carry_whole_contexts(tmp_path, fmt):
    from pivotrl.export import export_file

    outs = []
    for name, turns in extracted_both_ways(tmp_path):
        out = tmp_path / f"{name}.out.{'jsonl' if fmt == 'nemo-gym' else 'parquet'}"
        summary = export_file(turns, out, fmt)
        assert summary.written == 8 and not summary.rejects
        outs.append(out)
    if fmt == "nemo-gym":
        assert outs[0].read_text() == outs[1].read_text()
    else:
        import pandas as pd

        assert pd.read_parquet(outs[0]).to_json() == pd.read_parquet(outs[1]).to_json()


def test_pivots_selected_from_a_compact_profile_are_compact_and_train_reads_them(tmp_path, tokenizer):
    from pivotrl.select import SelectConfig, select_file
    from pivotrl.train.config import GRPORunConfig
    from pivotrl.train.grpo import load_pivot_set, turn_json

    turns = tmp_path / "turns.jsonl"
    extract_file(write_trajectories(tmp_path / "traj.jsonl", 3), turns)
    profile = tmp_path / "profile.jsonl"
    profile_file(turns, profile, Answers(), Length(), tokenizer,
                 ProfileConfig(k=2, chunk_turns=4, max_new_tokens=4), progress=False)
    pivots = tmp_path / "pivots.jsonl"
    select_file(profile, pivots, SelectConfig(strategy="all"), plot_png=False)
    assert sum("context_from" in r for r in lines(pivots)) == 12 - 3
    cfg = GRPORunConfig(model="unused", pivots=pivots, output_dir=tmp_path / "run")
    loaded = load_pivot_set(cfg)
    truth = [t for _, t in read_turns(turns)[0]]
    assert [turn_json(t) for t in loaded] == [turn_json(t) for t in truth]
