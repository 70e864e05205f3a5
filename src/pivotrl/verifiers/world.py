"""The protocol every executable environment implements: the testbed worlds, BFCL's backends.

The `state` verifier, the episode runner and end-to-end RL only speak this protocol, so a new
environment plugs in by implementing four methods and registering a factory.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

from pivotrl.io.records import Turn


class World(Protocol):
    """One live copy of an environment. Each instance owns its state: never share between samples."""

    name: str

    def reset(self, config: dict[str, Any]) -> None:
        """Start from a task's initial configuration (`Trajectory.metadata["world_config"]`)."""

    def execute(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one tool call and return the observation the agent sees (a string; errors are
        observations too, never exceptions)."""

    def snapshot(self) -> Any:
        """A JSON-able, comparable picture of the state (two worlds are equal iff snapshots are)."""

    def success(self, goal: dict[str, Any], final_message: str | None) -> bool:
        """Whether the task's goal is met now (`Trajectory.metadata["goal"]`)."""

    # Optional: `canonical_call(self, name, arguments) -> dict | None`, the arguments exactly as
    # this world would execute them (defaults filled, values folded where the world folds them:
    # "2" -> 2, "Rome" -> "rome"), or None when the world would reject the call or has no rule
    # for it. It must not depend on the state. Verifiers treat two calls of a tool as the same
    # action when their canonical forms are equal (`action_rule`).
    #
    # Optional: `perturb(self, probe: int, seed: str, keep: str, extra: str = "") -> bool`, for
    # worlds whose actions are programs (a shell): change the state in place the way probe number
    # `probe` does (`pivotrl.verifiers.probes`; its markers drawn from `seed`; no name that occurs
    # in `keep`, the expert's action, is renamed; lines around its literals and, for
    # `probes.CANDIDATE_PROBE`, around those of `extra`, a candidate's action), and run later
    # calls in the probe's environment (`probes.probe_environment`); False when there is no such
    # probe. The `state` verifier then judges a call by behaviour on every perturbed copy too.
    #
    # Optional: `canonical_message(self, text) -> Any | None`, a final answer as this world reads
    # it, in the state the world is in (the state at the turn: `world_at_turn`): the answer's
    # family and the facts it states, where a fact the state confirms may be left out (so "Done,
    # see out.txt." and "Saved the first 3 lines to out.txt." read the same when out.txt holds 3
    # lines) and a fact the state contradicts stays in (so it never reads as a true answer); or
    # None when the text is not one of the answers the world knows. Two answers with equal forms
    # are the same answer (`same_answer`).
    #
    # Optional: `fork(self) -> World`, an independent copy in the same state (cheaper than a
    # reset and a replay of the context, for worlds whose replay runs programs).
    #
    # Optional: a class attribute `concurrent = True`, for worlds whose calls wait on programs
    # (a sandboxed shell) and whose instances share no unlocked state: verifiers and the episode
    # runner then drive several instances from threads at once, overlapping the waits
    # (`concurrent_world`). Pure-Python worlds gain nothing from threads and leave it unset.


WorldFactory = Callable[[], World]
_REGISTRY: dict[str, WorldFactory] = {}


def register_world(name: str, factory: WorldFactory) -> None:
    _REGISTRY[name] = factory


def make_world(name: str) -> World:
    if name not in _REGISTRY:
        _load_entry_point(name)
    try:
        return _REGISTRY[name]()
    except KeyError:
        raise KeyError(f"unknown world {name!r}; known: {', '.join(sorted(_REGISTRY)) or 'none'} "
                       "(a package registers a world with register_world() or an entry point in "
                       "the 'pivotrl.worlds' group)") from None


def _load_entry_point(name: str) -> None:
    """Worlds defined by installed packages (the testbed's and BFCL's included) are found through
    the 'pivotrl.worlds' entry-point group, so the core never names the modules that define them."""
    from importlib.metadata import entry_points

    for ep in entry_points(group="pivotrl.worlds", name=name):
        try:
            register_world(name, ep.load())
        except ImportError:  # an optional extra (e.g. BFCL) that is not installed
            pass


ActionRule = Callable[[str, dict[str, Any]], "dict[str, Any] | None"]
_RULES: dict[str, ActionRule | None] = {}


def action_rule(name: str | None) -> ActionRule | None:
    """The world's own `canonical_call`, or None when the world is unknown or defines none.
    Cached per name: verifiers ask for every sample."""
    if not name:
        return None
    if name not in _RULES:
        try:
            world = make_world(name)
        except Exception:  # noqa: BLE001  (an unknown or broken world has no rule to offer)
            world = None
        rule = getattr(world, "canonical_call", None)
        _RULES[name] = rule if callable(rule) else None
    return _RULES[name]


def keep_lru(cache: OrderedDict, key: Any, value: Any, limit: int) -> None:
    """Store in an LRU dict and drop the oldest entries past `limit` (the caller holds the lock)."""
    cache[key] = value
    while len(cache) > limit:
        cache.popitem(last=False)


_ANSWER_WORLDS: OrderedDict[str, Any] = OrderedDict()  # turn key -> world at the turn (or None)
_ANSWER_LOCK = threading.Lock()
_ANSWER_CACHE = 64  # worlds at a turn kept for answers (a terminal world holds a workspace)


def same_answer(turn: Turn, expected: str, candidate: str) -> bool | None:
    """The world's ruling on two final answers at `turn`: True when its `canonical_message`
    reads both as the same answer, False when it reads both and they differ, None when the
    world has no rule or cannot read one of them (another rule decides then: a paraphrase the
    world does not know is not a wrong answer by itself)."""
    name = (turn.metadata or {}).get("world")
    if not name or not callable(getattr(_world_type(name), "canonical_message", None)):
        return None
    world = _answer_world(turn)
    if world is None:
        return None
    try:
        exp, cand = world.canonical_message(expected), world.canonical_message(candidate)
    except Exception:  # noqa: BLE001  (a world's rule failing on hostile text is no ruling)
        return None
    if exp is None or cand is None:
        return None
    return exp == cand


_TYPES: dict[str, Any] = {}


def concurrent_world(name: str | None) -> bool:
    """Whether world `name` declares that its instances may run in threads at once."""
    return bool(name) and bool(getattr(_world_type(name), "concurrent", False))


def _world_type(name: str) -> Any:
    if name not in _TYPES:
        try:
            _TYPES[name] = type(make_world(name))
        except Exception:  # noqa: BLE001
            _TYPES[name] = None
    return _TYPES[name]


def _answer_world(turn: Turn) -> Any:
    """The world at `turn`, built once per turn (K samples of a final message share it)."""
    import hashlib
    import json

    body = json.dumps([turn.metadata.get("world"), turn.metadata.get("world_config"),
                       [m.model_dump(mode="json", exclude_none=True) for m in turn.context]],
                      sort_keys=True, default=str)
    key = hashlib.sha256(body.encode()).hexdigest()
    with _ANSWER_LOCK:
        if key in _ANSWER_WORLDS:
            _ANSWER_WORLDS.move_to_end(key)
            return _ANSWER_WORLDS[key]
    try:
        world = world_at_turn(turn)
    except Exception:  # noqa: BLE001  (a broken config or replay: no ruling)
        world = None
    with _ANSWER_LOCK:
        keep_lru(_ANSWER_WORLDS, key, world, _ANSWER_CACHE)
    return world


def world_at_turn(turn: Turn) -> World:
    """A fresh world in the state the expert saw at `turn`: reset to the task's config, then
    replay every tool call of the context in order (the observations are recomputed, so the
    world must be deterministic)."""
    world = make_world(turn.metadata.get("world") or turn.domain or "")
    world.reset(turn.metadata.get("world_config", {}))
    for msg in turn.context:
        for call in msg.tool_calls or []:
            world.execute(call.function.name, call.args())
    return world
