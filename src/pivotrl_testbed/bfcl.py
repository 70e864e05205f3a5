"""BFCL multi-turn ground truth as Trajectory records (`pivotrl data bfcl`).

The Berkeley Function Calling Leaderboard package (`bfcl-eval==2026.3.23`) ships 4 × 200
multi-turn tasks: user turns, per-turn ground-truth calls written as Python call strings
(`"cd(folder='document')"`), an `initial_config` for its executable backends
(GorillaFileSystem, TradingBot, TravelAPI, …) and function docs. We turn each task into one
expert trajectory:

    [user turn 0] [assistant: 1 call] [tool: result] … [assistant: short summary text]
    [user turn 1] …

- One assistant message per ground-truth call (BFCL's ground truth does not say which calls
  were parallel; sequential calls are always a valid reading, and later calls may depend on
  earlier results, e.g. `cd` then `ls`).
- Tool messages hold what BFCL's own `execute_multi_turn_func_call` returned when the ground
  truth was executed, in order, from the task's `initial_config` (the exact strings the
  checker compares).
- Every user turn ends with an assistant text message, so each BFCL turn is a complete chat
  turn (BFCL moves on when the model stops calling tools). Turns whose ground truth is empty
  (the function or a parameter is missing on purpose) get only that text: the expert says why
  it cannot act, which is what BFCL's irrelevance checker expects.
- No system message: BFCL's function-calling (FC) mode sends none for these categories; the
  tools go in `Trajectory.tools`.
- miss_func: BFCL removes the held-out functions from the tool list and, at the turn named in
  `missed_function` (whose question is empty), adds them back with the user message
  "I have updated some more functions you can choose from. What about now?". A Trajectory has
  one tool list, so `tools` holds the functions available from the start, and that user
  message carries the added schemas twice: in its text (BFCL's prompting-mode form,
  `"{functions}\\n" + prompt`) and in an extra `tools` field (OpenAI schemas) that a
  tool-aware renderer may merge into the tool list from that message on.
- `excluded_function` (18 tasks per category) is not used by BFCL 2026.3.23's inference or
  checker; we mirror that and only keep it in metadata.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
import os
import sys
import time
import types
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from pivotrl.io.records import FunctionCall, Message, ToolCall, Trajectory, read_jsonl, write_atomic

CATEGORIES = ("base", "miss_func", "miss_param", "long_context")

# BFCL's own constants (bfcl_eval/constants/default_prompts.py), copied so that building the
# records needs no import of BFCL's inference side.
ADDITIONAL_FUNCTION_PROMPT = "I have updated some more functions you can choose from. What about now?"

# Gorilla types → JSON schema types (BFCL's GORILLA_TO_OPENAPI, except that `any` means
# "no constraint" in JSON schema rather than BFCL's "string").
TYPE_MAP = {"dict": "object", "object": "object", "float": "number", "number": "number",
            "double": "number", "integer": "integer", "int": "integer", "long": "integer",
            "string": "string", "str": "string", "char": "string", "boolean": "boolean",
            "bool": "boolean", "array": "array", "list": "array", "tuple": "array", "any": None}

CLOSING_TEXT = {
    # What the expert says when the turn's ground truth is empty, by category.
    "miss_func": "None of the functions I have can do this, so I cannot complete this request "
                 "yet.",
    "miss_param": "I need more information to do this: a required detail is missing. Could you "
                  "tell me?",
    "base": "I cannot do this with the functions I have.",
}


# ---------------------------------------------------------------- importing BFCL


def install_model_config_stub(underscore_to_dot: bool = False) -> None:
    """Let `bfcl_eval`'s checkers import without its ~15 provider SDKs.

    `bfcl_eval.constants.model_config` imports every model handler (anthropic, openai, google,
    …) only to build `MODEL_CONFIG_MAPPING`; the checkers read one flag from it
    (`underscore_to_dot`, whether a model's function names had '.' replaced by '_'). Call this
    before importing `bfcl_eval.eval_checker.ast_eval.ast_checker` (the multi-turn checker
    does not need it). Every model name then maps to a config with the given flag. A no-op if
    the real module (or a stub) is already imported.
    """
    name = "bfcl_eval.constants.model_config"
    if name in sys.modules:
        return
    from dataclasses import dataclass as _dataclass

    flag = underscore_to_dot  # a class body cannot read a name it assigns from the closure

    @_dataclass
    class ModelConfig:  # same fields as BFCL's
        model_name: str = "stub"
        display_name: str = "stub"
        url: str = ""
        org: str = ""
        license: str = ""
        model_handler: str = ""
        input_price: float | None = None
        output_price: float | None = None
        is_fc_model: bool = True
        underscore_to_dot: bool = flag

    class _AnyModel(dict):
        def __missing__(self, key: str) -> ModelConfig:
            return ModelConfig(model_name=key, display_name=key)

    module = types.ModuleType(name, "pivotrl stand-in for bfcl_eval's model registry")
    module.ModelConfig = ModelConfig
    module.MODEL_CONFIG_MAPPING = _AnyModel()
    sys.modules[name] = module


def bfcl_root() -> Path:
    try:
        import bfcl_eval
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError("BFCL data needs `pip install --no-deps bfcl-eval==2026.3.23` "
                           "(pivotrl[bfcl])") from exc
    return Path(os.path.dirname(bfcl_eval.__file__))


def load_category(category: str) -> list[tuple[dict[str, Any], list[list[str]]]]:
    """(entry, ground truth per turn) for every task of a multi-turn category."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL category {category!r}; known: {', '.join(CATEGORIES)}")
    data = bfcl_root() / "data"
    entries = read_jsonl(data / f"BFCL_v4_multi_turn_{category}.json")
    answers = {a["id"]: a["ground_truth"] for a in
               read_jsonl(data / "possible_answer" / f"BFCL_v4_multi_turn_{category}.json")}
    return [(e, answers[e["id"]]) for e in entries]


@lru_cache(maxsize=None)
def _func_doc_file(class_name: str) -> tuple[dict[str, Any], ...]:
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    path = bfcl_root() / "data" / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]
    return tuple(read_jsonl(path))


def func_docs(involved_classes: list[str]) -> list[dict[str, Any]]:
    """BFCL function docs of a task, in BFCL's order (`populate_test_cases_with_predefined_functions`)."""
    return [copy.deepcopy(d) for c in involved_classes for d in _func_doc_file(c)]


@lru_cache(maxsize=None)
def backend_class(class_name: str) -> type:
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    return getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name]), class_name)


# ---------------------------------------------------------------- schemas and calls


def _schema(node: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "type":
            mapped = TYPE_MAP.get(value, "string") if isinstance(value, str) else value
            if mapped is not None:
                out["type"] = mapped
        elif key == "properties" and isinstance(value, dict):
            out["properties"] = {k: _schema(v) for k, v in value.items()}
        elif key == "items" and isinstance(value, dict):
            out["items"] = _schema(value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def to_openai_tool(doc: dict[str, Any]) -> dict[str, Any]:
    """A BFCL function doc as an OpenAI tool schema (the `response` doc is dropped)."""
    params = _schema(doc.get("parameters") or {"type": "dict", "properties": {}})
    params["type"] = "object"
    return {"type": "function", "function": {"name": doc["name"],
                                             "description": doc.get("description", ""),
                                             "parameters": params}}


def method_owner(involved_classes: list[str]) -> dict[str, str]:
    """Public method name → class, later classes winning, as BFCL's executor maps them."""
    owner: dict[str, str] = {}
    for class_name in involved_classes:
        for name, _ in inspect.getmembers(backend_class(class_name), predicate=inspect.isfunction):
            if not name.startswith("_"):
                owner[name] = class_name
    return owner


def parse_call(call: str, involved_classes: list[str]) -> tuple[str, dict[str, Any]]:
    """`"sort('final_report.pdf')"` → `("sort", {"file_name": "final_report.pdf"})`.

    Positional arguments are named from the backend method's Python signature.
    """
    node = ast.parse(call.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a plain function call: {call!r}")
    name = node.func.id
    kwargs: dict[str, Any] = {}
    if node.args:
        owner = method_owner(involved_classes).get(name)
        if owner is None:
            raise ValueError(f"positional arguments to unknown function {name!r}")
        params = [p for p in inspect.signature(getattr(backend_class(owner), name)).parameters
                  if p != "self"]
        for param, arg in zip(params, node.args):
            kwargs[param] = ast.literal_eval(arg)
    for kw in node.keywords:
        kwargs[kw.arg] = ast.literal_eval(kw.value)
    return name, kwargs


def call_string(name: str, arguments: dict[str, Any]) -> str:
    """A tool call in BFCL's decoded format, `name(key=value, …)` with Python literals."""
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"


def decode_turns(messages: list[Message]) -> list[list[list[str]]]:
    """A trajectory's assistant tool calls as BFCL's decoded model result: turn → step → calls.

    A turn starts at each user message; each assistant message with tool calls is one step.
    """
    turns: list[list[list[str]]] = []
    for msg in messages:
        if msg.role == "user":
            turns.append([])
        elif msg.role == "assistant" and msg.tool_calls and turns:
            turns[-1].append([call_string(c.function.name, c.args()) for c in msg.tool_calls])
    return turns


# ---------------------------------------------------------------- executing the ground truth


def _executor():
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    return multi_turn_utils


def fresh_model_name(prefix: str = "pivotrl") -> str:
    """BFCL caches backend instances in module globals keyed by model name + entry id: a fresh
    name per rollout gives fresh instances."""
    return f"{prefix}_{uuid.uuid4().hex}"


def forget_instances(model_name: str) -> None:
    """Drop BFCL's cached instances for a model name (they would otherwise live forever)."""
    module_globals = vars(_executor())
    for key in [k for k in module_globals if k.startswith(model_name)]:
        del module_globals[key]


def execute_ground_truth(entry: dict[str, Any], ground_truth: list[list[str]]) -> list[list[str]]:
    """Run every ground-truth call, one by one, with BFCL's executor; results per turn."""
    utils = _executor()
    model_name = fresh_model_name("pivotrl_data")
    long_context = is_long_context(entry["id"])
    results: list[list[str]] = []
    try:
        for turn in ground_truth:
            out: list[str] = []
            for call in turn:
                res, _ = utils.execute_multi_turn_func_call(
                    [call], entry["initial_config"], entry["involved_classes"], model_name,
                    entry["id"], long_context=long_context)
                out.extend(res)
            results.append(out)
    finally:
        forget_instances(model_name)
    return results


def is_long_context(entry_id: str) -> bool:
    category = entry_id.rsplit("_", 1)[0]
    return "long_context" in category or "composite" in category


# ---------------------------------------------------------------- building trajectories


def _closing_text(category: str, calls: list[tuple[str, dict[str, Any]]]) -> str:
    if not calls:
        return CLOSING_TEXT.get(category, CLOSING_TEXT["base"])
    names = list(dict.fromkeys(name for name, _ in calls))
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return f"Done: I used {listed}."


def build_trajectory(entry: dict[str, Any], ground_truth: list[list[str]],
                     category: str) -> Trajectory:
    """One BFCL task as an expert Trajectory (see the module doc for the choices)."""
    classes = entry["involved_classes"]
    missed = {int(t): names for t, names in (entry.get("missed_function") or {}).items()}
    held_out = {n for names in missed.values() for n in names}
    docs = func_docs(classes)
    tools = [to_openai_tool(d) for d in docs if d["name"] not in held_out]
    observations = execute_ground_truth(entry, ground_truth)

    messages: list[Message] = []
    for t, (question, calls_src) in enumerate(zip(entry["question"], ground_truth)):
        if t in missed:
            added_docs = [d for d in docs if d["name"] in missed[t]]
            messages.append(Message(
                role="user",
                content=json.dumps(added_docs, ensure_ascii=False) + "\n" + ADDITIONAL_FUNCTION_PROMPT,
                tools=[to_openai_tool(d) for d in added_docs]))
        for m in question:
            messages.append(Message(role=m["role"], content=m["content"]))
        calls = [parse_call(c, classes) for c in calls_src]
        for j, ((name, args), obs) in enumerate(zip(calls, observations[t])):
            call_id = f"call_{t}_{j}"
            messages.append(Message(role="assistant", tool_calls=[ToolCall(
                id=call_id, function=FunctionCall(name=name, arguments=json.dumps(args)))]))
            messages.append(Message(role="tool", tool_call_id=call_id, name=name, content=obs))
        messages.append(Message(role="assistant", content=_closing_text(category, calls)))

    world_config = {"id": entry["id"], "involved_classes": classes,
                    "initial_config": entry["initial_config"],
                    "long_context": is_long_context(entry["id"])}
    return Trajectory(
        id=entry["id"], messages=messages, tools=tools, domain=f"bfcl_{category}",
        metadata={"world": "bfcl", "world_config": world_config,
                  "goal": {"ground_truth": ground_truth}, "category": category,
                  "source": "bfcl-eval==2026.3.23", "path": entry.get("path", []),
                  "missed_function": {str(k): v for k, v in missed.items()},
                  "excluded_function": entry.get("excluded_function", [])})


@dataclass
class BfclSummary:
    trajectories: dict[str, int] = field(default_factory=dict)
    user_turns: dict[str, int] = field(default_factory=dict)
    assistant_turns: dict[str, int] = field(default_factory=dict)
    tool_calls: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def add(self, category: str, traj: Trajectory) -> None:
        for d in (self.trajectories, self.user_turns, self.assistant_turns, self.tool_calls):
            d.setdefault(category, 0)
        self.trajectories[category] += 1
        self.user_turns[category] += sum(m.role == "user" for m in traj.messages)
        self.assistant_turns[category] += sum(m.role == "assistant" for m in traj.messages)
        self.tool_calls[category] += sum(len(m.tool_calls or []) for m in traj.messages)

    def table(self):
        from rich.table import Table

        table = Table(title=f"BFCL multi-turn → trajectories ({self.seconds:.1f} s)")
        for col in ("category", "trajectories", "user turns", "assistant turns", "tool calls"):
            table.add_column(col, justify="right" if col != "category" else "left")
        rows = [(c, self.trajectories[c], self.user_turns[c], self.assistant_turns[c],
                 self.tool_calls[c]) for c in self.trajectories]
        for row in rows:
            table.add_row(*map(str, row))
        table.add_row("total", *(str(sum(r[i] for r in rows)) for i in range(1, 5)))
        return table


def iter_trajectories(categories: tuple[str, ...] | list[str] = CATEGORIES,
                      on_task: Callable[[str], None] | None = None) -> Iterator[Trajectory]:
    for category in categories:
        for entry, gt in load_category(category):
            yield build_trajectory(entry, gt, category)
            if on_task:
                on_task(category)


def write_bfcl(out: str | Path, categories: tuple[str, ...] | list[str] = CATEGORIES,
               on_task: Callable[[str], None] | None = None) -> BfclSummary:
    """Write all tasks of the given categories to `out` (atomically)."""
    summary = BfclSummary()
    start = time.perf_counter()

    def counted() -> Iterator[Trajectory]:
        for traj in iter_trajectories(categories, on_task):
            summary.add(traj.metadata["category"], traj)
            yield traj

    write_atomic(out, counted())
    summary.seconds = time.perf_counter() - start
    return summary


