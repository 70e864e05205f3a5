"""NeMo-Gym `terminus_judge` rows -> Turns whose expected action is a Terminus-2 action.

NeMo-Gym's `terminus_judge` resources server (resources_servers/terminus_judge/, its
data/example.jsonl and app.py) takes rows of this shape:

    {"responses_create_params": {"input": [{"role": "user", "content": harness prompt + screen}]},
     "expected_answer": the expert's Terminus-2 action, a JSON string,
     "uuid": "…", "metadata": {"harness": "terminus_2", "category": "first_round"},
     "agent_ref": {"type": "responses_api_agents", "name": "terminus_judge_simple_agent"}}

(`threshold`, the string-similarity bar, may come with a row: app.py reads it, the examples have
none.) NVIDIA's `Nemotron-RL-Agentic-Terminal-Pivot-v1` is reported to ship such rows with
`task_name`, `metadata.source_trajectory_uid` and `metadata.pivot_agent_turn_index`, and no pass
rates. Those three are read when present and never required (no published row confirms them):
the source trajectory's id keeps the pivots of one trajectory on one side of a train/eval split;
without it each row is its own trajectory.

The Turn: the context from `input` as `pivotrl.export.nemo_gym` reads it, the expected message
the action's JSON text, `metadata` the row's metadata plus `action_format: terminus_2` (scored
by `pivotrl.verifiers.terminus_identity`) and the row's other fields under `nemo_gym`. A row of
another harness (`terminus_1`, whose schema differs) or whose expected answer is not one
Terminus-2 action is refused, naming the field.
"""

from __future__ import annotations

from typing import Any

from pivotrl.export.nemo_gym import items_to_messages
from pivotrl.formats.terminus import ACTION_FORMAT_KEY, TERMINUS_2, parse_terminus
from pivotrl.io.records import Message, Turn

# Top-level keys read into the Turn; any other key of the row is kept under metadata.nemo_gym.row.
_ROW_KEYS = ("responses_create_params", "expected_answer", "expected_action", "uuid", "id",
             "metadata", "agent_ref")


def is_terminus_row(row: dict[str, Any]) -> bool:
    """A `terminus_judge` row: an `expected_answer` where argument-comparison rows have
    `expected_action`."""
    return row.get("expected_action") is None and "expected_answer" in row


def _identifier(value: Any, where: str) -> str | None:
    """A row's id-like field as text; None when absent; an error naming it when it is no id."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
        raise ValueError(f"{where}: not a non-empty string or integer")
    return str(value)


def _context(params: dict[str, Any]) -> list[Message]:
    items = params.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise ValueError("responses_create_params.input: missing, empty or not a list")
    context = items_to_messages(items, "responses_create_params.input")
    instructions = params.get("instructions")
    if isinstance(instructions, str) and instructions:
        # The Responses API puts `instructions` before the input as a system message.
        context.insert(0, Message(role="system", content=instructions))
    return context


def _turn_index(value: Any, context: list[Message]) -> int:
    """The row's own place in its trajectory where it names one, else the assistant turns
    before it (the Turn's ordinal)."""
    if value is None:
        return sum(m.role == "assistant" for m in context)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("metadata.pivot_agent_turn_index: not a non-negative integer")
    return value


def terminus_row_to_turn(row: dict[str, Any], fallback_id: str | None = None) -> Turn:
    """A `terminus_judge` row as a Turn (raises ValueError naming the field). The Turn id is the
    row's `uuid`, else its `id`, else `fallback_id` (file:line)."""
    params = row.get("responses_create_params")
    if not isinstance(params, dict):
        raise ValueError("responses_create_params: missing or not an object")
    meta = row.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise ValueError("metadata: not an object")
    meta = dict(meta or {})
    harness = meta.get("harness")
    if harness != TERMINUS_2:
        raise ValueError(f"metadata.harness: {harness!r}; only {TERMINUS_2!r} rows are read (the "
                         "terminus_1 schema has other fields)" if harness is not None else
                         "metadata.harness: missing (terminus_judge needs it to pick the schema)")
    answer = row.get("expected_answer")
    if not isinstance(answer, str):
        raise ValueError("expected_answer: missing or not a string")
    parsed = parse_terminus(answer)
    if not parsed.valid:
        raise ValueError(f"expected_answer: not a Terminus-2 action: {parsed.reason}")
    row_id = (_identifier(row.get("uuid"), "uuid") or _identifier(row.get("id"), "id")
              or fallback_id)
    if not row_id:
        raise ValueError("uuid: missing (no uuid or id)")
    trajectory = _identifier(meta.get("source_trajectory_uid"), "metadata.source_trajectory_uid")
    _identifier(row.get("task_name"), "task_name")  # checked; kept with the row's other fields
    context = _context(params)
    gym: dict[str, Any] = {}
    kept = {k: v for k, v in params.items() if k not in ("input", "instructions") and v is not None}
    if kept:
        gym["responses_create_params"] = kept
    if isinstance(row.get("agent_ref"), dict):
        gym["agent_ref"] = row["agent_ref"]
    rest = {k: v for k, v in row.items() if k not in _ROW_KEYS}
    if rest:
        gym["row"] = rest
    return Turn.model_validate({
        "id": row_id, "trajectory_id": trajectory or row_id,
        "turn": _turn_index(meta.get("pivot_agent_turn_index"), context),
        "domain": meta.get("domain") if isinstance(meta.get("domain"), str) else None,
        "context": [m.model_dump(exclude_none=True) for m in context],
        "expected": {"role": "assistant", "content": answer},
        "metadata": {**meta, ACTION_FORMAT_KEY: TERMINUS_2, **({"nemo_gym": gym} if gym else {})},
    })
