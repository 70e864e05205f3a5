"""Turns (or pivots) to other engines' formats and back: NeMo-Gym rows and verl parquet.

`pivotrl.export.nemo_gym` holds the NeMo-Gym row contract (both directions),
`pivotrl.export.verl` the verl columns and tool config; this module streams files through
them. Bad input lines never raise: they go, with line numbers, to the rejects file next to the
output. No output path may be an input path.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pivotrl.export.gym_config import gym_config, gym_config_path
from pivotrl.export.nemo_gym import (DEFAULT_AGENT_NAME, PARALLEL_CALLS, missing_tools, nemo_gym_to_turn,
                                     row_problem, turn_to_nemo_gym)
from pivotrl.export.verl import (DEFAULT_AGENT_LOOP, ToolUnion, tool_config_path, turn_to_verl,
                                 verl_schema, verl_to_turn, write_tool_config)
from pivotrl.io.empty import EmptyResultError, check_input, require_some
from pivotrl.export.pass_rates import imported_profile, profiled_by
from pivotrl.export.terminus_judge import is_terminus_row, terminus_row_to_turn
from pivotrl.io.records import (Profile, Record, Reject, Trajectory, Turn, atomic_path,
                                check_trajectory, read_records, rejects_path, sidecar_path,
                                stats_path, write_atomic, write_text_atomic)

FORMATS = ("nemo-gym", "verl")
__all__ = ["DEFAULT_AGENT_LOOP", "DEFAULT_AGENT_NAME", "FORMATS", "PARALLEL_CALLS", "ExportSummary",
           "check_turn", "export_file", "gym_config_path",
           "import_nemo_gym", "import_verl", "nemo_gym_to_turn", "row_to_turn", "tool_config_path",
           "turn_to_nemo_gym", "turn_to_verl", "verl_schema"]


@dataclass
class ExportSummary:
    read: int = 0
    written: int = 0
    rejects: list[Reject] = field(default_factory=list)
    notes: Counter = field(default_factory=Counter)  # what an import read besides the turns
    by_domain: Counter = field(default_factory=Counter)
    warnings: Counter = field(default_factory=Counter)  # kept rows another engine may object to
    files: list[Path] = field(default_factory=list)  # written besides the output (tool config)
    # import: turns read per (row kind, the verifier rule that scores them: `row_kind`)
    by_kind: Counter = field(default_factory=Counter)

    def reasons(self) -> Counter:
        return Counter(r.reason.split(":")[0] for r in self.rejects)


# ---------------------------------------------------------------- checks


def check_turn(turn: Turn) -> tuple[str, str] | None:
    """A Turn is exportable when context + expected would be a valid trajectory."""
    if turn.expected.role != "assistant":
        return "expected.role", f"expected must be an assistant message, got {turn.expected.role!r}"
    problem = check_trajectory(Trajectory(id=turn.id, messages=[*turn.context, turn.expected]))
    if problem is None:
        return None
    where, reason = problem
    n = len(turn.context)
    if where.startswith(f"messages[{n}]"):
        return "expected" + where[len(f"messages[{n}]"):], reason
    return where.replace("messages", "context", 1), reason


REJECTED = "rejected"  # the verifier slot of `ExportSummary.by_kind` for rows refused


def row_kind(turn: Turn) -> tuple[str, str]:
    """(kind of the expert's action, what scores it under the default verifier `toolcall`): a
    Terminus-2 action goes to `terminus_identity` whatever the verifier (`pivotrl.scoring`); an
    editor call to the edit rule (`pivotrl.verifiers.edits`), unverifiable where the editor's
    schema is not one it knows; other calls and messages to toolcall's argument and message rules."""
    from pivotrl.verifiers.edits import EDITOR_TOOLS, OTHER_EDITORS
    from pivotrl.verifiers.terminus_identity import is_terminus_turn

    if is_terminus_turn(turn):
        return "terminus_2", "terminus_identity"
    names = [c.function.name for c in turn.expected.tool_calls or []]
    if not names:
        return "message", "toolcall: message rules"
    if any(n in OTHER_EDITORS for n in names):
        return "editor call", "toolcall: unverifiable (editor schema unknown)"
    if any(n in EDITOR_TOOLS for n in names):
        return "editor call", "toolcall: edits by effect"
    if len(names) > 1:
        return "parallel tool calls", "toolcall: calls as a multiset"
    return "tool call", "toolcall: argument rules"


def raw_row_kind(row: dict[str, Any]) -> str:
    """What a refused NeMo-Gym row was, from its own fields (it never became a Turn)."""
    if is_terminus_row(row):
        meta = row.get("metadata") if isinstance(row.get("metadata"), dict) else {}
        return f"terminus_judge ({meta.get('harness')})"
    action = row.get("expected_action")
    kind = action.get("type") if isinstance(action, dict) else None
    return f"expected_action {kind}" if isinstance(kind, str) else "unknown"


# ---------------------------------------------------------------- files


def _valid_turns(path: Path, summary: ExportSummary, check=check_turn) -> Iterator[Turn]:
    for _, rec in read_records(path, Turn, check=check):
        summary.read += 1
        if isinstance(rec, Reject):
            summary.rejects.append(rec)
            continue
        summary.by_domain[rec.domain or "-"] += 1
        yield rec


def _write_rejects(out: Path, rejects: list[Reject]) -> None:
    path = rejects_path(out)
    if rejects:
        write_atomic(path, [r.to_json() for r in rejects])
    elif path.exists():
        path.unlink()  # a stale file from an earlier run would mislead


def _refuse_overwrite(src: Path, *outs: Path) -> None:
    for out in outs:
        if out.exists() and src.exists() and out.resolve() == src.resolve():
            raise ValueError(f"output {out} is the input file; write somewhere else")


def export_file(turns: str | Path, out: str | Path, fmt: str, *, batch_rows: int = 1000,
                ability: str = "agent", agent_name: str | None = None,
                parallel_calls: str = "batch") -> ExportSummary:
    """Turns JSONL -> NeMo-Gym JSONL or verl parquet (+ its tool config); streams, atomic writes.

    agent_name: NeMo-Gym's agent_ref.name (default: an imported row's own, else
    DEFAULT_AGENT_NAME) or verl's agent loop (default DEFAULT_AGENT_LOOP).
    parallel_calls (NeMo-Gym): "batch" writes several expert calls as a function_call_batch
    action; "reject" sends such turns to the rejects file (single-call datasets)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    if parallel_calls not in PARALLEL_CALLS:
        raise ValueError(f"parallel_calls must be one of {PARALLEL_CALLS}, got {parallel_calls!r}")
    turns, out = Path(turns), Path(out)
    _refuse_overwrite(turns, out, rejects_path(out), tool_config_path(out), gym_config_path(out))
    check_input(turns)
    summary = ExportSummary()
    if fmt == "nemo-gym":
        def check(turn: Turn) -> tuple[str, str] | None:
            return check_turn(turn) or row_problem(turn, parallel_calls)

        agents: dict[str, None] = {}  # agent_ref names in first-seen order
        batches = False

        def rows() -> Iterator[dict[str, Any]]:
            nonlocal batches
            for turn in _valid_turns(turns, summary, check):
                if missing_tools(turn):
                    summary.warnings["expected tool not in the row's tools"] += 1
                row = turn_to_nemo_gym(turn, agent_name)
                agents[row["agent_ref"]["name"]] = None
                batches = batches or row["expected_action"]["type"] == "function_call_batch"
                yield row

        summary.written = write_atomic(out, rows())
        _write_yaml(gym_config_path(out), gym_config(out, list(agents), batches),
                    "# NeMo-Gym config for the rows next to it (written by `pivotrl export --format "
                    "nemo-gym`):\n# each agent block is the agent_ref.name of its rows.\n")
        summary.files.append(gym_config_path(out))
    else:
        union = ToolUnion()

        def verl_rows() -> Iterator[dict[str, Any]]:
            for i, turn in enumerate(_valid_turns(turns, summary)):
                union.add(turn)
                yield turn_to_verl(turn, i, ability, agent_name or DEFAULT_AGENT_LOOP)

        summary.written = _write_parquet(out, verl_rows(), batch_rows)
        write_tool_config(tool_config_path(out), union)
        summary.files.append(tool_config_path(out))
        for warning in union.warnings():
            summary.warnings[warning] += 1
    _write_rejects(out, summary.rejects)
    require_some(summary.written, "rows", turns, rejected=len(summary.rejects),
                 first_reject=summary.rejects[0] if summary.rejects else None, expects="turns",
                 result=summary)
    return summary


def _write_yaml(path: Path, data: dict[str, Any], header: str) -> None:
    import yaml

    write_text_atomic(path, header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True))


def _write_parquet(out: Path, rows: Iterator[dict[str, Any]], batch_rows: int) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = verl_schema()
    n = 0
    with atomic_path(out) as tmp, pq.ParquetWriter(tmp, schema) as writer:
        batch: list[dict[str, Any]] = []
        for row in rows:
            batch.append(row)
            if len(batch) >= batch_rows:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                n += len(batch)
                batch = []
        if batch or n == 0:
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))
            n += len(batch)
    return n


class NemoGymRow(Record):
    responses_create_params: dict[str, Any]
    # None: a `terminus_judge` row, whose `expected_answer` holds the action
    # (pivotrl.export.terminus_judge); any other row without one is refused by `row_to_turn`.
    expected_action: dict[str, Any] | None = None


def _turn_or_problem(build, row: dict[str, Any], fallback_id: str | None) -> Turn | tuple[str, str]:
    """`build(row, fallback_id)` as a valid Turn, or (field, reason) saying why not; never raises
    on bad data."""
    try:
        turn = build(row, fallback_id)
    except ValidationError as exc:
        err = exc.errors()[0]
        return ".".join(str(p) for p in err["loc"]), err["msg"]
    except (ValueError, TypeError, AttributeError, KeyError, RecursionError) as exc:
        field_name, _, reason = str(exc).partition(": ")
        return (field_name, reason) if reason else ("", field_name)
    return check_turn(turn) or turn


def row_to_turn(row: dict[str, Any], fallback_id: str | None = None) -> Turn | tuple[str, str]:
    """A NeMo-Gym row (argument-comparison or `terminus_judge`) as a valid Turn, or (field,
    reason) saying why not; never raises on bad data."""
    build = terminus_row_to_turn if is_terminus_row(row) else nemo_gym_to_turn
    return _turn_or_problem(build, row, fallback_id)


def _import_turns(src: Path, out: Path, convert, *, eval_fraction: float = 0.0,
                  seed: int = 0, jsonl: bool = True) -> ExportSummary:
    """`convert(notes)` yields a Turn or a Reject for every record of `src` (counting what it
    read besides the turns in `notes`). The Turns go to `out`, or with `eval_fraction` those of
    held-out trajectories (drawn as `extract` draws them: by trajectory, never by row) to
    `OUT.eval.jsonl` and the split to `OUT.split.json`; rejects beside `out`; `OUT.stats.json`
    says who profiled the Profile records among them (pass rates that came with the rows:
    `pivotrl.export.pass_rates`), for `select` to pass on to `train`."""
    from pivotrl.extract import eval_split
    from pivotrl.io.split import Split, split_path, write_split

    eval_out = sidecar_path(out, ".eval.jsonl") if eval_fraction > 0 else None
    _refuse_overwrite(src, out, rejects_path(out), stats_path(out),
                      *([eval_out, split_path(out)] if eval_out else []))
    if jsonl:
        check_input(src)
    summary, models = ExportSummary(), Counter()
    held: frozenset[str] = frozenset()
    if eval_out is not None:  # a first pass for the trajectory ids: the split is exact
        ids = (t.trajectory_id for t in convert(Counter()) if isinstance(t, Turn))
        held, warning = eval_split(list(dict.fromkeys(ids)), eval_fraction, seed)
        summary.warnings.update([warning] if warning else [])
    split = Split(fraction=eval_fraction, seed=seed, source=str(src))

    def turns(held_out: bool) -> Iterator[Turn]:
        for result in convert(Counter() if held_out else summary.notes):
            if isinstance(result, Reject):
                if not held_out:  # each line is counted once, in the first pass that writes
                    summary.read += 1
                    summary.rejects.append(result)
            elif (result.trajectory_id in held) == held_out:
                summary.read += 1
                summary.by_domain[result.domain or "-"] += 1
                summary.by_kind[row_kind(result)] += 1
                (split.eval if held_out else split.train).append(result.trajectory_id)
                if isinstance(result, Profile):
                    models[result.metadata["imported_profile"]["model"]] += 1
                yield result

    summary.written = write_atomic(out, turns(False))
    if eval_out is not None:
        summary.written += write_atomic(eval_out, turns(True))
        split.train, split.eval = list(dict.fromkeys(split.train)), list(dict.fromkeys(split.eval))
        summary.files += [eval_out, write_split(out, split)]
    if models:
        summary.warnings[f"pass rates imported as profiles of {profiled_by(models)}: PivotRL "
                         "selects with the trained policy's own (`pivotrl profile` re-profiles)"] += 1
        write_text_atomic(stats_path(out), json.dumps({
            "imported_from": str(src), "turns": summary.written, "profiles": sum(models.values()),
            "profiled_by": dict(models), "notes": dict(summary.notes),
            # what `pivotrl select` passes on to training (`select.profile_settings`)
            "settings": {"model": profiled_by(models), "chat_template_kwargs": None,
                         "response_format": None, "max_new_tokens": None}}, indent=2))
        summary.files.append(stats_path(out))
    elif stats_path(out).is_file() and "imported_from" in stats_path(out).read_text():
        stats_path(out).unlink()  # an earlier import's profiler would be claimed for these turns
    _write_rejects(out, summary.rejects)
    require_some(summary.written, "turns", src, rejected=len(summary.rejects),
                 first_reject=summary.rejects[0] if summary.rejects else None, result=summary)
    return summary


def import_nemo_gym(rows: str | Path, out: str | Path, *, eval_fraction: float = 0.0,
                    seed: int = 0) -> ExportSummary:
    """NeMo-Gym rows JSONL -> Turns JSONL (bad rows to the rejects file). Rows without an id or
    uuid get `<file stem>:<line>`; a row's own `trajectory_id` and `meta_info` place it in its
    trajectory, and its pass rates make it a Profile record (`pivotrl.export.pass_rates`)."""
    rows, out = Path(rows), Path(out)
    kinds: Counter = Counter()  # the refused rows' kinds (each pass counts them again)

    def convert(notes: Counter) -> Iterator[Turn | Reject]:
        kinds.clear()
        for lineno, rec in read_records(rows, NemoGymRow):
            if isinstance(rec, Reject):
                kinds["unreadable line", REJECTED] += 1
                yield rec
                continue
            row = rec.model_dump()
            result = row_to_turn(row, f"{rows.stem}:{lineno}")
            if not isinstance(result, Turn):
                kinds[raw_row_kind(row), REJECTED] += 1
            yield (imported_profile(result, row, notes) if isinstance(result, Turn) else
                   Reject(str(rows), lineno, result[1], result[0], json.dumps(row)[:2000]))

    try:
        summary = _import_turns(rows, out, convert, eval_fraction=eval_fraction, seed=seed)
    except EmptyResultError as exc:
        if isinstance(exc.result, ExportSummary):
            exc.result.by_kind.update(kinds)
        raise
    summary.by_kind.update(kinds)
    return summary


PARQUET_MAGIC = b"PAR1"  # a parquet file's first bytes


def _is_parquet(path: Path) -> bool:
    with path.open("rb") as fh:
        return fh.read(4) == PARQUET_MAGIC


def _verl_rows(path: Path, batch_rows: int = 1000) -> Iterator[tuple[int, dict[str, Any] | Reject]]:
    """(row number, row or Reject) of a verl parquet file, a batch at a time, or of a JSONL file
    of the same rows (one line each)."""
    if not _is_parquet(path):
        for lineno, rec in read_records(path, Record):
            yield lineno, rec if isinstance(rec, Reject) else rec.model_dump()
        return
    import pyarrow.parquet as pq

    n = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_rows):
        for row in batch.to_pylist():
            n += 1
            yield n, row


def import_verl(rows: str | Path, out: str | Path, *, eval_fraction: float = 0.0,
                seed: int = 0) -> ExportSummary:
    """verl rows (parquet, or JSONL of the same rows) -> Turns JSONL (bad rows to the rejects file,
    numbered from 1 in file order); `pivotrl.export.verl.verl_to_turn` reads each row."""
    rows, out = Path(rows), Path(out)

    def convert(notes: Counter) -> Iterator[Turn | Reject]:
        for n, row in _verl_rows(rows):
            if isinstance(row, Reject):
                yield row
                continue
            result = _turn_or_problem(verl_to_turn, row, f"{rows.stem}:{n}")
            yield (result if isinstance(result, Turn) else
                   Reject(str(rows), n, result[1], result[0], json.dumps(row, default=str)[:2000]))

    return _import_turns(rows, out, convert, eval_fraction=eval_fraction, seed=seed,
                         jsonl=not _is_parquet(rows))
