"""BFCL's executable backends as a pivotrl World (`make_world("bfcl")`).

`reset(world_config)` builds fresh backend instances (GorillaFileSystem, TradingBot, …) from a
task's `initial_config` exactly as BFCL's `execute_multi_turn_func_call` does (class(), then
`_load_scenario(deepcopy(config), long_context=…)`), but owns them itself instead of BFCL's
module-global cache, so two worlds never share state and nothing leaks.

`execute(name, arguments)` mirrors BFCL's executor: the same method lookup (public methods of
the involved instances, later classes winning), the same forbidden names, the same result
strings (str as is, dict as `json.dumps`, anything else `str()`), errors as
`"Error during execution: …"`. It never `eval`s model text: a name that is not a backend method
gives the NameError text BFCL's `eval` would give for an unknown name (BFCL would evaluate a
Python builtin of that name; we never run one).

Turns: BFCL checks state and responses after every user turn. An episode runner that drives
several user turns calls `begin_turn()` before each user message; `success` then runs BFCL's own
`multi_turn_checker` on the calls made per turn (on the first n ground-truth turns when only n
turns were played). Without `begin_turn()` all calls count as one turn and `success` checks the
same two things once, at the end: the state equals the state after the whole ground truth, and
every ground-truth execution result appears among the model's results.
"""

from __future__ import annotations

import copy
import inspect
import json
import keyword
import re
from typing import Any

from pivotrl_testbed.bfcl import (backend_class, call_string, forget_instances, fresh_model_name,
                               is_long_context, parse_call)
from pivotrl.verifiers.world import register_world

# BFCL refuses these names before evaluating a call (multi_turn_utils.execute_multi_turn_func_call).
FORBIDDEN = ("kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _is_ident(name: str) -> bool:
    return bool(_IDENT.match(name)) and not keyword.iskeyword(name)


def jsonable(value: Any, _path: tuple[int, ...] = ()) -> Any:
    """A JSON-able picture of backend state: public attributes of objects (as BFCL's
    state_checker compares them), sets sorted, back-references (Directory.parent) cut."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if id(value) in _path:
        return {"__ref__": type(value).__name__}
    path = _path + (id(value),)
    if isinstance(value, dict):
        return {str(k): jsonable(v, path) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, path) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((jsonable(v, path) for v in value), key=lambda x: json.dumps(x, sort_keys=True))
    if hasattr(value, "__dict__"):
        return {"__class__": type(value).__name__,
                **{k: jsonable(v, path) for k, v in vars(value).items() if not k.startswith("_")}}
    return repr(value)


def build_instances(config: dict[str, Any]) -> dict[str, Any]:
    """Fresh backend instances for a task (BFCL's construction, without its global cache)."""
    from bfcl_eval.constants.executable_backend_config import STATELESS_CLASSES

    long_context = config.get("long_context", is_long_context(str(config.get("id", ""))))
    instances = {}
    for class_name in config.get("involved_classes", []):
        instance = backend_class(class_name)()
        if class_name not in STATELESS_CLASSES:
            scenario = copy.deepcopy(config.get("initial_config", {}).get(class_name, {}))
            instance._load_scenario(scenario, long_context=long_context)
        instances[class_name] = instance
    return instances


def stringify(result: Any) -> str:
    """BFCL's conversion of a backend's return value to the observation string."""
    if type(result) is str:
        return result
    if type(result) is dict:
        try:
            return json.dumps(result)
        except Exception:
            return str(result)
    return str(result)


def method_table(instances: dict[str, Any]) -> dict[str, Any]:
    """Public method name → bound method, later classes winning (BFCL's mapping)."""
    methods: dict[str, Any] = {}
    for instance in instances.values():
        for method_name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
            if not method_name.startswith("_"):
                methods[method_name] = method
    return methods


def execute_on(methods: dict[str, Any], name: str, arguments: dict[str, Any]) -> str:
    """One call on live instances (`method_table`), with BFCL's observation strings."""
    if not isinstance(name, str):
        return f"Error during execution: function name must be a string, got {type(name).__name__}"
    if name in FORBIDDEN:
        return f"Error during execution: Function call {name} is not allowed."
    if not isinstance(arguments, dict):
        return f"Error during execution: arguments must be an object, got {type(arguments).__name__}"
    try:
        # BFCL evaluates the call as text; text that is not Python fails with the SyntaxError
        # its eval would raise (compiled only, never run).
        compile(call_string(name, arguments), "<string>", "eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return f"Error during execution: {exc}"
    if name not in methods:
        return f"Error during execution: name '{name}' is not defined"
    try:
        return stringify(methods[name](**copy.deepcopy(arguments)))
    except Exception as exc:  # errors are observations, as in BFCL
        return f"Error during execution: {exc}"


def _safe_call(name: str, arguments: Any) -> str | None:
    """The call as BFCL-format text when it is safe to hand to BFCL's checker (which evals it)."""
    if not isinstance(name, str) or not _is_ident(name) or not isinstance(arguments, dict):
        return None
    if not all(isinstance(k, str) and _is_ident(k) for k in arguments):
        return None
    try:
        text = call_string(name, arguments)
        compile(text, "<string>", "eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return text


class BfclWorld:
    """One live copy of a BFCL task's backends (see the module doc)."""

    name = "bfcl"

    def __init__(self) -> None:
        self.config: dict[str, Any] = {}
        self.instances: dict[str, Any] = {}
        self.methods: dict[str, Any] = {}
        self.turns: list[list[tuple[str | None, str]]] = []  # per turn: (call text, observation)
        self._turns_marked = False

    def reset(self, config: dict[str, Any]) -> None:
        self.config = copy.deepcopy(config)
        self.instances = build_instances(self.config)
        self.methods = method_table(self.instances)
        self.turns = []
        self._turns_marked = False

    def begin_turn(self) -> None:
        """Mark the start of a user turn (call before delivering each user message)."""
        self._turns_marked = True
        self.turns.append([])

    def execute(self, name: str, arguments: dict[str, Any]) -> str:
        if not self.turns:
            self.turns.append([])
        observation = execute_on(self.methods, name, arguments)
        ok = isinstance(name, str) and name in self.methods and name not in FORBIDDEN
        self.turns[-1].append((_safe_call(name, arguments) if ok else None, observation))
        return observation

    def snapshot(self) -> dict[str, Any]:
        return {name: {k: jsonable(v) for k, v in vars(inst).items() if not k.startswith("_")}
                for name, inst in self.instances.items()}

    def success(self, goal: dict[str, Any], final_message: str | None = None) -> bool:
        ground_truth: list[list[str]] = goal.get("ground_truth", [])
        if self._turns_marked:
            return self._checker(ground_truth)
        return self._final_state_check(ground_truth)

    def _checker(self, ground_truth: list[list[str]]) -> bool:
        """BFCL's multi_turn_checker on the turns played so far."""
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

        if len(self.turns) > len(ground_truth):
            return False  # BFCL fails a result whose turn count differs
        n = len(self.turns)
        # Calls that are not safe to eval (not a backend method, odd keys) only ever produced
        # an error observation; leaving them out changes no state.
        decoded = [[[text] for text, _ in turn if text is not None] for turn in self.turns]
        entry = {"id": self.config.get("id", "bfcl_task"),
                 "initial_config": self.config.get("initial_config", {}),
                 "involved_classes": self.config.get("involved_classes", [])}
        if self.config.get("long_context"):
            entry["id"] = "multi_turn_long_context_" + entry["id"].rsplit("_", 1)[-1]
        model_name = fresh_model_name("pivotrl_world")
        try:
            result = multi_turn_checker(decoded, ground_truth[:n], entry, "", model_name)
        except Exception:
            return False
        finally:
            forget_instances(model_name)
        return bool(result.get("valid"))

    def _final_state_check(self, ground_truth: list[list[str]]) -> bool:
        expected = BfclWorld()
        expected.reset(self.config)
        expected_results: list[str] = []
        for turn in ground_truth:
            for call in turn:
                name, args = parse_call(call, self.config.get("involved_classes", []))
                expected_results.append(expected.execute(name, args))
        if self.snapshot() != expected.snapshot():
            return False
        got = [obs for turn in self.turns for _, obs in turn]
        for item in expected_results:
            if item not in got:
                return False
            got.remove(item)
        return True


register_world("bfcl", BfclWorld)
