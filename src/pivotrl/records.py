"""Records of the data flow (docs/DESIGN.md, contract) and their JSON Lines I/O.

Every reader here streams: one line in memory at a time. A bad line never raises a traceback;
it becomes a `Reject` (file, line, field, reason) that the caller writes to a rejects file, or,
with `strict=True`, a `RecordError` naming the same. Writers either append with a flush per
record (resumable: a killed run leaves at most one torn last line, which `repair_tail` removes)
or write a whole file atomically (temp file + rename).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

ROLES = ("system", "user", "assistant", "tool")


class Record(BaseModel):
    # Unknown fields are kept and written back: users' files carry their own metadata.
    model_config = ConfigDict(extra="allow")


class FunctionCall(Record):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(Record):
    id: str | None = None
    type: str = "function"
    function: FunctionCall

    def args(self) -> dict[str, Any]:
        """The arguments as a dict, whichever form the file used (raises ValueError if not JSON)."""
        return parse_arguments(self.function.arguments)


class Message(Record):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[Any] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    name: str | None = None


class Trajectory(Record):
    id: str
    messages: list[Message]
    tools: list[dict[str, Any]] = Field(default_factory=list)
    domain: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class Turn(Record):
    id: str
    trajectory_id: str
    turn: int
    domain: str | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list)
    context: list[Message]
    expected: Message
    metadata: dict[str, Any] = Field(default_factory=dict)


class Sample(Record):
    completion: str
    reward: float
    valid: bool
    reason: str = ""


class Profile(Turn):
    k: int
    samples: list[Sample]
    reward_mean: float
    reward_std: float


def parse_arguments(arguments: str | dict[str, Any] | None) -> dict[str, Any]:
    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, dict):
        return arguments
    value = json.loads(arguments)
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
    """Semantic checks pydantic cannot express. Returns (field, reason) of the first problem."""
    if not traj.messages:
        return "messages", "no messages"
    seen_call_ids: set[str] = set()
    for i, msg in enumerate(traj.messages):
        where = f"messages[{i}]"
        if msg.role == "assistant":
            if not msg.tool_calls and not message_text(msg).strip():
                return where, "assistant message has neither content nor tool_calls"
            for j, call in enumerate(msg.tool_calls or []):
                try:
                    call.args()
                except ValueError as exc:
                    return f"{where}.tool_calls[{j}].function.arguments", f"invalid JSON: {exc}"
                if call.id:
                    seen_call_ids.add(call.id)
        elif msg.role == "tool":
            if msg.tool_call_id is None:
                return f"{where}.tool_call_id", "tool message without tool_call_id"
            if msg.tool_call_id not in seen_call_ids:
                return (f"{where}.tool_call_id",
                        f"tool_call_id {msg.tool_call_id!r} matches no earlier tool call")
    if not any(m.role == "assistant" for m in traj.messages):
        return "messages", "no assistant message"
    return None


def _first_error(exc: ValidationError) -> tuple[str, str]:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    if err["type"] == "literal_error" and loc.endswith("role"):
        return loc, f"unknown role {err.get('input')!r} (expected one of {', '.join(ROLES)})"
    if err["type"] == "missing":
        return loc, f"missing field {loc!r}"
    return loc, err["msg"]


T = TypeVar("T", bound=BaseModel)


def read_records(path: str | Path, model: type[T], *, strict: bool = False,
                 check=None) -> Iterator[tuple[int, T | Reject]]:
    """Yield (line number, record or Reject) for every non-blank line of a JSONL file.

    `check(record) -> (field, reason) | None` adds semantic validation (e.g. `check_trajectory`
    for Trajectory files). With strict=True the first bad line raises RecordError instead.
    """
    path = Path(path)
    if check is None and model is Trajectory:
        check = check_trajectory
    # newline="\n": line numbers match `wc -l` and editors (a stray \r is data, not a line break).
    with path.open("r", encoding="utf-8", errors="replace", newline="\n") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            result = _parse_line(str(path), lineno, line, model, check)
            if strict and isinstance(result, Reject):
                raise RecordError(result)
            yield lineno, result


def _parse_line(file: str, lineno: int, line: str, model: type[T], check) -> T | Reject:
    raw = line.rstrip("\n")
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        return Reject(file, lineno, f"not JSON: {exc.msg} at column {exc.colno}", "", raw[:2000])
    if not isinstance(obj, dict):
        return Reject(file, lineno, f"expected a JSON object, got {type(obj).__name__}", "",
                      raw[:2000])
    try:
        record = model.model_validate(obj)
    except ValidationError as exc:
        field, reason = _first_error(exc)
        return Reject(file, lineno, reason, field, raw[:2000])
    except (ValueError, TypeError, RecursionError) as exc:  # pragma: no cover - defensive
        return Reject(file, lineno, f"invalid record: {exc}", "", raw[:2000])
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


class AtomicWriter:
    """Write a whole JSONL file via temp file + rename: readers never see a half file, and an
    interrupted run leaves the previous file (or none) in place."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, self._tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.",
                                         suffix=".tmp")
        # mkstemp makes the file 0600; give it the permissions a plain open() would.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self._tmp, 0o666 & ~umask)
        self._fh = os.fdopen(fd, "w", encoding="utf-8")
        self.count = 0

    def write(self, record: BaseModel | dict[str, Any]) -> None:
        self._fh.write(dump(record) + "\n")
        self.count += 1

    def __enter__(self) -> AtomicWriter:
        return self

    def __exit__(self, exc_type, *_) -> None:
        if exc_type is None:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()
            os.replace(self._tmp, self.path)
        else:
            self._fh.close()
            Path(self._tmp).unlink(missing_ok=True)


def write_atomic(path: str | Path, records: Iterable[BaseModel | dict[str, Any]]) -> int:
    with AtomicWriter(path) as writer:
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
    being written (and `repair_tail` removes its torn remains on resume)."""

    def __init__(self, path: str | Path, *, fsync: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        repair_tail(self.path)
        self._fh = self.path.open("a", encoding="utf-8")
        self._fsync = fsync

    def write(self, record: BaseModel | dict[str, Any]) -> None:
        self._fh.write(dump(record) + "\n")
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
    ids = set()
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                ids.add(str(json.loads(line)[key]))
    return ids


def rejects_path(out: str | Path) -> Path:
    """`turns.jsonl` → `turns.rejects.jsonl`, next to the output (docs/DESIGN.md contract)."""
    out = Path(out)
    stem = out.name[: -len(".jsonl")] if out.name.endswith(".jsonl") else out.name
    return out.with_name(f"{stem}.rejects.jsonl")
