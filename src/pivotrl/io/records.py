"""Records of the data flow (docs/DESIGN.md, contract) and their JSON Lines I/O.

Every reader here streams: one line in memory at a time. A bad line never raises a traceback;
it becomes a `Reject` (file, line, field, reason) that the caller writes to a rejects file, or,
with `strict=True`, a `RecordError` naming the same. Writers either append with a flush per
record (resumable: a killed run leaves at most one torn last line, which `repair_tail` removes)
or write a whole file atomically (temp file + rename). Turn files (turns, profiles, pivots) may
hold compact rows (`pivotrl.io.compact_rows`): `read_records` expands them, the writers produce them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pivotrl.io.atomic import atomic_path
from pivotrl.io.compact_rows import RowDecoder, RowEncoder
from pivotrl.io.tool_pairing import pair_tool_messages

ROLES = ("system", "user", "assistant", "tool")


class Record(BaseModel):
    # Unknown fields are kept and written back: users' files carry their own metadata.
    model_config = ConfigDict(extra="allow")


class FunctionCall(Record):
    name: str = Field(..., description="Name of the called tool (OpenAI `function.name`).")
    arguments: str | dict[str, Any] = Field(
        "{}", description="Arguments: a JSON object, or a string holding one (OpenAI's form); "
        "default: no arguments.")


class ToolCall(Record):
    id: str | None = Field(None, description="Call id that a later tool message answers "
                           "(`tool_call_id`); None when the data set has none.")
    type: str = Field("function", description="OpenAI call type; only 'function' exists.")
    function: FunctionCall = Field(..., description="The called function and its arguments.")

    def args(self) -> dict[str, Any]:
        """The arguments as a dict, whichever form the file used (raises ValueError if not JSON)."""
        return parse_arguments(self.function.arguments)


class Message(Record):
    role: Literal["system", "user", "assistant", "tool"] = Field(
        ..., description="Who speaks (OpenAI chat roles).")
    content: str | list[Any] | None = Field(
        None, description="Text, or OpenAI content parts; None for a pure tool-call message.")
    tool_calls: list[ToolCall] | None = Field(
        None, description="Assistant only: the tool calls of this message.")
    tool_call_id: str | None = Field(
        None, description="Tool only: id of the call this message answers.")
    reasoning_content: str | None = Field(
        None, description="Assistant only: the model's thinking, kept apart from content.")
    name: str | None = Field(None, description="Tool only: name of the answering tool.")


class Trajectory(Record):
    id: str = Field(..., description="Unique id of the trajectory within its file.")
    messages: list[Message] = Field(..., description="The conversation, in order.")
    tools: list[dict[str, Any]] = Field(
        default_factory=list, description="OpenAI tool schemas offered to the model; default none.")
    domain: str | None = Field(None, description="Task family, for per-domain counts.")
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="Anything else (e.g. a workspace for the shell "
        "verifier); copied into every Turn.")


class Turn(Record):
    id: str = Field(..., description="`<trajectory id>/<assistant ordinal>`.")
    trajectory_id: str = Field(..., description="Id of the trajectory the turn comes from.")
    turn: int = Field(..., description="Ordinal of the expected message among the trajectory's "
                      "assistant messages (0-based).")
    domain: str | None = Field(None, description="The trajectory's domain.")
    tools: list[dict[str, Any]] = Field(default_factory=list,
                                        description="The trajectory's tool schemas.")
    context: list[Message] = Field(..., description="Every message before the expected one.")
    expected: Message = Field(..., description="The expert's assistant message at this turn.")
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="The trajectory's metadata plus `message_index`, and "
        "`action_format` when the expected action is not a chat message or tool calls: "
        "'terminus_2', JSON keystrokes in the text (pivotrl.formats.terminus; scored by "
        "pivotrl.verifiers.terminus_identity).")


class Sample(Record):
    completion: str = Field(..., description="The sampled text, as the model wrote it.")
    reward: float = Field(..., description="Verifier reward in [0, 1] (pivotrl.scoring).")
    valid: bool = Field(..., description="False when the text could not be parsed or scored.")
    reason: str = Field("", description="Why the reward is what it is; empty when unremarkable.")
    finish_reason: str | None = Field(
        None, description="Why sampling stopped: 'stop', or 'length' when cut at max_new_tokens; "
        "None when the sampler does not say.")
    tokens: int | None = Field(None, description="Tokens generated; None when not reported.")


class Profile(Turn):
    k: int = Field(..., description="Samples drawn for this turn.")
    samples: list[Sample] = Field(..., description="The K samples with their rewards.")
    reward_mean: float = Field(..., description="Mean reward over the samples.")
    reward_std: float = Field(..., description="Population standard deviation of the rewards.")
    unverifiable: str | None = Field(
        None, description="Why the verifier cannot verify this turn at all (e.g. no probe "
        "workspace changes the expert's outcome, so a memorised answer would be paid); "
        "`pivotrl.select` never keeps such a turn. None: verifiable.")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) < len(pairs):
        raise ValueError(f"duplicate key {next(k for i, (k, _) in enumerate(pairs) if k in dict(pairs[:i]))!r}")
    return obj


def loads_unique(text: str) -> Any:
    """json.loads, refusing a duplicate key at any depth (ValueError): parsers differ on which of
    two values wins, so such a text names no one value and keeping either loses the other."""
    return json.loads(text, object_pairs_hook=_unique_keys)


def parse_arguments(arguments: str | dict[str, Any] | None) -> dict[str, Any]:
    """A call's arguments as a dict (ValueError unless one JSON object with unique keys)."""
    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, dict):
        return arguments
    value = loads_unique(arguments)
    if not isinstance(value, dict):
        raise ValueError(f"arguments must be a JSON object, got {type(value).__name__}")
    return value


def message_text(message: Message) -> str:
    """Plain text of a message's content (OpenAI content parts joined)."""
    if message.content is None:
        return ""
    if isinstance(message.content, str):
        return message.content
    return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in message.content)


# ---------------------------------------------------------------- errors and rejects


@dataclass
class Reject:
    file: str
    line: int
    reason: str
    field: str = ""
    raw: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "field": self.field, "reason": self.reason,
                "raw": self.raw}

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" + (f" [{self.field}]" if self.field else "")
        return f"{where}: {self.reason}"


class RecordError(ValueError):
    def __init__(self, reject: Reject):
        super().__init__(str(reject))
        self.reject = reject


def check_trajectory(traj: Trajectory) -> tuple[str, str] | None:
    """Semantic checks pydantic cannot express, and tool results paired with their calls (by id,
    or by order where unambiguous: `io.tool_pairing`, which fills the ids it pairs). Returns
    (field, reason) of the first problem."""
    if not traj.messages:
        return "messages", "no messages"
    for i, msg in enumerate(traj.messages):
        if msg.role != "assistant":
            continue
        if not msg.tool_calls and not message_text(msg).strip():
            return f"messages[{i}]", "assistant message has neither content nor tool_calls"
        for j, call in enumerate(msg.tool_calls or []):
            try:
                call.args()
            except ValueError as exc:
                return f"messages[{i}].tool_calls[{j}].function.arguments", f"invalid JSON: {exc}"
    problem = pair_tool_messages(traj.messages)
    if problem is None and not any(m.role == "assistant" for m in traj.messages):
        return "messages", "no assistant message"
    return problem


def _first_error(exc: ValidationError) -> tuple[str, str]:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    if err["type"] == "literal_error" and loc.endswith("role"):
        return loc, f"unknown role {err.get('input')!r} (expected one of {', '.join(ROLES)})"
    if err["type"] == "missing":
        return loc, f"missing field {loc!r}"
    return loc, err["msg"]


T = TypeVar("T", bound=BaseModel)
MAX_DEPTH = 64  # deepest JSON nesting accepted (real records: < 20; pydantic's encoder fails ~250)
UTF8_BOM = "\ufeff"


def iter_lines(path: str | Path) -> Iterator[tuple[int, str, str]]:
    """(line number, text without its "\n", problem) of every line of a JSONL file: the one
    way every reader here splits and decodes, so line numbers match `wc -l` and editors.

    - only "\n" ends a line: "\r", "\x0b", "\x1c", U+2028 ... are data (str.splitlines would
      split on them and shift every later line);
    - a UTF-8 BOM at the start of the file is not data and is dropped;
    - a line that is not UTF-8 comes with problem "not UTF-8 ..." (text decoded with U+FFFD,
      for the rejects file only): nothing is silently replaced.
    Blank lines are yielded too: what they mean is the caller's rule (`is_blank`).
    """
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if raw.endswith(b"\n"):
                raw = raw[:-1]
            try:
                text, problem = raw.decode("utf-8"), ""
            except UnicodeDecodeError as exc:
                text = raw.decode("utf-8", "replace")
                problem = f"not UTF-8: invalid byte at column {exc.start + 1}"
            if lineno == 1 and text.startswith(UTF8_BOM):
                text = text[1:]
            yield lineno, text, problem


def is_blank(text: str) -> bool:
    """Only JSON whitespace (space, tab, CR): such a line holds no record and is skipped and
    counted; any other character makes it a record line (rejected if it is not one)."""
    return not text.strip(" \t\r")


def too_deep(obj: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether lists/objects nest deeper than `limit` levels (level by level: no recursion)."""
    level = [obj] if isinstance(obj, (dict, list)) else []
    for _ in range(limit):
        level = [c for node in level for c in (node.values() if isinstance(node, dict) else node)
                 if isinstance(c, (dict, list))]
        if not level:
            return False
    return bool(level)


def parse_json_line(text: str) -> tuple[Any, str]:
    """(value, "") or (None, reason) for one line's JSON; never raises on hostile input."""
    try:
        value = loads_unique(text)
    except json.JSONDecodeError as exc:
        return None, f"not JSON: {exc.msg} at column {exc.colno}"
    except ValueError as exc:  # a duplicate key: which value the record means is unknown
        return None, f"not accepted: {exc}"
    except RecursionError:
        return None, f"not accepted: JSON nested deeper than {MAX_DEPTH} levels"
    # fewer brackets than the limit cannot nest deeper (a C-speed count spares most walks)
    if text.count("[") + text.count("{") > MAX_DEPTH and too_deep(value):
        return None, f"not accepted: JSON nested deeper than {MAX_DEPTH} levels"
    return value, ""


def read_records(path: str | Path, model: type[T], *, strict: bool = False,
                 check=None, counts: dict[str, int] | None = None
                 ) -> Iterator[tuple[int, T | Reject]]:
    """Yield (line number, record or Reject) for every non-blank line of a JSONL file
    (lines as `iter_lines` reads them; blank lines are skipped and counted in
    `counts["blank"]` when `counts` is given).

    `check(record) -> (field, reason) | None` adds semantic validation (e.g. `check_trajectory`
    for Trajectory files). With strict=True the first bad line raises RecordError instead.

    Turn models (Turn, Profile, pivots) are expanded here, the one place: a compact row
    (`pivotrl.io.compact_rows`) gets the context and tools of the row before it; a broken chain is a
    Reject naming the field. A row that fails only `check` still continues the chain (its
    context is well defined), so one bad turn does not take its trajectory's later turns along.
    """
    path = Path(path)
    if check is None and model is Trajectory:
        check = check_trajectory
    rows = RowDecoder() if issubclass(model, Turn) else None
    for lineno, text, problem in iter_lines(path):
        if not problem and is_blank(text):
            if counts is not None:
                counts["blank"] = counts.get("blank", 0) + 1
            continue
        if problem:
            result: T | Reject = Reject(str(path), lineno, problem, "", text[:2000])
        else:
            result = parse_line(str(path), lineno, text, model, check, rows)
        if rows is not None:
            rows.line_done(lineno)
        if strict and isinstance(result, Reject):
            raise RecordError(result)
        yield lineno, result


def parse_line(file: str, lineno: int, raw: str, model: type[T], check,
                rows: RowDecoder | None = None) -> T | Reject:
    """One line → record or Reject; with `rows`, a Turn row is expanded and, when valid,
    becomes the row the next line may continue (`rows.accept`)."""
    obj, problem = parse_json_line(raw)
    if problem:
        return Reject(file, lineno, problem, "", raw[:2000])
    if not isinstance(obj, dict):
        return Reject(file, lineno, f"expected a JSON object, got {type(obj).__name__}", "",
                      raw[:2000])
    return parse_object(file, lineno, obj, raw, model, check, rows)


def parse_object(file: str, lineno: int, obj: dict[str, Any], raw: str, model: type[T], check,
                 rows: RowDecoder | None = None) -> T | Reject:
    """A decoded JSON object → record or Reject (`parse_line` after the JSON)."""
    full = obj
    if rows is not None:
        full, field, reason = rows.expand(obj)
        if reason:
            return Reject(file, lineno, reason, field, raw[:2000])
    try:
        record = model.model_validate(full)
    except ValidationError as exc:
        field, reason = _first_error(exc)
        return Reject(file, lineno, reason, rows.field(obj, field) if rows else field, raw[:2000])
    except (ValueError, TypeError, RecursionError) as exc:  # pragma: no cover - defensive
        return Reject(file, lineno, f"invalid record: {exc}", "", raw[:2000])
    if rows is not None:
        problem = rows.check(obj, record)
        if problem is not None:
            return Reject(file, lineno, problem[1], problem[0], raw[:2000])
        rows.accept(record, lineno)
    if check is not None:
        problem = check(record)
        if problem is not None:
            return Reject(file, lineno, problem[1], problem[0], raw[:2000])
    return record


def iter_valid(path: str | Path, model: type[T]) -> Iterator[T]:
    """Records of a file we wrote ourselves; a bad line here is a bug, so it raises."""
    for _, rec in read_records(path, model, strict=True):
        yield rec  # type: ignore[misc]


# ---------------------------------------------------------------- writing


def dump(record: BaseModel | dict[str, Any]) -> str:
    if isinstance(record, BaseModel):  # pydantic's Rust encoder: ~5× faster than json.dumps
        return record.model_dump_json(exclude_none=True)
    return json.dumps(record, ensure_ascii=False)


def write_text_atomic(path: str | Path, text: str) -> None:
    """A whole text file (JSON stats, a report) via `atomic_path`."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


class AtomicWriter:
    """Write a whole JSONL file via `atomic_path` (temp file + rename). Turn records (Turn,
    Profile) go through `RowEncoder`: compact rows unless compact=False."""

    def __init__(self, path: str | Path, *, compact: bool = True):
        self.path = Path(path)
        self._ctx = atomic_path(self.path)
        self._fh = self._ctx.__enter__().open("w", encoding="utf-8")
        self._rows = RowEncoder(compact)
        self.count = 0

    def write(self, record: BaseModel | dict[str, Any]) -> None:
        self._fh.write(_line(record, self._rows) + "\n")
        self.count += 1

    def __enter__(self) -> AtomicWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._fh.close()
        if exc_type is None:
            self._ctx.__exit__(None, None, None)
        else:  # the temp file is removed, the exception goes on
            self._ctx.__exit__(exc_type, exc, tb)


def _line(record: BaseModel | dict[str, Any], rows: RowEncoder) -> str:
    return rows.encode(record) if isinstance(record, Turn) else dump(record)


def write_atomic(path: str | Path, records: Iterable[BaseModel | dict[str, Any]], *,
                 compact: bool = True) -> int:
    with AtomicWriter(path, compact=compact) as writer:
        for rec in records:
            writer.write(rec)
    return writer.count


def repair_tail(path: str | Path) -> int:
    """Drop a torn last line left by a killed writer. Returns the number of complete lines."""
    path = Path(path)
    if not path.exists():
        return 0
    with path.open("rb+") as fh:
        data = fh.read()
        keep = data.rfind(b"\n") + 1
        if keep != len(data):
            fh.truncate(keep)
    return data[:keep].count(b"\n")


class AppendWriter:
    """Append-only JSONL writer, one flush per record, so a crash loses at most the record
    being written (and `repair_tail` removes its torn remains on resume). Turn records are
    encoded like AtomicWriter's; the first row of each writer is full, so rows appended by a
    resumed run never continue a row of the earlier run."""

    def __init__(self, path: str | Path, *, fsync: bool = False, compact: bool = True):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        repair_tail(self.path)
        self._fh = self.path.open("a", encoding="utf-8")
        self._fsync = fsync
        self._rows = RowEncoder(compact)

    def write(self, record: BaseModel | dict[str, Any]) -> None:
        self._fh.write(_line(record, self._rows) + "\n")
        self._fh.flush()
        if self._fsync:
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> AppendWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def done_ids(path: str | Path, key: str = "id") -> set[str]:
    """Ids already written to an append-only output (for resuming); repairs a torn tail first."""
    path = Path(path)
    if not path.exists():
        return set()
    repair_tail(path)
    return {str(json.loads(text)[key]) for _, text, _ in iter_lines(path) if not is_blank(text)}


def sidecar_path(out: str | Path, ending: str, extension: str = ".jsonl") -> Path:
    """The one naming rule for files written next to OUT: its name less `extension`, plus `ending`
    (`turns.jsonl`, `.rejects.jsonl` → `turns.rejects.jsonl`)."""
    out = Path(out)
    stem = out.name[: -len(extension)] if out.name.endswith(extension) else out.name
    return out.with_name(stem + ending)


def rejects_path(out: str | Path) -> Path:
    """`turns.jsonl` → `turns.rejects.jsonl`, next to the output (docs/DESIGN.md contract)."""
    return sidecar_path(out, ".rejects.jsonl")


def stats_path(out: str | Path) -> Path:
    """`profile.jsonl` → `profile.stats.json`: what a verb did, next to its output."""
    return sidecar_path(out, ".stats.json")


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every non-blank line of a JSON Lines file we wrote ourselves (caches, results), parsed. Not for
    user input: that goes through `read_records`, which rejects bad lines instead of raising."""
    with Path(path).open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
