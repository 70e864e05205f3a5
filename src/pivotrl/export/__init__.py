"""Turns (or pivots) to other engines' formats and back: NeMo-Gym rows and verl parquet.

NeMo-Gym rows (JSONL; NeMo-Gym speaks the OpenAI Responses API):

    {"id": turn id,
     "responses_create_params": {"input": [context as Responses input items], "tools": [...]},
     "expected_action": {"type": "function_call" | "message", "output": [items]},
     "metadata": {"trajectory_id", "turn", "domain", "turn_metadata", ...}}

Context messages become Responses input items: system/user/assistant text as
`{"role", "content"}`, each tool call as `{"type": "function_call", "call_id", "name",
"arguments": JSON string}`, each tool result as `{"type": "function_call_output", "call_id",
"output"}`, reasoning as `{"type": "reasoning", "summary": [{"type": "summary_text", "text"}]}`.
Tools become Responses function tools (`{"type": "function", "name", "description",
"parameters", "strict": false}`). `expected_action.output` holds the expert message as the
same items, in Responses output order (reasoning, text, calls). What Responses items cannot
carry (a tool message's `name`, unknown fields of messages and of the Turn, e.g. a Profile's
samples) goes to `metadata`, so `import nemo-gym` gives back the same Turn.

verl parquet (verl's RL dataset columns): `data_source` (the domain), `prompt` (the context
as `{role, content}` chat messages; assistant tool calls rendered as the Hermes text training
parses, see `pivotrl.actions.render_action`), `ability`, `reward_model` = `{"style": "rule",
"ground_truth": JSON of the expert message}`, `extra_info` = `{index, id, trajectory_id, turn,
domain, tools, context, expected, metadata}` (the structured parts as JSON strings: Arrow would
otherwise merge differently-keyed dicts and fill holes with nulls).

Bad input lines never raise: they go, with line numbers, to the rejects file next to the output.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pivotrl.records import (Message, Record, Reject, Trajectory, Turn, check_trajectory,
                             message_text, read_records, rejects_path, write_atomic)

FORMATS = ("nemo-gym", "verl")


@dataclass
class ExportSummary:
    read: int = 0
    written: int = 0
    rejects: list[Reject] = field(default_factory=list)
    by_domain: Counter = field(default_factory=Counter)

    def reasons(self) -> Counter:
        return Counter(r.reason.split(":")[0] for r in self.rejects)

    def table(self, title: str):
        from rich.table import Table

        table = Table(title=title)
        table.add_column("")
        table.add_column("count", justify="right")
        table.add_row("lines read", str(self.read))
        table.add_row("records written", str(self.written))
        table.add_row("lines rejected", str(len(self.rejects)))
        for reason, n in self.reasons().most_common():
            table.add_row(f"  {reason}", str(n))
        for domain, n in sorted(self.by_domain.items()):
            table.add_row(f"domain {domain}", str(n))
        return table


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


# ---------------------------------------------------------------- NeMo-Gym rows


def _args_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def _content_to_responses(content: Any) -> Any:
    if isinstance(content, list):
        return [{"type": "input_text", "text": p.get("text", "")}
                if isinstance(p, dict) and p.get("type") == "text" else p for p in content]
    return content if content is not None else ""


def _content_from_responses(content: Any) -> Any:
    if isinstance(content, list):
        parts = [{"type": "text", "text": p.get("text", "")}
                 if isinstance(p, dict) and p.get("type") in ("input_text", "output_text") else p
                 for p in content]
        return parts
    return content


def message_items(message: Message, index: int) -> list[dict[str, Any]]:
    """One chat message as Responses input items."""
    if message.role == "tool":
        return [{"type": "function_call_output", "call_id": message.tool_call_id or "",
                 "output": message_text(message)}]
    if message.role != "assistant":
        return [{"role": message.role, "content": _content_to_responses(message.content)}]
    items: list[dict[str, Any]] = []
    if message.reasoning_content:
        items.append({"type": "reasoning",
                      "summary": [{"type": "summary_text", "text": message.reasoning_content}]})
    if message.content not in (None, "", []):
        items.append({"role": "assistant", "content": _content_to_responses(message.content)})
    for j, call in enumerate(message.tool_calls or []):
        items.append({"type": "function_call", "call_id": call.id or f"call_{index}_{j}",
                      "name": call.function.name, "arguments": _args_text(call.function.arguments)})
    return items


def tool_to_responses(tool: dict[str, Any]) -> dict[str, Any]:
    fn = tool.get("function") if tool.get("type") == "function" else None
    if not isinstance(fn, dict):
        return tool  # built-in tools pass through
    out = {"type": "function", "name": fn.get("name", ""), "description": fn.get("description", ""),
           "parameters": fn.get("parameters", {"type": "object", "properties": {}}),
           "strict": bool(fn.get("strict", False))}
    return out


def tool_from_responses(tool: dict[str, Any]) -> dict[str, Any]:
    if tool.get("type") != "function" or "function" in tool:
        return tool
    fn = {"name": tool.get("name", ""), "description": tool.get("description", ""),
          "parameters": tool.get("parameters", {"type": "object", "properties": {}})}
    if tool.get("strict"):
        fn["strict"] = True
    return {"type": "function", "function": fn}


def _extras(message: Message) -> dict[str, Any]:
    extra = dict(message.model_extra or {})
    if message.name is not None:
        extra["name"] = message.name
    return extra


def turn_to_nemo_gym(turn: Turn) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    message_extra: dict[str, Any] = {}
    for i, msg in enumerate(turn.context):
        items.extend(message_items(msg, i))
        if extra := _extras(msg):
            message_extra[str(i)] = extra
    expected_items = message_items(turn.expected, len(turn.context))
    meta: dict[str, Any] = {"trajectory_id": turn.trajectory_id, "turn": turn.turn,
                            "domain": turn.domain, "turn_metadata": turn.metadata}
    if message_extra:
        meta["message_extra"] = message_extra
    if extra := _extras(turn.expected):
        meta["expected_extra"] = extra
    if turn.model_extra:
        meta["turn_extra"] = dict(turn.model_extra)
    return {
        "id": turn.id,
        "responses_create_params": {"input": items,
                                    "tools": [tool_to_responses(t) for t in turn.tools]},
        "expected_action": {"type": "function_call" if turn.expected.tool_calls else "message",
                            "output": expected_items},
        "metadata": meta,
    }


def items_to_messages(items: list[Any], where: str, infer_names: bool = True) -> list[Message]:
    """Responses input items back to chat messages (reasoning, text and calls that follow each
    other form one assistant message). Tool results get the called function's name unless
    `infer_names` is off (our own rows record the names that were there)."""
    messages: list[Message] = []
    names: dict[str, str] = {}
    current: dict[str, Any] | None = None  # the assistant message being assembled

    def flush() -> None:
        nonlocal current
        if current is not None:
            messages.append(Message.model_validate(current))
            current = None

    for k, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"{where}[{k}]: expected an object, got {type(item).__name__}")
        kind = item.get("type", "message")
        if kind == "reasoning":
            flush()
            text = "".join(s.get("text", "") for s in item.get("summary", []) if isinstance(s, dict))
            current = {"role": "assistant", "reasoning_content": text}
        elif kind == "function_call":
            for key in ("name", "arguments"):
                if not isinstance(item.get(key), str):
                    raise ValueError(f"{where}[{k}].{key}: missing or not a string")
            call_id = str(item.get("call_id") or item.get("id") or f"call_{k}")
            names[call_id] = item["name"]
            if current is None:
                current = {"role": "assistant"}
            current.setdefault("tool_calls", []).append(
                {"id": call_id, "type": "function",
                 "function": {"name": item["name"], "arguments": item["arguments"]}})
        elif kind == "function_call_output":
            flush()
            call_id = str(item.get("call_id", ""))
            output = item.get("output", "")
            messages.append(Message(role="tool", tool_call_id=call_id,
                                    name=names.get(call_id) if infer_names else None,
                                    content=output if isinstance(output, str) else json.dumps(output)))
        elif kind == "message":
            role = item.get("role")
            if role == "developer":
                role = "system"
            if role not in ("system", "user", "assistant"):
                raise ValueError(f"{where}[{k}].role: unknown role {role!r}")
            content = _content_from_responses(item.get("content"))
            if role == "assistant":
                if current is not None and ("tool_calls" in current or "content" in current):
                    flush()
                if current is None:
                    current = {"role": "assistant"}
                current["content"] = content
            else:
                flush()
                messages.append(Message(role=role, content=content))
        else:
            raise ValueError(f"{where}[{k}].type: unsupported item type {kind!r}")
    flush()
    return messages


def nemo_gym_to_turn(row: dict[str, Any]) -> Turn:
    """A NeMo-Gym row back to a Turn (raises ValueError naming the field)."""
    params = row.get("responses_create_params")
    if not isinstance(params, dict):
        raise ValueError("responses_create_params: missing or not an object")
    items = params.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise ValueError("responses_create_params.input: missing or not a list")
    action = row.get("expected_action")
    if not isinstance(action, dict) or not isinstance(action.get("output"), list):
        raise ValueError("expected_action.output: missing or not a list")
    meta = row.get("metadata") if isinstance(row.get("metadata"), dict) else {}
    ours = "turn_metadata" in meta  # written by turn_to_nemo_gym: extras are recorded
    context = items_to_messages(items, "responses_create_params.input", infer_names=not ours)
    expected = items_to_messages(action["output"], "expected_action.output")
    if len(expected) != 1 or expected[0].role != "assistant":
        raise ValueError("expected_action.output: must form exactly one assistant message")
    message_extra = meta.get("message_extra")
    for i, extra in (message_extra.items() if isinstance(message_extra, dict) else ()):
        if str(i).isdigit() and int(i) < len(context) and isinstance(extra, dict):
            context[int(i)] = Message.model_validate({**context[int(i)].model_dump(exclude_none=True), **extra})
    if isinstance(meta.get("expected_extra"), dict):
        expected[0] = Message.model_validate({**expected[0].model_dump(exclude_none=True),
                                              **meta["expected_extra"]})
    tools = params.get("tools") or []
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ValueError("responses_create_params.tools: not a list of objects")
    row_id = str(row.get("id") or meta.get("id") or "")
    if not row_id:
        raise ValueError("id: missing")
    trajectory_id = str(meta.get("trajectory_id") or row_id.rsplit("/", 1)[0])
    turn_index = meta.get("turn", len(context))
    return Turn.model_validate({
        **(meta["turn_extra"] if isinstance(meta.get("turn_extra"), dict) else {}),
        "id": row_id, "trajectory_id": trajectory_id,
        "turn": turn_index if isinstance(turn_index, int) else len(context),
        "domain": meta.get("domain"), "tools": [tool_from_responses(t) for t in tools],
        "context": [m.model_dump(exclude_none=True) for m in context],
        "expected": expected[0].model_dump(exclude_none=True),
        "metadata": meta.get("turn_metadata") or {},
    })


# ---------------------------------------------------------------- verl parquet


def verl_schema():
    import pyarrow as pa

    return pa.schema([
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        ("extra_info", pa.struct([("index", pa.int64()), ("id", pa.string()),
                                  ("trajectory_id", pa.string()), ("turn", pa.int64()),
                                  ("domain", pa.string()), ("tools", pa.string()),
                                  ("context", pa.string()), ("expected", pa.string()),
                                  ("metadata", pa.string())])),
    ])


def _chat(message: Message) -> dict[str, Any]:
    return message.model_dump(mode="json", exclude_none=True)


def turn_to_verl(turn: Turn, index: int, ability: str = "agent") -> dict[str, Any]:
    from pivotrl.actions import render_action

    prompt = [{"role": m.role, "content": render_action(m) if m.role == "assistant" else message_text(m)}
              for m in turn.context]
    expected = _chat(turn.expected)
    return {
        "data_source": turn.domain or "pivotrl",
        "prompt": prompt,
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": json.dumps(expected, ensure_ascii=False)},
        "extra_info": {"index": index, "id": turn.id, "trajectory_id": turn.trajectory_id,
                       "turn": turn.turn, "domain": turn.domain or "",
                       "tools": json.dumps(turn.tools, ensure_ascii=False),
                       "context": json.dumps([_chat(m) for m in turn.context], ensure_ascii=False),
                       "expected": json.dumps(expected, ensure_ascii=False),
                       "metadata": json.dumps(turn.metadata, ensure_ascii=False)},
    }


# ---------------------------------------------------------------- files


def _valid_turns(path: Path, summary: ExportSummary) -> Iterator[Turn]:
    for _, rec in read_records(path, Turn, check=check_turn):
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


def export_file(turns: str | Path, out: str | Path, fmt: str, *, batch_rows: int = 1000,
                ability: str = "agent") -> ExportSummary:
    """Turns JSONL → NeMo-Gym JSONL or verl parquet; streams, writes atomically."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    turns, out = Path(turns), Path(out)
    summary = ExportSummary()
    if fmt == "nemo-gym":
        rows = (turn_to_nemo_gym(t) for t in _valid_turns(turns, summary))
        summary.written = write_atomic(out, rows)
    else:
        summary.written = _write_parquet(out, (turn_to_verl(t, i, ability) for i, t in
                                               enumerate(_valid_turns(turns, summary))), batch_rows)
    _write_rejects(out, summary.rejects)
    return summary


def _write_parquet(out: Path, rows: Iterator[dict[str, Any]], batch_rows: int) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = verl_schema()
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    os.close(fd)
    n = 0
    try:
        with pq.ParquetWriter(tmp, schema) as writer:
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
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return n


class NemoGymRow(Record):
    responses_create_params: dict[str, Any]
    expected_action: dict[str, Any]


def row_to_turn(row: dict[str, Any]) -> Turn | tuple[str, str]:
    """A row as a valid Turn, or (field, reason) saying why not; never raises on bad data."""
    try:
        turn = nemo_gym_to_turn(row)
    except ValidationError as exc:
        err = exc.errors()[0]
        return ".".join(str(p) for p in err["loc"]), err["msg"]
    except (ValueError, TypeError, AttributeError, KeyError, RecursionError) as exc:
        field_name, _, reason = str(exc).partition(": ")
        return (field_name, reason) if reason else ("", field_name)
    return check_turn(turn) or turn


def import_nemo_gym(rows: str | Path, out: str | Path) -> ExportSummary:
    """NeMo-Gym rows JSONL → Turns JSONL (bad rows to the rejects file)."""
    rows, out = Path(rows), Path(out)
    summary = ExportSummary()

    def turns() -> Iterator[Turn]:
        for lineno, rec in read_records(rows, NemoGymRow):
            summary.read += 1
            result = rec if isinstance(rec, Reject) else row_to_turn(rec.model_dump())
            if isinstance(result, Turn):
                summary.by_domain[result.domain or "-"] += 1
                yield result
            elif isinstance(result, Reject):
                summary.rejects.append(result)
            else:
                summary.rejects.append(Reject(str(rows), lineno, result[1], result[0],
                                              json.dumps(rec.model_dump())[:2000]))

    summary.written = write_atomic(out, turns())
    _write_rejects(out, summary.rejects)
    return summary
