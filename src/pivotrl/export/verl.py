"""Turns -> verl parquet, plus the tool config YAML verl's agent loops read the tools from.

Columns (verl's RL dataset): `data_source` (the domain), `prompt` (the context as `{role,
content}` chat messages; assistant tool calls rendered as the Hermes text training parses, see
`pivotrl.formats.actions.render_action`), `ability`, `reward_model` = `{"style": "rule", "ground_truth":
JSON of the expert message}`, `extra_info` = `{index, id, trajectory_id, turn, domain, tools,
context, expected, metadata}` (structured parts as JSON strings: Arrow would otherwise merge
differently-keyed dicts and fill holes with nulls), and `agent_name` (the agent loop verl runs
for the row; a pivot is one action, so `single_turn_agent` by default).

verl's agent loops take tool schemas from one YAML file only (`data.tool_config_path` for
`single_turn_agent`, `actor_rollout_ref.rollout.multi_turn.tool_config_path` for `tool_agent`),
never from a row, so the export writes `<out stem>.tool_config.yaml` next to the parquet with
every tool the rows use (each as verl's `BaseTool`, whose schema is all the chat template needs).
When rows have different tool sets, verl shows the union to every row: the summary says so.

Back (`verl_to_turn`, `pivotrl import verl`): a row's Turn is rebuilt from `extra_info` (our own
rows) or, in rows other tools wrote, from `prompt` (the context) and `reward_model.ground_truth`
(the JSON of the expert's assistant message: a row whose ground truth is something else, such as a
math answer, has no expert action to learn from and is rejected, naming the field).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pivotrl.io.records import (
    Message,
    Turn,
    message_text,
    sidecar_path,
    write_text_atomic,
)

DEFAULT_AGENT_LOOP = "single_turn_agent"
# verl's tool registry imports this class by name; BaseTool carries a schema and executes nothing.
VERL_TOOL_CLASS = "verl.tools.base_tool.BaseTool"


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
        ("agent_name", pa.string()),
    ])


def _chat(message: Message) -> dict[str, Any]:
    return message.model_dump(mode="json", exclude_none=True)


def turn_to_verl(turn: Turn, index: int, ability: str = "agent",
                 agent_name: str = DEFAULT_AGENT_LOOP) -> dict[str, Any]:
    from pivotrl.formats.actions import render_action

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
        "agent_name": agent_name,
    }


def tool_config_path(out: str | Path) -> Path:
    """`train.parquet` -> `train.tool_config.yaml`, next to it."""
    return sidecar_path(out, ".tool_config.yaml", ".parquet")


def verl_tool_problems(tool: dict[str, Any]) -> list[str]:
    """What verl's OpenAIFunctionToolSchema would refuse or drop in `tool` (its parameters are
    one flat level of typed properties; nested keys such as `items` are dropped silently)."""
    fn = tool.get("function") if isinstance(tool, dict) else None
    if tool.get("type") != "function" or not isinstance(fn, dict) or not fn.get("name"):
        return ["not a function tool with a name"]
    problems = []
    props = (fn.get("parameters") or {}).get("properties") or {}
    for key, prop in props.items() if isinstance(props, dict) else ():
        if not isinstance(prop, dict) or not isinstance(prop.get("type"), str):
            problems.append(f"property {key!r} has no single string type")
        elif prop.get("enum") is not None and not all(isinstance(v, str) for v in prop["enum"]):
            problems.append(f"property {key!r} has a non-string enum")
        elif set(prop) - {"type", "description", "enum"}:
            problems.append(f"property {key!r}: verl keeps only type/description/enum "
                            f"(drops {sorted(set(prop) - {'type', 'description', 'enum'})})")
    return problems


class ToolUnion:
    """The tools of all rows by name, for verl's one tool config (first definition wins)."""

    def __init__(self) -> None:
        self.tools: dict[str, dict[str, Any]] = {}
        self.tool_sets: set[tuple[str, ...]] = set()
        self.conflicts: set[str] = set()

    def add(self, turn: Turn) -> None:
        names = []
        for tool in turn.tools:
            fn = tool.get("function") if isinstance(tool, dict) else None
            name = fn.get("name") if isinstance(fn, dict) else None
            if not isinstance(name, str):
                continue
            names.append(name)
            if name not in self.tools:
                self.tools[name] = tool
            elif self.tools[name] != tool:
                self.conflicts.add(name)
        self.tool_sets.add(tuple(sorted(names)))

    def config(self) -> dict[str, Any]:
        entries = []
        for tool in self.tools.values():
            fn = dict(tool["function"])
            fn.setdefault("description", "")  # verl's schema requires one
            params = dict(fn.get("parameters") or {"type": "object", "properties": {}})
            params.setdefault("type", "object")
            params.setdefault("properties", {})
            params.setdefault("required", [])
            fn["parameters"] = params
            entries.append({"class_name": VERL_TOOL_CLASS, "config": {"type": "native"},
                            "tool_schema": {"type": "function", "function": fn}})
        return {"tools": entries}

    def warnings(self) -> list[str]:
        out = []
        if len(self.tool_sets) > 1:
            out.append(f"rows have {len(self.tool_sets)} different tool sets; verl shows all "
                       f"{len(self.tools)} tools of the tool config to every row")
        if self.conflicts:
            out.append(f"{_tools(sorted(self.conflicts))} defined differently by different rows; the "
                       "tool config keeps the first definition")
        # One line a problem, naming the tools that have it: forty tools with one kind of schema
        # are one thing to fix, not forty lines to read.
        having: dict[str, list[str]] = {}
        for name, tool in self.tools.items():
            for problem in verl_tool_problems(tool):
                having.setdefault(problem, []).append(name)
        out += [f"{_tools(names)}: {problem}" for problem, names in having.items()]
        return out


def _tools(names: list[str], shown: int = 3) -> str:
    if len(names) == 1:
        return f"tool {names[0]!r}"
    more = f", … ({len(names) - shown} more)" if len(names) > shown else ""
    return f"{len(names)} tools ({', '.join(repr(n) for n in names[:shown])}{more})"


def write_tool_config(path: Path, union: ToolUnion) -> None:
    import yaml

    header = ("# verl tool config written by `pivotrl export --format verl`: the tools of the rows\n"
              "# of the parquet next to it. Point data.tool_config_path (single_turn_agent) or\n"
              "# actor_rollout_ref.rollout.multi_turn.tool_config_path (tool_agent) at this file.\n")
    write_text_atomic(path, header + yaml.safe_dump(union.config(), sort_keys=False,
                                                    allow_unicode=True))


def _json_field(info: dict[str, Any], key: str, default: Any) -> Any:
    value = info.get(key)
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            raise ValueError(f"extra_info.{key}: not JSON") from None
    return default if value is None else value


def verl_to_turn(row: dict[str, Any], fallback_id: str = "verl") -> Turn:
    """A verl row back to the Turn it holds (raises ValueError naming the field). Context, tools,
    turn and metadata come from `extra_info` when it has them (rows we wrote), else the context is
    `prompt`; the expert message is `reward_model.ground_truth`, else `extra_info.expected`."""
    info = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
    reward_model = row.get("reward_model") if isinstance(row.get("reward_model"), dict) else {}
    truth = reward_model.get("ground_truth")
    try:
        expected = json.loads(truth) if isinstance(truth, str) and truth else truth
    except ValueError:
        expected = None
    if not isinstance(expected, dict) or "role" not in expected:
        expected = _json_field(info, "expected", None)
    if not isinstance(expected, dict):
        raise ValueError("reward_model.ground_truth: not the JSON of the expert's assistant message "
                         "(rows written by `pivotrl export --format verl` hold it)")
    context = _json_field(info, "context", None)
    if context is None:
        context = row.get("prompt")
    if not isinstance(context, list):
        raise ValueError("prompt: missing or not a list of messages")
    row_id = str(info.get("id") or fallback_id)
    turn = info.get("turn")
    if not isinstance(turn, int) or isinstance(turn, bool):
        turn = sum(isinstance(m, dict) and m.get("role") == "assistant" for m in context)
    domain = info.get("domain") or (row.get("data_source") if row.get("data_source") != "pivotrl" else None)
    return Turn.model_validate({
        "id": row_id, "trajectory_id": str(info.get("trajectory_id") or row_id), "turn": turn,
        "domain": domain if isinstance(domain, str) and domain else None,
        "tools": _json_field(info, "tools", []), "context": context, "expected": expected,
        "metadata": _json_field(info, "metadata", {}),
    })
