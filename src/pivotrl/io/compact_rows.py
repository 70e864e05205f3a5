"""Compact rows of Turn files (turns, profiles, pivots): each row may continue the row before it.

A Turn stores every message before its expected one, so the turns of one trajectory repeat the
same growing context: written in full, a turns file is O(turns × context), many times its
trajectories. A compact row stores only what is new:

    context_from: "<id of the previous row>"   context = previous context + [previous expected]
    context_tail: [messages]                              + context_tail
    context_strip_reasoning: true              (optional) the previous expected enters the
                                               context without its reasoning_content (extract
                                               drops earlier turns' reasoning by default)
    tools_from:   "<id of the previous row>"   tools = the previous row's tools
    metadata_from: "<id of the previous row>"  metadata = the previous row's metadata updated
                                               with this row's `metadata` (only the keys that
                                               differ, e.g. `message_index`), so a trajectory's
                                               metadata is written once, not once per turn

Why it is safe:
- A reference names only the IMMEDIATELY previous row (blank lines are not rows), and it names it
  by id: a reader keeps one expanded row (streaming, O(1) rows in memory), and a file that was
  filtered or reordered after writing cannot expand a row with someone else's context: the id
  no longer matches and the row is rejected (file, line, field), never silently wrong.
- Both references stay inside one trajectory and must point at an EARLIER turn of it, so a row
  never depends on rows of other trajectories, and a chain is at most one trajectory long.
- The writer (`RowEncoder`) uses a reference only when the expansion equals the row exactly
  (same objects, or the same JSON); anything else is written in full. Rows with a whole `context`
  read as always: old files need nothing.
- Expansion is bounded, so a small crafted file cannot cost a reader gigabytes: a context holds
  at most `MAX_CONTEXT_MESSAGES` messages (extract skips longer turns, counted; a reader rejects
  the row), and metadata is inherited only from a row with at most `MAX_INHERITED_METADATA_KEYS`
  keys (each expanded row copies that dict; the writer writes larger metadata in full). A
  reader that keeps every row still holds one context list per row: O(rows x context) pointers,
  at most 8 x MAX_CONTEXT_MESSAGES bytes a row.

This module holds the encoding only; `pivotrl.io.records` applies it in its one reader and its
writers, so no caller handles compact rows itself.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic_core import to_json

CONTEXT_FROM = "context_from"
CONTEXT_TAIL = "context_tail"
STRIP_REASONING = "context_strip_reasoning"
TOOLS_FROM = "tools_from"
METADATA_FROM = "metadata_from"
COMPACT_KEYS = frozenset({CONTEXT_FROM, CONTEXT_TAIL, STRIP_REASONING, TOOLS_FROM, METADATA_FROM})
REFERENCES = (CONTEXT_FROM, TOOLS_FROM, METADATA_FROM)  # keys naming the previous row
# Longest context a compact row may expand to. A reader that keeps its rows holds a list of up
# to this many pointers per row (16 KiB), so a crafted chain of tiny rows costs about 100x its
# bytes (bench/bench_scale.py: 305 MiB for 3 MiB), not the square of its length. A bound, not a
# fact about data: extract skips and counts longer turns (ExtractOptions.max_context_messages).
MAX_CONTEXT_MESSAGES = 2048
# Metadata is inherited only from a dict this small: every expanded row copies it.
MAX_INHERITED_METADATA_KEYS = 32


def _json(model: Any, exclude: set[str] | frozenset[str] = frozenset()) -> str:
    """The exact form every writer uses (`records.dump`): pydantic's encoder, Nones left out."""
    return model.model_dump_json(exclude_none=True, exclude=set(exclude) or None)


def _same(a: Any, b: Any) -> bool:
    """Equal as written: identity first (rows read from a compact file share their messages),
    then the JSON text, so that 1 and True or 1.0 (equal in Python) are never confused."""
    return a is b or _json(a) == _json(b)


def _same_value(a: Any, b: Any) -> bool:
    """Metadata values equal as written (JSON text; identity first)."""
    if a is b:
        return True
    try:
        return to_json(a) == to_json(b)
    except (TypeError, ValueError):
        return False


def metadata_delta(prev: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any] | None:
    """The keys of `meta` that `prev` does not already hold with the same value, when `meta`
    can be written as `prev` + those keys (no key removed, `prev` small enough); else None."""
    if not prev or len(prev) > MAX_INHERITED_METADATA_KEYS or not prev.keys() <= meta.keys():
        return None
    own = {k: v for k, v in meta.items() if k not in prev or not _same_value(prev[k], v)}
    return own if len(own) < len(meta) else None


def _without_reasoning(message: Any) -> Any:
    return message.model_copy(update={"reasoning_content": None})


def continues(prev: Any, turn: Any) -> bool | None:
    """How `turn`'s context continues `prev`: False (prev.context + [prev.expected] is a prefix),
    True (the same with prev.expected's reasoning removed), None (it does not)."""
    n = len(prev.context)
    ctx = turn.context
    if (prev.trajectory_id != turn.trajectory_id or turn.turn <= prev.turn or prev.id == turn.id
            or len(ctx) <= n):
        return None
    if not all(_same(a, b) for a, b in zip(prev.context, ctx[:n])):
        return None
    if _same(prev.expected, ctx[n]):
        return False
    if prev.expected.reasoning_content is not None and _same(_without_reasoning(prev.expected), ctx[n]):
        return True
    return None


class RowEncoder:
    """The one writer of Turn rows: `encode(turn)` returns its JSON line, compact when the row
    written just before it (by this encoder) lets it, else in full. A new encoder (a new file,
    or a resumed append) starts with a full row."""

    def __init__(self, compact: bool = True):
        self.compact = compact
        self.prev: Any = None

    def encode(self, turn: Any) -> str:
        prev, self.prev = self.prev, turn
        if not self.compact or prev is None or prev.trajectory_id != turn.trajectory_id:
            return _json(turn, COMPACT_KEYS)
        extra: dict[str, Any] = {}
        exclude = set(COMPACT_KEYS)
        tail: list[Any] = []
        # a context past the readers' limit is written in full (readers reject longer chains)
        strip = continues(prev, turn) if len(turn.context) <= MAX_CONTEXT_MESSAGES else None
        if strip is not None:
            extra[CONTEXT_FROM] = prev.id
            if strip:
                extra[STRIP_REASONING] = True
            tail = turn.context[len(prev.context) + 1:]
            exclude.add("context")
        if (turn.tools and turn.turn > prev.turn and prev.id != turn.id
                and (prev.tools is turn.tools or json.dumps(prev.tools) == json.dumps(turn.tools))):
            extra[TOOLS_FROM] = prev.id
            exclude.add("tools")
        own = (metadata_delta(prev.metadata, turn.metadata)
               if turn.turn > prev.turn and prev.id != turn.id else None)
        if own is not None:
            extra[METADATA_FROM] = prev.id
            exclude.add("metadata")
        head = _json(turn, exclude)
        if not extra:
            return head
        parts = [f"{json.dumps(k)}:{json.dumps(v, ensure_ascii=False)}" for k, v in extra.items()]
        if own is not None:
            parts.append(f'"metadata":{to_json(own).decode()}')
        if CONTEXT_FROM in extra:
            parts.append(f'"{CONTEXT_TAIL}":[{",".join(_json(m) for m in tail)}]')
        return head[:-1] + ("," if head != "{}" else "") + ",".join(parts) + "}"


class RowDecoder:
    """The one place compact rows are expanded (`records.read_records` calls it for every Turn
    model): `expand(obj)` before validation, `check(record)` after it, `accept(record or None)`
    once the line is done. It keeps the last valid row; a rejected line breaks the chain."""

    def __init__(self) -> None:
        self.prev: Any = None
        self.prev_line = 0
        self.why_none = "there is no row before it in the file"
        self.tail_start = 0  # index in `context` where this row's context_tail begins

    def expand(self, obj: dict[str, Any]) -> tuple[dict[str, Any], str, str]:
        """(expanded object, field, reason); a non-empty reason means the line is rejected."""
        if not COMPACT_KEYS.intersection(obj):
            return obj, "", ""
        for key, full in ((CONTEXT_FROM, "context"), (TOOLS_FROM, "tools")):
            if key in obj and full in obj:
                return obj, key, f"a row has either {full!r} or {key!r}, not both"
        if CONTEXT_FROM not in obj:
            for key in (CONTEXT_TAIL, STRIP_REASONING):
                if key in obj:
                    return obj, key, f"{key!r} without {CONTEXT_FROM!r}"
        prev = self.prev
        for key in REFERENCES:
            if key not in obj:
                continue
            ref = obj[key]
            if not isinstance(ref, str):
                return obj, key, "must be the id (a string) of the previous row"
            if ref == obj.get("id"):
                return obj, key, f"{ref!r} names the row itself"
            if prev is None:
                return obj, key, f"continues row {ref!r}, but {self.why_none}"
            if prev.id != ref:
                return obj, key, (f"continues row {ref!r}, but the previous row is {prev.id!r} "
                                  f"(line {self.prev_line}): the file was filtered or reordered "
                                  "after it was written; re-write it with pivotrl")
        out = {k: v for k, v in obj.items() if k not in COMPACT_KEYS}
        if CONTEXT_FROM in obj:
            tail = obj.get(CONTEXT_TAIL, [])
            if not isinstance(tail, list):
                return obj, CONTEXT_TAIL, "must be a list of messages"
            strip = obj.get(STRIP_REASONING, False)
            if not isinstance(strip, bool):
                return obj, STRIP_REASONING, "must be true or false"
            size = len(prev.context) + 1 + len(tail)
            if size > MAX_CONTEXT_MESSAGES:
                return obj, CONTEXT_FROM, (f"context of {size} messages is above the limit of "
                                           f"{MAX_CONTEXT_MESSAGES} (pivotrl.io.compact_rows)")
            last = _without_reasoning(prev.expected) if strip else prev.expected
            # the same Message objects as the previous row: a trajectory's messages are held once
            out["context"] = [*prev.context, last, *tail]
            self.tail_start = len(prev.context) + 1
        if TOOLS_FROM in obj:
            out["tools"] = prev.tools
        if METADATA_FROM in obj:
            own = obj.get("metadata", {})
            if not isinstance(own, dict):
                return obj, "metadata", "must be an object"
            if len(prev.metadata) > MAX_INHERITED_METADATA_KEYS:
                return obj, METADATA_FROM, (
                    f"inherits {len(prev.metadata)} metadata keys; at most "
                    f"{MAX_INHERITED_METADATA_KEYS} may be inherited (write the row in full)")
            out["metadata"] = {**prev.metadata, **own}
        return out, "", ""

    def check(self, obj: dict[str, Any], record: Any) -> tuple[str, str] | None:
        """A reference must stay inside one trajectory and point at an earlier turn of it."""
        for key in REFERENCES:
            if key not in obj:
                continue
            if record.trajectory_id != self.prev.trajectory_id:
                return key, (f"continues row {self.prev.id!r} of trajectory "
                             f"{self.prev.trajectory_id!r}, not of this row's "
                             f"{record.trajectory_id!r}")
            if record.turn <= self.prev.turn:
                return key, (f"continues row {self.prev.id!r} (turn {self.prev.turn}), which is "
                             f"not an earlier turn than this row's {record.turn}")
        return None

    def field(self, obj: dict[str, Any], loc: str) -> str:
        """A validation error's field as the line spells it: context.N → context_tail.M."""
        parts = loc.split(".")
        if CONTEXT_FROM in obj and parts[0] == "context" and len(parts) > 1 and parts[1].isdigit():
            return ".".join([CONTEXT_TAIL, str(int(parts[1]) - self.tail_start), *parts[2:]])
        return loc

    def line_done(self, lineno: int) -> None:
        """End of a non-blank line: unless it became the previous row (`accept`), it breaks the
        chain (a bad line cannot be continued)."""
        if self.prev_line != lineno:
            self.accept(None, lineno)

    def accept(self, record: Any, lineno: int) -> None:
        """Record the line just read: its row (None when rejected) is what the next one continues."""
        self.prev, self.prev_line = record, lineno
        self.why_none = (f"the row before it (line {lineno}) was rejected" if record is None
                         else "")
