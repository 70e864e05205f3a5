"""Turns <-> NeMo-Gym pivot rows (the row contract of NeMo-Gym's
`single_step_tool_use_with_argument_comparison` resources server).

A row (JSONL; NeMo-Gym speaks the OpenAI Responses API):

    {"responses_create_params": {"input": [context as Responses input items], "tools": [...],
                                 "parallel_tool_calls": bool, "tool_choice": "auto"},
     "expected_action": {"type": "function_call", "name", "arguments": JSON string}
                      | {"type": "function_call_batch", "calls": [function_call, ...]}
                      | {"type": "message", "content": str},
     "agent_ref": {"type": "responses_api_agents", "name": the config's agent block},
     "id": turn id, "metadata": {"trajectory_id", "turn", "domain", "turn_metadata", ...}}

Context messages become Responses input items: system/user/assistant text as
`{"type": "message", "role", "content"}`, reasoning as `{"type": "reasoning", "id",
"summary": [{"type": "summary_text", "text"}]}` (NeMo-Gym's reasoning item requires an id),
each tool call as `{"type": "function_call", "call_id", "name", "arguments"}`, each tool result
as `{"type": "function_call_output", "call_id", "output"}`. Tools become Responses function tools.

What NeMo-Gym's row cannot carry (a tool message's `name`, unknown fields of messages and of the
Turn such as a Profile's samples, the expert's reasoning and text next to its calls, call ids)
goes to `metadata`, so `import nemo-gym` gives back the same Turn. Rows written by NeMo-Gym
itself (no id, `uuid`, output-message items with ids and annotations, batches, an
`instructions` string, expected actions without `type`) are read too; their other fields are
kept under the Turn's `metadata["nemo_gym"]` and written back on export. Published pivot sets
name each row's trajectory and place in it (`row_position`): those are the Turn's.
"""

from __future__ import annotations

import json
from typing import Any

from pivotrl.formats.terminus import ACTION_FORMAT_KEY, TERMINUS_2
from pivotrl.io.records import Message, Turn, message_text, parse_arguments

AGENT_REF_TYPE = "responses_api_agents"
DEFAULT_AGENT_NAME = "pivotrl_single_step_tool_use_with_argument_comparison_agent"
PARALLEL_CALLS = ("batch", "reject")
# Top-level row keys this module writes itself; any other key of an imported row is kept.
_ROW_KEYS = ("id", "responses_create_params", "expected_action", "agent_ref", "metadata")
# Request fields rebuilt from the Turn; the others of an imported row are kept as they were.
_PARAM_KEYS = ("input", "tools", "instructions", "parallel_tool_calls")


def _args_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


# ---------------------------------------------------------------- content parts


def _part_to_responses(part: Any) -> Any:
    if not isinstance(part, dict):
        return part
    if part.get("type") == "text":
        return {"type": "input_text", "text": part.get("text", "")}
    if part.get("type") == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        detail = image.get("detail", "auto") if isinstance(image, dict) else "auto"
        return {"type": "input_image", "image_url": url, "detail": detail}
    return part


def _part_from_responses(part: Any) -> Any:
    if not isinstance(part, dict):
        return part
    kind = part.get("type")
    if kind in ("input_text", "output_text"):
        return {"type": "text", "text": part.get("text", "")}
    if kind == "refusal":
        return {"type": "text", "text": part.get("refusal", "")}
    if kind == "input_image":
        image: dict[str, Any] = {"url": part.get("image_url", "")}
        if part.get("detail") not in (None, "auto"):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    return part


def _content_to_responses(content: Any) -> Any:
    if isinstance(content, list):
        return [_part_to_responses(p) for p in content]
    return content if content is not None else ""


def _content_from_responses(content: Any) -> Any:
    if not isinstance(content, list):
        return content
    # A model's output message (output_text / refusal parts with annotations) is one text:
    # joining loses nothing a chat message can hold.
    if content and all(isinstance(p, dict) and p.get("type") in ("output_text", "refusal")
                       for p in content):
        return "".join(p.get("text", p.get("refusal", "")) for p in content)
    return [_part_from_responses(p) for p in content]


# ---------------------------------------------------------------- Turn -> row


def message_items(message: Message, index: int) -> list[dict[str, Any]]:
    """One chat message as Responses input items."""
    if message.role == "tool":
        return [{"type": "function_call_output", "call_id": message.tool_call_id or "",
                 "output": message_text(message)}]
    if message.role != "assistant":
        return [{"type": "message", "role": message.role,
                 "content": _content_to_responses(message.content)}]
    items: list[dict[str, Any]] = []
    if message.reasoning_content:
        items.append({"type": "reasoning", "id": f"rs_{index}",
                      "summary": [{"type": "summary_text", "text": message.reasoning_content}]})
    # An empty text ("") is an item too: without it the import could not tell "" from no content.
    if message.content is not None and message.content != []:
        items.append({"type": "message", "role": "assistant",
                      "content": _content_to_responses(message.content)})
    for j, call in enumerate(message.tool_calls or []):
        items.append({"type": "function_call", "call_id": call.id or f"call_{index}_{j}",
                      "name": call.function.name, "arguments": _args_text(call.function.arguments)})
    return items


def tool_to_responses(tool: dict[str, Any]) -> dict[str, Any]:
    fn = tool.get("function") if tool.get("type") == "function" else None
    if not isinstance(fn, dict):
        return tool  # built-in tools pass through
    out = {"type": "function", "name": fn.get("name", "")}
    if fn.get("description") is not None:
        out["description"] = fn["description"]
    out["parameters"] = fn.get("parameters") or {"type": "object", "properties": {}}
    out["strict"] = bool(fn.get("strict", False))
    return out


def tool_from_responses(tool: dict[str, Any]) -> dict[str, Any]:
    if tool.get("type") != "function" or "function" in tool:
        return tool
    fn: dict[str, Any] = {"name": tool.get("name", "")}
    if tool.get("description") is not None:
        fn["description"] = tool["description"]
    fn["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
    if tool.get("strict"):
        fn["strict"] = True
    return {"type": "function", "function": fn}


# The calls of a message whose arguments were a JSON object, not a string: NeMo-Gym's row holds
# strings only, so without this list a round trip would change their type.
OBJECT_ARGUMENTS = "pivotrl_object_arguments"


def _extras(message: Message) -> dict[str, Any]:
    extra = dict(message.model_extra or {})
    if message.name is not None:
        extra["name"] = message.name
    objects = [j for j, c in enumerate(message.tool_calls or []) if isinstance(c.function.arguments, dict)]
    if objects:
        extra[OBJECT_ARGUMENTS] = objects
    return extra


def _restore_objects(message: Message, objects: Any) -> Message:
    """The calls listed in `objects` (OBJECT_ARGUMENTS) get their arguments back as objects."""
    for j in objects if isinstance(objects, list) else ():
        calls = message.tool_calls or []
        if isinstance(j, int) and 0 <= j < len(calls) and isinstance(calls[j].function.arguments, str):
            try:
                calls[j].function.arguments = parse_arguments(calls[j].function.arguments)
            except ValueError:
                pass  # not an object after all: the string is kept as it is
    return message


def expected_action(message: Message) -> dict[str, Any]:
    """The expert message as NeMo-Gym's ExpectedAction: one call, a batch of calls, or a text."""
    calls = [{"type": "function_call", "name": c.function.name,
              "arguments": _args_text(c.function.arguments)} for c in message.tool_calls or []]
    if len(calls) == 1:
        return calls[0]
    if calls:
        return {"type": "function_call_batch", "calls": calls}
    return {"type": "message", "content": message_text(message)}


def _expected_extra(message: Message) -> dict[str, Any]:
    """What the ExpectedAction of `message` leaves out, to rebuild the message on import."""
    extra = _extras(message)
    if message.reasoning_content:
        extra["reasoning_content"] = message.reasoning_content
    if message.tool_calls:
        if message.content is not None:  # "" kept: the import rebuilds the message as it was
            extra["content"] = message.content
        extra["call_ids"] = [c.id for c in message.tool_calls]
    elif isinstance(message.content, list):  # the action holds the joined text only
        extra["content"] = message.content
    return extra


def turn_to_nemo_gym(turn: Turn, agent_name: str | None = None) -> dict[str, Any]:
    """A Turn as a NeMo-Gym pivot row. `agent_name`: agent_ref.name (default: the name an
    imported row had, else DEFAULT_AGENT_NAME); it must name the agent block of the Gym config."""
    gym = turn.metadata.get("nemo_gym")
    gym = gym if isinstance(gym, dict) else {}
    items: list[dict[str, Any]] = []
    message_extra: dict[str, Any] = {}
    for i, msg in enumerate(turn.context):
        items.extend(message_items(msg, i))
        if extra := _extras(msg):
            message_extra[str(i)] = extra
    meta: dict[str, Any] = {"trajectory_id": turn.trajectory_id, "turn": turn.turn,
                            "domain": turn.domain, "turn_metadata": turn.metadata}
    if message_extra:
        meta["message_extra"] = message_extra
    if extra := _expected_extra(turn.expected):
        meta["expected_extra"] = extra
    if turn.model_extra:
        meta["turn_extra"] = dict(turn.model_extra)
    action = expected_action(turn.expected)
    if action["type"] == "function_call_batch" and isinstance(gym.get("expected_action"), dict):
        action.update(gym["expected_action"])  # e.g. "ordered": true
    params = {key: val for key, val in (gym.get("responses_create_params") or {}).items()
              if key not in _PARAM_KEYS}
    params.update(input=items, tools=[tool_to_responses(t) for t in turn.tools],
                  parallel_tool_calls=action["type"] == "function_call_batch")
    params.setdefault("tool_choice", "auto")
    ref = gym.get("agent_ref") if isinstance(gym.get("agent_ref"), dict) else {}
    row = {**(gym.get("row") if isinstance(gym.get("row"), dict) else {}),
           "id": turn.id, "responses_create_params": params, "expected_action": action,
           "agent_ref": {"type": AGENT_REF_TYPE,
                         "name": agent_name or ref.get("name") or DEFAULT_AGENT_NAME},
           "metadata": meta}
    return row


# ---------------------------------------------------------------- row -> Turn


def _reasoning_text(item: dict[str, Any]) -> str:
    parts = [s.get("text", "") for s in item.get("summary") or [] if isinstance(s, dict)]
    if not any(parts):
        parts = [c.get("text", "") for c in item.get("content") or [] if isinstance(c, dict)]
    return "\n".join(p for p in parts if isinstance(p, str))


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
            current = {"role": "assistant", "reasoning_content": _reasoning_text(item)}
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
            if isinstance(output, list):
                output = _content_from_responses(output)
            messages.append(Message(role="tool", tool_call_id=call_id,
                                    name=names.get(call_id) if infer_names else None,
                                    content=output if isinstance(output, (str, list))
                                    else json.dumps(output)))
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


def _call(action: Any, where: str) -> dict[str, Any]:
    if not isinstance(action, dict):
        raise ValueError(f"{where}: expected an object")
    if not isinstance(action.get("name"), str) or not action["name"]:
        raise ValueError(f"{where}.name: missing or not a non-empty string")
    args = action.get("arguments")
    if not isinstance(args, (str, dict)):
        raise ValueError(f"{where}.arguments: missing, or neither a JSON string nor an object")
    return {"type": "function", "function": {"name": action["name"], "arguments": _args_text(args)}}


def action_to_message(action: Any, extra: dict[str, Any] | None = None) -> Message:
    """NeMo-Gym's ExpectedAction (or a Responses `output` list: a whole model response) as the
    expert's assistant message; `extra` is what our own export recorded next to it."""
    where = "expected_action"
    if not isinstance(action, dict):
        raise ValueError(f"{where}: missing or not an object")
    kind = action.get("type")
    if kind is None and "name" in action:
        kind = "function_call"  # rows that name a call without the discriminator
    if kind is None and isinstance(action.get("output"), list):
        found = items_to_messages(action["output"], f"{where}.output")
        if len(found) != 1 or found[0].role != "assistant":
            raise ValueError(f"{where}.output: must form exactly one assistant message")
        return found[0]
    data: dict[str, Any] = {"role": "assistant"}
    if kind == "function_call":
        data["tool_calls"] = [_call(action, where)]
    elif kind == "function_call_batch":
        calls = action.get("calls")
        if not isinstance(calls, list) or not calls:
            raise ValueError(f"{where}.calls: missing or empty")
        data["tool_calls"] = [_call(c, f"{where}.calls[{i}]") for i, c in enumerate(calls)]
    elif kind == "message":
        if not isinstance(action.get("content"), str):
            raise ValueError(f"{where}.content: missing or not a string")
        data["content"] = action["content"]
    else:
        raise ValueError(f"{where}.type: unsupported action type {kind!r}")
    extra = dict(extra or {})
    ids = extra.pop("call_ids", None)
    objects = extra.pop(OBJECT_ARGUMENTS, None)
    for j, call in enumerate(data.get("tool_calls", [])):
        given = ids[j] if isinstance(ids, list) and j < len(ids) else None
        call["id"] = given if isinstance(given, str) else f"call_{j}"
    return _restore_objects(Message.model_validate({**extra, **data, **({"content": extra["content"]}
                                                                        if "content" in extra else {})}),
                            objects)


def _context(params: dict[str, Any], infer_names: bool) -> list[Message]:
    items = params.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise ValueError("responses_create_params.input: missing or not a list")
    context = items_to_messages(items, "responses_create_params.input", infer_names=infer_names)
    instructions = params.get("instructions")
    if isinstance(instructions, str) and instructions:
        # The Responses API puts `instructions` before the input as a system message.
        context.insert(0, Message(role="system", content=instructions))
    return context


def _foreign(row: dict[str, Any], params: dict[str, Any], action: dict[str, Any]) -> dict[str, Any]:
    """The fields of a row NeMo-Gym wrote that a Turn has no place for (written back on export)."""
    gym: dict[str, Any] = {}
    kept = {k: v for k, v in params.items() if k not in _PARAM_KEYS and v is not None}
    if kept:
        gym["responses_create_params"] = kept
    if isinstance(row.get("agent_ref"), dict):
        gym["agent_ref"] = row["agent_ref"]
    rest = {k: v for k, v in row.items() if k not in _ROW_KEYS}
    if rest:
        gym["row"] = rest
    if action.get("type") == "function_call_batch":
        flags = {k: v for k, v in action.items() if k not in ("type", "calls")}
        if flags:
            gym["expected_action"] = flags
    return gym


def row_position(row: dict[str, Any]) -> tuple[str | None, int | None]:
    """The row's own trajectory id and assistant ordinal (0-based: `meta_info.assistant_depth`,
    else `info.depth`), where it names them; NeMo-Gym's own rows name neither. A row with no
    trajectory id but a `metadata.instance_id` (SWE pivots: the task it was cut from) takes the
    instance as its trajectory: pivots of one task then stay on one side of a split, which can
    only keep more together than the trajectories would."""
    traj = row.get("trajectory_id")
    if traj is None and isinstance(row.get("metadata"), dict):
        traj = row["metadata"].get("instance_id")
    traj_id = str(traj) if isinstance(traj, (str, int)) and not isinstance(traj, bool) and str(traj) else None
    depth = None
    for key, field in (("meta_info", "assistant_depth"), ("info", "depth")):
        block = row.get(key)
        value = block.get(field) if isinstance(block, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            depth = value
            break
    return traj_id, depth


def nemo_gym_to_turn(row: dict[str, Any], fallback_id: str | None = None) -> Turn:
    """A NeMo-Gym row back to a Turn (raises ValueError naming the field). The Turn id is the
    row's `id`, else its `uuid`, else `fallback_id` (e.g. file:line)."""
    params = row.get("responses_create_params")
    if not isinstance(params, dict):
        raise ValueError("responses_create_params: missing or not an object")
    meta = row.get("metadata") if isinstance(row.get("metadata"), dict) else {}
    ours = "turn_metadata" in meta  # written by turn_to_nemo_gym: extras are recorded
    context = _context(params, infer_names=not ours)
    action = row.get("expected_action")
    expected = action_to_message(action, meta.get("expected_extra") if ours else None)
    message_extra = meta.get("message_extra") if ours else None
    for i, extra in (message_extra.items() if isinstance(message_extra, dict) else ()):
        if str(i).isdigit() and int(i) < len(context) and isinstance(extra, dict):
            extra = dict(extra)
            objects = extra.pop(OBJECT_ARGUMENTS, None)
            context[int(i)] = _restore_objects(Message.model_validate(
                {**context[int(i)].model_dump(exclude_none=True), **extra}), objects)
    tools = params.get("tools") or []
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ValueError("responses_create_params.tools: not a list of objects")
    row_id = str(row.get("id") or row.get("uuid") or meta.get("id") or fallback_id or "")
    if not row_id:
        raise ValueError("id: missing (no id or uuid)")
    if ours:
        turn_meta = dict(meta.get("turn_metadata") or {})
        trajectory_id = str(meta.get("trajectory_id") or row_id)
        turn_index, domain = meta.get("turn", len(context)), meta.get("domain")
    else:
        turn_meta = dict(meta)
        # A published pivot set's own trajectory id and ordinal keep its pivots of one
        # trajectory together (a split is drawn by trajectory); without them, each row is its own.
        own_trajectory, own_turn = row_position(row)
        trajectory_id = own_trajectory or row_id
        turn_index = own_turn if own_turn is not None else len(context)
        domain = meta.get("domain")
    # Our own rows carry an imported row's fields inside turn_metadata already.
    if not ours and (gym := _foreign(row, params, action)):
        turn_meta["nemo_gym"] = gym
    return Turn.model_validate({
        **(meta["turn_extra"] if ours and isinstance(meta.get("turn_extra"), dict) else {}),
        "id": row_id, "trajectory_id": trajectory_id,
        "turn": turn_index if isinstance(turn_index, int) else len(context),
        "domain": domain if isinstance(domain, str) else None,
        "tools": [tool_from_responses(t) for t in tools],
        "context": [m.model_dump(exclude_none=True) for m in context],
        "expected": expected.model_dump(exclude_none=True),
        "metadata": turn_meta,
    })


def row_problem(turn: Turn, parallel_calls: str = "batch") -> tuple[str, str] | None:
    """Why NeMo-Gym would refuse the row of `turn` (field, reason), or None."""
    if not turn.context:
        return "context", "empty context (NeMo-Gym needs a non-empty responses_create_params.input)"
    if turn.metadata.get(ACTION_FORMAT_KEY) == TERMINUS_2:
        # As a message row, the argument-comparison server would pay any chat message.
        return f"metadata.{ACTION_FORMAT_KEY}", ("a Terminus-2 action: the argument-comparison "
                                                 "server would score it as a chat message "
                                                 "(any message scores 1); no row is written")
    calls = turn.expected.tool_calls or []
    if len(calls) > 1 and parallel_calls == "reject":
        return "expected.tool_calls", (f"{len(calls)} parallel tool calls (--parallel-calls reject; "
                                       "NeMo-Gym's single-call rows hold one call)")
    if not calls and not message_text(turn.expected).strip():
        return "expected.content", "expected message has no text"
    return None


def missing_tools(turn: Turn) -> list[str]:
    """Expected call names absent from the Turn's tools (NeMo-Gym's validator flags them)."""
    names = {t.get("function", {}).get("name") if t.get("type") == "function" else t.get("name")
             for t in turn.tools if isinstance(t, dict)}
    return [c.function.name for c in turn.expected.tool_calls or [] if c.function.name not in names]
