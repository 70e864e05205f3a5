"""Step 1 of PivotRL: every assistant message of every trajectory becomes a candidate Turn.

A Turn is (the full context before the assistant message, that message as the expected action),
with the trajectory's tools, domain and metadata. The file is streamed: one trajectory in memory
at a time, so a 100k-trajectory file costs what one trajectory costs. Rows are written compact
(`pivotrl.io.compact_rows`): a turn stores only the messages after its previous turn's, so the turns
file grows like the trajectories, not like turns × context.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from pivotrl.formats.terminus import (ACTION_FORMAT_KEY, TERMINUS_2, as_terminus_message,
                                     reads_as_terminus)
from pivotrl.io.compact_rows import MAX_CONTEXT_MESSAGES
from pivotrl.io.empty import ALLOW_EMPTY, TooManyRejectsError, check_input, require_some
from pivotrl.io.outputs import check_outputs
from pivotrl.io.records import (AtomicWriter, RecordError, Reject, Trajectory, Turn, dump,
                             message_text, read_records, rejects_path)
from pivotrl.io.split import Split, split_path, write_split


SHOWN_REJECTS = 3  # rejected lines the summary shows in full


class ExtractOptions(BaseModel):
    keep_reasoning: bool = Field(
        False, description="Keep `reasoning_content` of earlier assistant turns in the context. "
        "Off by default, as Qwen3 chat templates drop earlier turns' reasoning.")
    skip_content_regex: str | None = Field(
        None, description="Skip turns whose expected text content matches this regex "
        "(e.g. canned apologies); the trajectory's later turns are still extracted.")
    only_tool_calls: bool = Field(
        False, description="Keep only turns whose expected action calls a tool (or is a "
        "Terminus-2 action: the harness runs it).")
    action_format: Literal["auto", "chat", "terminus_2"] = Field(
        "auto", description="How assistant turns are read: 'auto' (a trajectory is Terminus-2 "
        "when its metadata says `action_format` or `harness` 'terminus_2', or when it offers no "
        "tools, calls none, and an assistant turn is a Terminus-2 JSON action: "
        "pivotrl.formats.terminus), 'chat' (messages and tool calls), 'terminus_2' (every "
        "trajectory's assistant turns are Terminus-2 actions).")
    min_context_messages: int = Field(
        1, description="Skip turns with fewer context messages (1: a turn needs at least a prompt).")
    eval_fraction: float = Field(
        0.0, ge=0.0, lt=1.0, description="Fraction of trajectories held out for evaluation, split "
        "by trajectory id (never by row: turns of one trajectory share context, docs/DESIGN.md): "
        "round(F × trajectories) of them, at least 1 when F > 0; a warning below 10.")
    seed: int = Field(0, description="Seed of the train/eval split.")
    max_context_messages: int = Field(
        MAX_CONTEXT_MESSAGES, ge=1, description="Skip (and count) turns with more context "
        "messages: bounds memory and disk on huge trajectories. Above the default, compact rows "
        "no longer apply to those turns (they are written in full; pivotrl.io.compact_rows).")
    compact: bool = Field(
        True, description="Write compact rows that continue the previous row's context "
        "(pivotrl.io.compact_rows; every pivotrl reader expands them). False: every row carries its "
        "whole context, for tools that read turn rows without pivotrl.")
    max_rejects: int = Field(
        -1, ge=-1, description="Rejected lines allowed (-1: any number): with more, extract raises "
        "TooManyRejectsError after writing its outputs and the rejects file (`pivotrl extract`: 0).")


SMALL_EVAL = 10  # fewer held-out trajectories than this: the summary warns (a wide interval)


def split_rank(trajectory_id: str, seed: int) -> int:
    """A trajectory's stable, seeded place in the split order: the same on every machine."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{trajectory_id}".encode()).digest()[:8], "big")


def eval_split(ids: list[str], fraction: float, seed: int) -> tuple[frozenset[str], str | None]:
    """The held-out ids: round(fraction × len(ids)) of them, never 0 when fraction > 0 and never
    all (at least one trajectory of 2+ stays for training), the first in `split_rank` order; and a
    warning when that is fewer than SMALL_EVAL trajectories (None otherwise)."""
    n_total = len(ids)
    n = math.floor(fraction * n_total + 0.5) if fraction > 0 else 0
    n = min(max(n, 1), n_total - 1) if fraction > 0 and n_total >= 2 else 0
    held = frozenset(sorted(ids, key=lambda i: split_rank(i, seed))[:n])
    warning = None
    if fraction > 0 and n < SMALL_EVAL:
        warning = (f"--eval-fraction {fraction:g} of {n_total} trajectories holds out {n}: "
                   + ("too few to hold any out" if n == 0 else
                      f"fewer than {SMALL_EVAL} held-out trajectories give a wide interval on turn accuracy"))
    return held, warning


def valid_trajectory_ids(path: str | Path) -> list[str]:
    """Ids of the trajectories extract will process (valid lines, first copy of an id), in order."""
    ids = (rec.id for _, rec in read_records(path, Trajectory) if not isinstance(rec, Reject))
    return list(dict.fromkeys(ids))


def iter_turns(traj: Trajectory, opts: ExtractOptions, skipped: Counter | None = None
               ) -> Iterator[Turn]:
    """The turns of one trajectory, one at a time (a trajectory of 10,000 turns never has its
    turns in memory together: each holds its own context list); turns skipped are counted by
    reason in `skipped`."""
    skipped = Counter() if skipped is None else skipped
    skip_re = re.compile(opts.skip_content_regex) if opts.skip_content_regex else None
    # A trajectory's own top-level fields (not in the schema) travel in each turn's metadata.
    metadata = {**(traj.model_extra or {}), **traj.metadata}
    terminus = reads_as_terminus(traj.messages, metadata, traj.tools, opts.action_format)
    if terminus:  # how verifiers and exports tell the turn's action from a chat message
        metadata[ACTION_FORMAT_KEY] = TERMINUS_2
    context: list = []
    ordinal = 0
    for i, msg in enumerate(traj.messages):
        if msg.role == "assistant":
            reason = ""
            # An expert turn the harness could not read is no action to learn or match: it is
            # skipped, and the later turns keep it in their context as the harness saw it.
            action, unreadable = as_terminus_message(msg) if terminus else (msg, "")
            msg = action or msg
            if unreadable:
                reason = "not a Terminus-2 action"
            elif opts.only_tool_calls and not msg.tool_calls and not terminus:
                reason = "not a tool call"
            elif skip_re and skip_re.search(message_text(msg)):
                reason = "content matched skip regex"
            elif len(context) < opts.min_context_messages:
                reason = "context too short"
            elif len(context) > opts.max_context_messages:
                reason = f"context longer than {opts.max_context_messages} messages"
            if reason:
                skipped[reason] += 1
            else:
                yield Turn(id=f"{traj.id}/{ordinal}", trajectory_id=traj.id, turn=ordinal,
                           domain=traj.domain, tools=traj.tools, context=list(context),
                           expected=msg, metadata={**metadata, "message_index": i})
            ordinal += 1
            if not opts.keep_reasoning and msg.reasoning_content is not None:
                msg = msg.model_copy(update={"reasoning_content": None})
        context.append(msg)


def extract_turns(traj: Trajectory, opts: ExtractOptions) -> tuple[list[Turn], Counter]:
    """`iter_turns` collected: the turns of one trajectory, and a count of turns skipped by reason."""
    skipped: Counter = Counter()
    return list(iter_turns(traj, opts, skipped)), skipped


@dataclass
class ExtractSummary:
    read: int = 0  # every line of the file: read = trajectories + rejected + blank
    blank: int = 0  # lines of JSON whitespace only (skipped)
    trajectories: int = 0
    turns_train: int = 0
    turns_eval: int = 0
    trajectories_eval: int = 0
    rejects: Counter = field(default_factory=Counter)
    skipped: Counter = field(default_factory=Counter)
    per_domain: Counter = field(default_factory=Counter)
    rejects_file: str = ""
    first_rejects: list[str] = field(default_factory=list)  # "file:line [field]: reason", the first few
    split_file: str = ""  # TURNS.split.json when trajectories were held out
    warnings: list[str] = field(default_factory=list)  # what the caller should show the user


def reject_kind(reason: str) -> str:
    """Group reasons for the summary: drop the specifics after the first colon or quote."""
    return re.split(r"[:'\"]", reason, maxsplit=1)[0].strip()


def extract_file(path: str | Path, out: str | Path, opts: ExtractOptions | None = None, *,
                 eval_out: str | Path | None = None, strict: bool = False,
                 progress=None, allow_empty: bool = False) -> ExtractSummary:
    """Stream `path` → turns in `out` (and `eval_out` for held-out trajectories), bad lines to
    `<out stem>.rejects.jsonl`. All outputs are written atomically.

    Rules: a later trajectory with an id already seen is rejected (turn ids must be unique);
    blank lines are skipped and counted; every line is counted once in `read`. No turn written
    raises EmptyResultError (`pivotrl.io.empty`; the outputs are still written, so the rejects
    file can be read), unless `allow_empty` and the input held trajectories; input that is not
    JSON Lines (a directory, Parquet) raises it before anything is written."""
    opts = opts or ExtractOptions()
    out = Path(out)
    check_input(path)
    if opts.eval_fraction > 0 and eval_out is None:
        eval_out = out.with_name(out.name.replace(".jsonl", "") + ".eval.jsonl")
    check_outputs([path], [out, eval_out, rejects_path(out), split_path(out) if eval_out else None])
    summary = ExtractSummary(rejects_file=str(rejects_path(out)))
    split = Split(fraction=opts.eval_fraction, seed=opts.seed, source=str(path)) if eval_out else None
    held: frozenset[str] = frozenset()
    if split is not None and opts.eval_fraction > 0:  # exact: the count of trajectories is known before the split is drawn
        held, warning = eval_split(valid_trajectory_ids(path), opts.eval_fraction, opts.seed)
        summary.warnings += [warning] if warning else []
    counts: dict[str, int] = {}
    first_line: dict[str, int] = {}  # trajectory id -> line it was first read on
    with ExitStack() as stack:  # every writer is committed, or removed on an exception
        train_w = stack.enter_context(AtomicWriter(out, compact=opts.compact))
        reject_w = stack.enter_context(AtomicWriter(rejects_path(out)))
        eval_w = (stack.enter_context(AtomicWriter(eval_out, compact=opts.compact))
                  if eval_out else None)
        for lineno, rec in read_records(path, Trajectory, strict=strict, counts=counts):
            summary.read += 1
            if not isinstance(rec, Reject) and rec.id in first_line:
                rec = Reject(str(path), lineno, f"duplicate trajectory id {rec.id!r} (first "
                             f"on line {first_line[rec.id]})", "id", dump(rec)[:2000])
                if strict:
                    raise RecordError(rec)
            if isinstance(rec, Reject):
                summary.rejects[reject_kind(rec.reason)] += 1
                if len(summary.first_rejects) < SHOWN_REJECTS:
                    summary.first_rejects.append(str(rec))
                reject_w.write(rec.to_json())
                continue
            first_line[rec.id] = lineno
            summary.trajectories += 1
            held_out = rec.id in held
            summary.trajectories_eval += held_out
            if split is not None:
                (split.eval if held_out else split.train).append(rec.id)
            writer = eval_w if held_out else train_w
            for turn in iter_turns(rec, opts, summary.skipped):
                writer.write(turn)
                summary.per_domain[turn.domain or "(none)"] += 1
                if held_out:
                    summary.turns_eval += 1
                else:
                    summary.turns_train += 1
            if progress is not None:
                progress(lineno)
    if split is not None:
        summary.split_file = str(write_split(out, split))
    summary.blank = counts.get("blank", 0)
    summary.read += summary.blank
    check_extracted(path, summary, allow_empty)
    check_rejects(path, summary, opts.max_rejects)
    return summary


def check_rejects(path: str | Path, summary: ExtractSummary, max_rejects: int) -> None:
    """The exit policy for bad lines: more rejected than `max_rejects` is an error (raised after
    every output was written, so the rejects file can be read)."""
    rejected = sum(summary.rejects.values())
    if max_rejects < 0 or rejected <= max_rejects:
        return
    raise TooManyRejectsError(path, f"{rejected} of {summary.read} lines rejected, more than --max-rejects "
                              f"{max_rejects}; first: {summary.first_rejects[0]} (all in "
                              f"{summary.rejects_file}); fix them or pass --max-rejects N to accept up to N",
                              result=summary)


def check_extracted(path: str | Path, summary: ExtractSummary, allow_empty: bool) -> None:
    """The empty-result rule for extract: no trajectory read is always an error (bad lines,
    a turns file given); trajectories whose every turn was skipped are one unless allowed."""
    rejected = sum(summary.rejects.values())
    first = (f"{summary.rejects.most_common(1)[0][0]} (see {summary.rejects_file})"
             if rejected else None)
    require_some(summary.trajectories, "trajectories", path, rejected=rejected,
                 first_reject=first, expects="trajectories", result=summary)
    skipped = ", ".join(f"{n} {why}" for why, n in summary.skipped.most_common())
    require_some(summary.turns_train + summary.turns_eval, "turns", path,
                 reason=f"every turn of {summary.trajectories} trajectories was skipped "
                 f"({skipped or 'no assistant turn'})", allow_empty=allow_empty, flag=ALLOW_EMPTY,
                 result=summary)
