"""The protocol every executable environment implements: the testbed worlds, BFCL's backends.

The `state` verifier, the episode runner and end-to-end RL only speak this protocol, so a new
environment plugs in by implementing four methods and registering a factory.
"""

from __future__ import annotations

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
    # Optional: `perturb(self, probe: int) -> bool`, for worlds whose actions are programs (a
    # shell): change the state's contents in place the way probe number `probe` does (every
    # honest read sees it; nothing a call names is renamed), False when there is no such probe.
    # The `state` verifier then judges a call by behaviour on the perturbed copies too.
    #
    # Optional: `fork(self) -> World`, an independent copy in the same state (cheaper than a
    # reset and a replay of the context, for worlds whose replay runs programs).


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
