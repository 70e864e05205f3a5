"""`state`: execution-based equivalence for tools that can be executed (any `World`).

The candidate earns 1 when executing its calls leaves the world in the same state and shows the
agent the same observations as executing the expert's calls:
- two fresh worlds, each built by `world_at_turn(turn)` (reset to the task's config + the
  context's calls replayed); every sample gets its own world, never shared (a world that can
  `fork()` is built once per turn and forked per sample: the same state without the replay);
- expert calls run on one, candidate calls on the other, in the order given;
- equal iff `snapshot()`s are equal AND the observations are equal as a multiset (parallel calls
  in another order read the same; a call that changes state shows in the snapshot anyway)
  AND the calls are the same *action* (`same_action`). Equal observations are not equal
  actions: a read for another customer can return the same `[]`, another tool the same error
  text, `echo 4` the same output as a count; paying those teaches the policy to be lucky.
  * Worlds whose actions are programs (a shell: `World.perturb`, see `pivotrl.verifiers.world`) judge them
    by behaviour: the calls must also agree with the expert's (changes and observations) on
    every perturbed copy of the world (`pivotrl.verifiers.probes`, seeded per turn from a secret
    of the process) that changes the expert's own outcome, so a call that only reproduces the
    expert's output without its reads and writes, or matches by luck, scores 0. A turn where no
    probe changes the expert's outcome is unverifiable (`unverifiable(turn)`): only the expert's
    own calls pay there, and `pivotrl.select` never keeps it.
  * Other worlds: the same functions with arguments equal under the world's own rule
    (`World.canonical_call`) or, for calls it has no rule for, the `toolcall` verifier's schema
    rules.
  Observations are compared as parsed JSON when they parse (key order, spacing), else as text
  with trailing whitespace dropped.
- call vs message: 0; message vs message: the `toolcall` verifier's message rule.
- an unknown world, or a world that fails while being rebuilt: Score(0, valid=False, reason);
  a world that raises on the candidate's call (the protocol says it should not): 0, with reason.
- the expert's outcome is cached per turn (id + content hash), K samples cost one expert run;
  a call action's verdict is cached per (turn, exact action): safe because the verdict is a
  function of the two (every sample runs on a fresh world rebuilt from the turn; the probes are
  seeded per turn), and GRPO meets the same action on the same pivot step after step (a quarter
  of a terminal run's first ten steps were repeats, more as the policy sharpens). A command
  whose effect is random is paid by luck either way; the cache only stops it drawing twice.
  A world that failed to rebuild is kept in neither cache: it need not fail again.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from pivotrl.io.records import Message, Turn
from pivotrl.sandbox.bwrap import BROKEN_ENVIRONMENT
from pivotrl.verifiers.base import Score, score_in_threads
from pivotrl.verifiers.literals import MAX_CANDIDATE_LITERALS, new_literals
from pivotrl.verifiers.probes import (CANDIDATE_PROBE, PROBES, UNVERIFIABLE, probe_seed,
                                     probes_to_compare, writes)
from pivotrl.verifiers.toolcall import ToolcallVerifier
from pivotrl.verifiers.world import concurrent_world, keep_lru, world_at_turn


class StateConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    compare_observations: bool = Field(
        True, description="Observations must be equal too (not only the final state): a read "
                          "call changes nothing, its observation is its effect.")
    ordered_observations: bool = Field(
        False, description="Compare observations as a sequence instead of a multiset.")
    message_rule: str = Field(
        "exact", description="Rule for message turns, passed to the toolcall verifier.")
    same_action: bool = Field(
        True, description="The candidate's calls must also be the expert's action (same functions, "
                          "arguments equal under the world's canonical_call or the toolcall "
                          "verifier's schema rules), not only produce the same state and "
                          "observations.")
    max_calls: int = Field(
        16, description="A candidate with more calls than this scores 0 (runaway output).")
    cache_turns: int = Field(4096, description="Turns whose expert outcome is kept (LRU).")
    cache_verdicts: int = Field(
        65536, description="(turn, call action) verdicts kept (LRU; 0: none): an action sampled "
                           "again on the same turn is not executed again.")
    cached_worlds: int = Field(
        64, description="Worlds at a turn kept for forking (worlds with fork(): one per turn and "
                        "probe, LRU; each may hold a workspace on disk).")
    workers: int = Field(
        4, description="Threads in score_batch, for batches whose worlds declare `concurrent` "
                       "(their calls wait on subprocesses, which threads overlap: the testbed's "
                       "terminal dev turns score 1.6x faster at 4 than at 1 on 2 cores). Every "
                       "sample gets its own world, so threads share only this verifier's locked "
                       "caches; other worlds are scored in one thread.")


def _numbers_by_value(obj: Any) -> Any:
    """3.0 -> 3 everywhere (a world that stored 3.0 holds what `==` calls the same value)."""
    if isinstance(obj, float) and obj.is_integer() and abs(obj) < 2**53:
        return int(obj)
    if isinstance(obj, dict):
        return {str(k): _numbers_by_value(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_numbers_by_value(v) for v in obj]
    return obj


def _dumps(value: Any) -> str:
    return json.dumps(_numbers_by_value(value), sort_keys=True, ensure_ascii=False,
                      separators=(",", ":"), default=str)


def canonical_observation(obs: Any) -> str:
    """Observations as comparable text: JSON re-serialised (sorted keys, numbers by value) when
    it parses, else the text with trailing whitespace dropped."""
    if not isinstance(obs, str):
        return _dumps(obs)
    try:
        value = json.loads(obs)
    except (ValueError, RecursionError):
        return "\n".join(line.rstrip() for line in obs.strip().splitlines())
    return _dumps(value)


def _canonical_snapshot(snap: Any) -> str:
    return _dumps(snap)


class StateVerifier:
    name = "state"

    def __init__(self, **config):
        self.config = StateConfig(**config)
        self._cache: OrderedDict[str, tuple[str, list[str]] | str] = OrderedDict()
        self._verdicts: OrderedDict[tuple[str, str], Score] = OrderedDict()
        self._probe_cache: OrderedDict[str, list[tuple[int, Any]]] = OrderedDict()
        self._literal_cache: OrderedDict[tuple[str, tuple], Any] = OrderedDict()
        self._bases: OrderedDict[tuple[str, int | None], Any] = OrderedDict()
        self._lock = threading.Lock()
        self._fallback = None

    def score(self, turn: Turn, action: Message | None) -> Score:
        if action is None:
            return Score(0.0, False, "unparseable action")
        exp_calls, cand_calls = turn.expected.tool_calls or [], action.tool_calls or []
        if exp_calls and not cand_calls:
            return Score(0.0, True, "a message where the expert called a tool")
        if cand_calls and not exp_calls:
            return Score(0.0, True, "a tool call where the expert sent a message")
        if not exp_calls:
            return self._toolcall().score(turn, action)
        if len(cand_calls) > self.config.max_calls:
            return Score(0.0, True, f"{len(cand_calls)} calls (max {self.config.max_calls})")
        if not self.config.cache_verdicts:
            return self._score_calls(turn, action)
        key = (_turn_key(turn), action.model_dump_json())
        with self._lock:
            hit = self._verdicts.get(key)
            if hit is not None:
                self._verdicts.move_to_end(key)
                return hit
        verdict = self._score_calls(turn, action)
        if not verdict.valid:
            return verdict  # no verdict (e.g. the world failed to rebuild): may not recur
        with self._lock:
            keep_lru(self._verdicts, key, verdict, self.config.cache_verdicts)
        return verdict

    def _score_calls(self, turn: Turn, action: Message) -> Score:
        """The verdict on a call action (the expert called tools too): execution, then probes."""
        try:
            cand_args = [(c.function.name, c.args()) for c in action.tool_calls]
        except (ValueError, TypeError) as exc:
            return Score(0.0, False, f"candidate arguments are not a JSON object: {exc}")
        expert = self._expert(turn)
        if isinstance(expert, str):
            return Score(0.0, False, expert)
        try:
            world = self._world(turn, None)
        except BROKEN_ENVIRONMENT:
            raise
        except Exception as exc:  # noqa: BLE001  (any world failure is a verdict, not a crash)
            return Score(0.0, False, f"world could not be rebuilt: {type(exc).__name__}: {exc}")
        try:
            got = self._run(world, cand_args)
        except BROKEN_ENVIRONMENT:
            raise
        except Exception as exc:  # noqa: BLE001
            return Score(0.0, True, f"world raised on the candidate's call: "
                                    f"{type(exc).__name__}: {exc}")
        verdict = self._compare(expert, got)
        if verdict.reward < 1.0 or not self.config.same_action:
            return verdict
        exp_args = [(c.function.name, c.args()) for c in turn.expected.tool_calls]
        if cand_args == exp_args:
            diff = ""  # the expert's own calls
        elif callable(getattr(world, "perturb", None)):
            try:
                diff = self._probe_diff(turn, cand_args)
            except BROKEN_ENVIRONMENT:
                raise
            except Exception as exc:  # noqa: BLE001
                return Score(0.0, True, f"world raised on a perturbed copy: "
                                        f"{type(exc).__name__}: {exc}")
        else:
            diff = self._toolcall().score(turn, action)
            diff = diff.reason if diff.reward < 1.0 else ""
        if diff:
            return Score(0.0, True, f"same state and observations, but not the expert's action: "
                                    f"{diff}")
        return verdict

    def score_batch(self, turns: Sequence[Turn], actions: Sequence[Message | None]) -> list[Score]:
        names = {t.metadata.get("world") or t.domain for t in turns}
        workers = self.config.workers if all(map(concurrent_world, names)) else 1
        return score_in_threads(self, turns, actions, workers)

    # ------------------------------------------------------------ helpers

    def _run(self, world, calls: list[tuple[str, dict[str, Any]]]) -> tuple[str, list[str]]:
        observations = [canonical_observation(world.execute(name, args)) for name, args in calls]
        if not self.config.ordered_observations:
            observations.sort()
        return _canonical_snapshot(world.snapshot()), observations

    def _compare(self, expert: tuple[str, list[str]], got: tuple[str, list[str]]) -> Score:
        if got[0] != expert[0]:
            return Score(0.0, True, "resulting state differs from the expert's")
        if self.config.compare_observations and got[1] != expert[1]:
            return Score(0.0, True, "observations differ from the expert's")
        return Score(1.0, True, "")

    def _effects(self, turn: Turn, probe: int | None, calls,
                 extra: str = "") -> tuple[Any, list[str]] | None:
        """(changes to the snapshot, observations) of `calls` on the world at `turn`, perturbed by
        `probe` (around the literals of `extra` too) unless None; None when the world has no
        such probe."""
        world = self._world(turn, probe, extra)
        if world is None:
            return None
        before = json.loads(_canonical_snapshot(world.snapshot()))
        after_text, observations = self._run(world, calls)
        after = json.loads(after_text)
        if isinstance(before, dict) and isinstance(after, dict):
            return writes(before, after), observations
        return after, observations

    def _world(self, turn: Turn, probe: int | None, extra: str = ""):
        """A fresh world at `turn` (perturbed by `probe` unless None, around the literals of
        `extra` too; None when the world has no such probe). Worlds with `fork()` are built once
        per (turn, probe, literals) and forked."""
        key, base = None, None
        lits = tuple(new_literals(extra, _action_text(turn))) if extra else ()
        if self._bases:  # only worlds that fork are kept: others skip the key's cost
            key = (_turn_key(turn), probe, lits)
            with self._lock:
                base = self._bases.get(key)
                if base is not None:
                    self._bases.move_to_end(key)
        if base is None:
            base = world_at_turn(turn)
            seed, keep = probe_seed(_turn_key(turn)), _action_text(turn)
            if probe is not None and not _perturbed(base, probe, seed, keep, extra):
                return None
            if not callable(getattr(base, "fork", None)):
                return base
            key = key or (_turn_key(turn), probe, lits)
            with self._lock:
                # a world frees its resources when dropped
                keep_lru(self._bases, key, base, self.config.cached_worlds)
        return base.fork()

    def _probe_diff(self, turn: Turn, cand_calls) -> str:
        """"" when the candidate matches the expert on every probe it is compared on."""
        cand_text = _calls_text(cand_calls)
        extra = new_literals(cand_text, _action_text(turn))
        if len(extra) > MAX_CANDIDATE_LITERALS:
            return (f"the calls name {len(extra)} literals the expert's do not (at most "
                    f"{MAX_CANDIDATE_LITERALS})")
        kept = self._kept_probes(turn)
        if not kept:
            return UNVERIFIABLE
        for i, hit in kept:
            got = self._effects(turn, i, cand_calls)
            if got != hit:
                what = "observations" if got is not None and got[0] == hit[0] else "changes"
                return f"{what} differ from the expert's on a perturbed copy of the world " \
                       f"({PROBES[i] if i < len(PROBES) else i})"
        if extra:  # the probe around the candidate's own literals (`pivotrl.verifiers.literals`)
            key = (_turn_key(turn), tuple(extra))
            with self._lock:
                hit = self._literal_cache.get(key, _UNSET)
            if hit is _UNSET:
                exp_calls = [(c.function.name, c.args()) for c in turn.expected.tool_calls]
                hit = self._effects(turn, CANDIDATE_PROBE, exp_calls, cand_text)
                with self._lock:
                    keep_lru(self._literal_cache, key, hit, self.config.cache_turns)
            if hit is not None and self._effects(turn, CANDIDATE_PROBE, cand_calls,
                                                 cand_text) != hit:
                return ("changes or observations differ from the expert's on the probe around "
                        "the calls' own literals")
        return ""

    def _kept_probes(self, turn: Turn) -> list[tuple[int, Any]]:
        """(probe, expert's effects there) of the probes a candidate is compared on
        (`probes.probes_to_compare`; none: unverifiable), found once per turn."""
        key = _turn_key(turn)
        with self._lock:
            hit = self._probe_cache.get(key, _UNSET)
        if hit is _UNSET:
            exp_calls = [(c.function.name, c.args()) for c in turn.expected.tool_calls]
            own, results = self._effects(turn, None, exp_calls), []
            original = _canonical_snapshot(self._world(turn, None).snapshot())
            for i in range(len(PROBES) + 8):  # a world may offer fewer probes (perturb -> False)
                probed = self._world(turn, i)
                if probed is None:
                    break
                if _canonical_snapshot(probed.snapshot()) == original and not (
                        i < len(PROBES) and PROBES[i] == "env" and not results):
                    continue  # the probe found nothing to change here: no run needed
                effects = self._effects(turn, i, exp_calls)
                results.append((i, effects != own, (i, effects)))
            hit = probes_to_compare(results)
            with self._lock:
                keep_lru(self._probe_cache, key, hit, max(1, self.config.cache_turns))
        return hit

    def unverifiable(self, turn: Turn) -> str:
        """Why no candidate can be verified at this turn ("" when it can): in a world whose
        actions are programs (`perturb`), no probe changes the expert's effects. Profiling
        records it per turn; `pivotrl.select` never keeps such a turn."""
        if not turn.expected.tool_calls or not self.config.same_action:
            return ""
        try:
            if not callable(getattr(self._world(turn, None), "perturb", None)):
                return ""
            return "" if self._kept_probes(turn) else UNVERIFIABLE
        except BROKEN_ENVIRONMENT:
            raise
        except Exception:  # noqa: BLE001  (a world that cannot be rebuilt: every sample says so)
            return ""

    def _expert(self, turn: Turn) -> tuple[str, list[str]] | str:
        """The expert's (snapshot, observations), or a reason string when it cannot be had."""
        key = _turn_key(turn)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        outcome: tuple[str, list[str]] | str
        try:
            world = self._world(turn, None)
        except BROKEN_ENVIRONMENT:
            raise
        except Exception as exc:  # noqa: BLE001  (unknown world, bad config, failed replay)
            # not kept: a build can fail for a passing reason (a sandbox out of processes)
            return f"world could not be rebuilt: {type(exc).__name__}: {exc}"
        else:
            try:
                calls = [(c.function.name, c.args()) for c in turn.expected.tool_calls or []]
                outcome = self._run(world, calls)
            except BROKEN_ENVIRONMENT:
                raise
            except Exception as exc:  # noqa: BLE001
                outcome = f"world failed on the expert's action: {type(exc).__name__}: {exc}"
        with self._lock:
            keep_lru(self._cache, key, outcome, max(1, self.config.cache_turns))
        return outcome

    def _toolcall(self):
        if self._fallback is None:
            self._fallback = ToolcallVerifier(message_rule=self.config.message_rule)
        return self._fallback


_UNSET = object()


def _perturbed(world, probe: int, seed: str, keep: str, extra: str) -> bool:
    if not extra:
        return world.perturb(probe, seed, keep)
    try:
        return world.perturb(probe, seed, keep, extra)
    except TypeError:  # a world whose perturb takes no `extra`: no probe around its literals
        return False


def _action_text(turn: Turn) -> str:
    """The expert's calls as text: names it mentions are kept by the probes, its literals get
    probe lines around them."""
    return _calls_text([(c.function.name, c.args()) for c in turn.expected.tool_calls or []])


def _calls_text(calls) -> str:
    """The arguments of calls, one line each (a command is its own text; other values as JSON)."""
    return "\n".join(v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
                     for _, args in calls for v in (args.values() if isinstance(args, dict)
                                                    else [args]))


def _turn_key(turn: Turn) -> str:
    body = json.dumps([turn.domain, turn.metadata.get("world"),
                       turn.metadata.get("world_config"),
                       [m.model_dump(mode="json", exclude_none=True) for m in turn.context],
                       turn.expected.model_dump(mode="json", exclude_none=True)],
                      sort_keys=True, default=str)
    return f"{turn.id}#{hashlib.sha256(body.encode()).hexdigest()[:16]}"
