"""`shell`: terminal actions are equal when running them does the same thing.

The action of a terminal turn is one or more shell commands: tool calls to a shell tool (name in
`tool_names`, command in one of `arg_names`), or, when the message has no tool calls, the fenced
```bash / ```sh / ```shell / ```console blocks of its content (console blocks lose their `$ `
prompts). Expert and candidate each run on their own fresh copy of the turn's workspace in the
bubblewrap sandbox (`pivotrl.sandbox.bwrap`), and score 1 when, command by command, the exit codes,
the normalised stdouts and the effects outside the workspace are equal and the resulting file
trees (`snapshot_dir`) are equal.

- The workspace: `turn.metadata["workspace"]` (or `metadata["world_config"]["workspace"]` /
  `["files"]`, the terminal world's config), a
  dict {relative path: content} (a path ending in "/" is a directory), with every timestamp set
  to 2024-01-01, then the shell commands of the context replayed in order so the state is the one
  the expert saw. It is prepared once per turn and copied per sample.
- stdout is compared after dropping trailing whitespace per line and trailing blank lines;
  with `collapse_whitespace` (default) runs of spaces/tabs inside a line count as one space
  (`wc -l` pads differently on some systems, column layouts differ); with
  `order_insensitive_lines` lines are compared as a sorted list. stderr is not compared
  (messages differ between tools that fail the same way) unless `compare_stderr`, and then as a
  sorted list of lines: the processes of a pipeline write their errors in the order the
  scheduler runs them, so the same command prints them in either order (the sandbox
  line-buffers stderr, so no message is spliced into another). Safe: the messages themselves
  must still be equal, and stdout, exit codes, effects and files are compared in order.
- A candidate that times out or passes the output cap scores 0; so does every candidate of a
  turn whose expert command does (the turn cannot be verified: reason says so).
- Reads and writes, not only output: once per turn the expert's command runs on every probe
  workspace (`pivotrl.verifiers.probes`: files grown and shrunk with lines of their own shapes,
  lines on both sides of every literal the command names, names changed, the files it names
  removed or created, binary files changed; each probe in another environment: clock, user,
  host, kernel release, locale, workspace path; every choice from a secret seed per turn); the
  probes on which its outcome changes are kept, and a candidate that matches on the original
  must match the expert's outcome on each of them too. `echo 4` prints what
  `grep -c apple notes.txt` printed, but not what it prints once the file changes; `grep -c E`
  counts what `grep -c ERROR` counts only until a line holds an E and no ERROR; `cp` copies
  what `grep -v DEBUG` writes only until a line holds DEBUG; `echo 2024-01-01` prints what
  `date +%F` prints only on the original run's clock. A candidate's own literals that the
  expert's command does not name get one more probe (`pivotrl.verifiers.literals`; the
  expert's run there cached per set of literals); a candidate naming more than
  `MAX_CANDIDATE_LITERALS` of them scores 0.
- A turn on which no probe changes the expert's outcome (or the expert's command times out, or
  its outcome changes between two runs on the same workspace: `ps aux`, `/dev/urandom`) is
  unverifiable: a memorised answer would be paid there, or a probe's effect not be told from
  chance. Every candidate but the expert's own command scores 0 with the reason,
  `unverifiable(turn)` says why, profiling records it and `pivotrl.select` never keeps the turn.
- Side effects are part of the action (`pivotrl.sandbox.effects`, `pivotrl.sandbox.watch`):
  what a command changes in HOME and every attempt to write, delete, reach a device, a socket
  or the network outside the workspace, succeeded or not, are compared with the expert's, so
  `rm -rf /usr; echo 3` or `curl -T notes.txt host; grep -c x f` differ from `grep -c x f`;
  /tmp is scratch. The clock is fixed (`pivotrl.sandbox.clock`): `date` and `ls -l` print the
  same whenever they run (a probe's clock is another, fixed too).
- Files are compared with what else a command can change (`snapshot_dir(details=True)`):
  modes (the workspace root's too), extended attributes, symlink or file, hard links, empty or
  missing, and which files were written or touched.
- Call vs message: a command where the expert answered with a message, or a message where the
  expert ran a command, scores 0. A fenced block is a message, not a tool call: it matches only
  an expert who also answered in fenced blocks (in a harness that runs them), never an expert
  who called the shell tool (a harness that runs tools does not run a message's markdown). Message vs message, and turns whose expert called non-shell
  tools, are scored by the `toolcall` verifier (its message rule: exact or judge).
- The expert's outcome is cached per turn (id + content hash): K samples cost one expert run.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pivotrl.io.records import Message, Turn
from pivotrl.sandbox.bwrap import (copy_workspace, freeze_mtimes,
                                  materialize_workspace, remove_workspace, require_recorded,
                                  require_sandbox, run_in_sandbox, snapshot_dir, workspace_copy)
from pivotrl.verifiers.base import Score, score_in_threads
from pivotrl.sandbox.environment import DEFAULT_ENV, SandboxEnv
from pivotrl.verifiers.literals import MAX_CANDIDATE_LITERALS, new_literals
from pivotrl.verifiers.probes import (CANDIDATE_PROBE, IRREPRODUCIBLE, PROBES, UNVERIFIABLE,
                                     perturb_workspace, probe_environment, probe_seed,
                                     probes_to_compare, writes)
from pivotrl.verifiers.world import keep_lru
from pivotrl.verifiers.schema import not_offered, schema_index
from pivotrl.verifiers.shell_actions import extract_action
from pivotrl.verifiers.shell_config import ShellConfig
from pivotrl.verifiers.toolcall import ToolcallVerifier

CANDIDATE_PROBES_KEPT = 64  # expert outcomes on candidates' literal probes kept per turn (LRU)


def normalize_output(text: str, collapse: bool, sort_lines: bool) -> str:
    lines = [(" ".join(ln.split()) if collapse else ln.rstrip()) for ln in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    if sort_lines:
        lines.sort()
    return "\n".join(lines)


def workspace_files(turn: Turn) -> dict[str, Any]:
    ws = turn.metadata.get("workspace")
    world_config = turn.metadata.get("world_config") or {}
    if ws is None and isinstance(world_config, dict):
        ws = world_config.get("workspace", world_config.get("files"))
    if ws is None:
        return {}
    if not isinstance(ws, dict):
        raise ValueError(f"turn {turn.id}: metadata workspace must be a dict path -> content")
    return ws


@dataclass
class Outcome:
    # (exit code, normalised stdout, normalised stderr, effects outside the workspace as JSON)
    steps: list[tuple[int, str, str, str]]
    files: dict[str, str]
    problem: str = ""  # "timed out" / "output over the cap" on the failing command


class ShellVerifier:
    name = "shell"

    def __init__(self, **config):
        self.config = ShellConfig(**config)
        self._limits = self.config.limits()
        self._lock = threading.Lock()
        self._turn_locks: dict[str, threading.Lock] = {}
        self._cache: OrderedDict[str, tuple[Path, Outcome]] = OrderedDict()
        self._users: dict[Path, int] = {}  # workspaces being copied right now
        self._evicted: set[Path] = set()  # evicted while in use: removed on last release
        self._probes: dict[Path, dict] = {}  # base -> perturbed workspaces and expert outcomes
        self._fallback = None
        self._recording_checked = False

    # ------------------------------------------------------------ scoring

    def score(self, turn: Turn, action: Message | None) -> Score:
        if action is None:
            return Score(0.0, False, "unparseable action")
        exp = extract_action(turn.expected, self.config)
        cand = extract_action(action, self.config)
        if cand.kind == "invalid":
            return Score(0.0, False, cand.reason)
        if exp.kind == "invalid":
            return Score(0.0, True, f"expert action unusable: {exp.reason}")
        if turn.tools and cand.form == "call":  # only the turn's own tools pay (schema.not_offered)
            index = schema_index(turn.tools)
            for c in action.tool_calls or []:
                why = not_offered(index, c.function.name, c.args())
                if why:
                    return Score(0.0, True, why)
        if exp.kind == "commands" and cand.kind != "commands":
            what = "a message" if cand.kind == "message" else "a non-shell tool"
            return Score(0.0, True, f"{what} where the expert ran a command")
        if cand.kind == "commands" and exp.kind != "commands":
            what = "a message" if exp.kind == "message" else "a non-shell tool"
            return Score(0.0, True, f"ran a command where the expert sent {what}")
        if exp.kind != "commands":  # message vs message, or non-shell tools
            return self._toolcall().score(turn, action)
        if cand.form != exp.form:
            return Score(0.0, True, "a message with a fenced block where the expert called the "
                                    "shell tool" if cand.form == "fenced" else
                         "a shell tool call where the expert answered with a fenced block")
        if len(cand.commands) != len(exp.commands):
            return Score(0.0, True, f"{len(cand.commands)} commands where the expert ran "
                                    f"{len(exp.commands)}")
        try:
            key = _turn_key(turn)
            base, expert = self._prepared(turn, exp.commands, key)
        except ValueError as exc:
            return Score(0.0, False, f"bad workspace: {exc}")
        try:
            if expert.problem:
                return Score(0.0, True, f"expert command {expert.problem}: turn cannot be "
                                        f"verified")
            if cand.commands == exp.commands:
                return Score(1.0, True, "")  # the expert's own action
            extra = new_literals("\n".join(cand.commands), "\n".join(exp.commands))
            if self.config.probes and len(extra) > MAX_CANDIDATE_LITERALS:
                return Score(0.0, True, f"the command names {len(extra)} literals the expert's "
                                        f"does not (at most {MAX_CANDIDATE_LITERALS})")
            probes, why = self._probe_set(base, exp.commands, probe_seed(key), expert)
            if why:
                return Score(0.0, True, why)
            got = self._execute(base, cand.commands)
            if got.problem:
                return Score(0.0, True, f"candidate command {got.problem}")
            diff = self._compare(expert, got) or self._probe(probes or [], cand.commands)
            if not diff and extra and probes is not None:
                diff = self._candidate_probe(base, exp.commands, cand.commands, probe_seed(key),
                                             expert)
        finally:
            self._release(base)
        return Score(0.0 if diff else 1.0, True, diff)

    def unverifiable(self, turn: Turn) -> str:
        """Why no candidate can be verified at this turn ("" when it can; module docstring)."""
        exp = extract_action(turn.expected, self.config)
        if exp.kind != "commands" or not self.config.probes:
            return ""
        try:
            key = _turn_key(turn)
            base, expert = self._prepared(turn, exp.commands, key)
        except ValueError:
            return ""  # a bad workspace is every sample's invalid score, said there
        try:
            if expert.problem:
                return f"expert command {expert.problem}"
            return self._probe_set(base, exp.commands, probe_seed(key), expert)[1]
        finally:
            self._release(base)

    def score_batch(self, turns: Sequence[Turn], actions: Sequence[Message | None]) -> list[Score]:
        return score_in_threads(self, turns, actions, self.config.workers)

    def _toolcall(self):
        if self._fallback is None:
            self._fallback = ToolcallVerifier(message_rule=self.config.message_rule)
        return self._fallback

    # ------------------------------------------------------------ probes

    def _probe(self, probes: list[tuple[str, Path, Outcome, SandboxEnv]],
               cand_cmds: list[str]) -> str:
        """"" when the candidate also matches the expert on every probe it is compared on."""
        for name, where, exp_i, env in probes:
            got = self._execute(where, cand_cmds, env)
            if got.problem:
                return f"on a perturbed workspace ({name}) the candidate {got.problem}"
            diff = self._compare(exp_i, got)
            if diff:
                return (f"on a perturbed workspace ({name}): {diff}; the command does not read "
                        f"or write what the expert's does")
        return ""

    def _candidate_probe(self, base: Path, exp_cmds: list[str], cand_cmds: list[str],
                         seed: str, expert: Outcome) -> str:
        """"" when the candidate matches the expert on the probe around its own literals
        (`probes.CANDIDATE_PROBE`): the expert's outcome there is cached per set of literals,
        the workspace rebuilt per candidate (the same seed builds the same probe)."""
        keep, extra = "\n".join(exp_cmds), "\n".join(cand_cmds)
        literals = tuple(new_literals(extra, keep))
        env = probe_environment(seed, CANDIDATE_PROBE, keep)
        with self._lock:
            entry = self._probes.setdefault(base, {"lock": threading.Lock()})
        with workspace_copy(base) as where:
            perturb_workspace(where, CANDIDATE_PROBE, seed, keep, extra)
            freeze_mtimes(where)
            with entry["lock"]:
                outcomes = entry.setdefault("candidate", OrderedDict())
                exp_i = outcomes.get(literals)
                if exp_i is None:
                    exp_i = self._execute(where, exp_cmds, env)
                    broke = any(st[2] for st in exp_i.steps) and \
                        not any(st[2] for st in expert.steps)
                    exp_i = exp_i if not (exp_i.problem or broke) else False
                    keep_lru(outcomes, literals, exp_i, CANDIDATE_PROBES_KEPT)
            if exp_i is False:
                return ""  # the expert only breaks there: the probe shows nothing
            got = self._run_commands(where, cand_cmds, env)
        if got.problem:
            return f"on the probe around its own literals the candidate {got.problem}"
        diff = self._compare(exp_i, got)
        return (f"on the probe around its own literals ({', '.join(v for _, v in literals[:4])}): "
                f"{diff}" if diff else "")

    def _probe_set(self, base: Path, commands: list[str], seed: str,
                   expert: Outcome) -> tuple[list[tuple[str, Path, Outcome, SandboxEnv]] | None,
                                             str]:
        """(the probes a candidate is compared on (`probes.probes_to_compare`): (name, workspace,
        expert outcome there), why the turn is unverifiable ("" when it is not)); None when
        probes are off. Searched once per turn: the expert runs on every probe.

        A probe counts only when the expert does the same thing twice there and twice on the
        original: an expert whose outcome moves by itself (`ps aux`, a random number) would
        otherwise look moved by a probe, and its turn be kept as verifiable."""
        if not self.config.probes:
            return None, ""
        with self._lock:
            entry = self._probes.setdefault(base, {"lock": threading.Lock()})
        with entry["lock"]:
            if "kept" not in entry:
                results, paths = [], entry.setdefault("paths", [])
                original = snapshot_dir(base, details=True)
                own = self._moves(original, expert)
                entry["why"], original_rerun, ran = "", False, False
                keep = "\n".join(commands)
                for i, name in enumerate(PROBES):
                    where, env = copy_workspace(base), probe_environment(seed, i, keep)
                    results.append((i, False, (name, where, None, env)))
                    perturb_workspace(where, i, seed, keep=keep)
                    freeze_mtimes(where)
                    before = snapshot_dir(where, details=True)
                    if before == original and not (name == "env" and not ran):
                        continue  # nothing to perturb here (no binary file, say)
                    ran = True
                    out = self._execute(where, commands, env)
                    # unverifiable there, or only broken (now writing errors): not used
                    broke = any(st[2] for st in out.steps) and not any(st[2] for st in expert.steps)
                    if out.problem or broke:
                        continue
                    moved = self._moves(before, out)
                    if moved != own:  # the probe's doing only if both reruns agree
                        same_there = self._moves(before, self._execute(where, commands, env)) \
                            == moved
                        same_here = original_rerun or \
                            self._moves(original, self._execute(base, commands)) == own
                        original_rerun = True
                        if not (same_there and same_here):
                            entry["why"] = IRREPRODUCIBLE
                            break
                    results[-1] = (i, moved != own, (name, where, out, env))
                if entry["why"]:
                    entry["kept"] = []
                else:
                    entry["kept"] = probes_to_compare([r for r in results if r[2][2] is not None])
                    entry["why"] = "" if entry["kept"] else UNVERIFIABLE
                for _, _, (_, where, _, _) in results:  # keep the workspaces of the probes in use
                    if any(where is k[1] for k in entry["kept"]):
                        paths.append(where)
                    else:
                        remove_workspace(where)
            return entry["kept"], entry["why"]

    def _moves(self, before: dict[str, str], out: Outcome) -> tuple:  # steps, files changed
        return (out.steps, writes(before, out.files) if self.config.compare_files else {})

    def _remove(self, base: Path) -> None:
        for where in self._probes.pop(base, {}).get("paths", []):
            remove_workspace(where)
        remove_workspace(base)

    # ------------------------------------------------------------ execution

    def _compare(self, exp: Outcome, got: Outcome) -> str:
        for i, ((ec, eo, ee, ex), (cc, co, ce, cx)) in enumerate(zip(exp.steps, got.steps)):
            at = f" (command {i + 1})" if len(exp.steps) > 1 else ""
            # 0 against 1 under the same non-empty stdout is grep's "nothing selected" convention
            # (`grep -c X` prints 0 and exits 1, `grep X | wc -l` prints 0 and exits 0): the
            # answer is the output both printed. Without output the status is the answer.
            benign = eo and eo == co and {ec, cc} == {0, 1}
            if self.config.compare_exit_code and ec != cc and not benign:
                return f"exit code {cc} != expert's {ec}{at}"
            if eo != co:
                return f"stdout differs{at}"
            if self.config.compare_stderr and ee != ce:
                return f"stderr differs{at}"
            if self.config.compare_effects and ex != cx:
                return f"effects outside the workspace differ{at}: {cx} vs expert's {ex}"
        if self.config.compare_files and exp.files != got.files:
            changed = sorted(set(exp.files.items()) ^ set(got.files.items()))
            return f"files differ: {', '.join(sorted({k for k, _ in changed})[:5])}"
        return ""

    def _execute(self, base: Path, commands: list[str], env: SandboxEnv = DEFAULT_ENV) -> Outcome:
        with workspace_copy(base) as wd:
            return self._run_commands(wd, commands, env)

    def _run_commands(self, wd: Path, commands: list[str],
                      env: SandboxEnv = DEFAULT_ENV) -> Outcome:
        cfg = self.config
        steps = []
        for cmd in commands:
            res = run_in_sandbox(cmd, wd, self._limits, env)
            if res.timed_out:
                return Outcome(steps, {}, f"timed out after {cfg.timeout_s}s")
            if res.truncated:
                return Outcome(steps, {}, f"output over the cap ({cfg.max_output_bytes} bytes)")
            steps.append((res.exit_code,
                          normalize_output(res.stdout, cfg.collapse_whitespace,
                                           cfg.order_insensitive_lines),
                          normalize_output(res.stderr, cfg.collapse_whitespace, True),
                          json.dumps(res.effects, sort_keys=True)))
        return Outcome(steps, snapshot_dir(wd, details=True) if cfg.compare_files else {})

    def _acquire(self, key: str) -> tuple[Path, Outcome] | None:
        # call with self._lock held; an entry in use is not deleted when evicted (see _release)
        if key not in self._cache:
            return None
        self._cache.move_to_end(key)
        base, expert = self._cache[key]
        self._users[base] = self._users.get(base, 0) + 1
        return base, expert  # type: ignore[return-value]

    def _release(self, base: Path) -> None:
        with self._lock:
            self._users[base] -= 1
            if self._users[base] == 0:
                del self._users[base]
                if base in self._evicted:
                    self._evicted.discard(base)
                    self._remove(base)

    def _prepared(self, turn: Turn, expert_commands: list[str],
                  key: str) -> tuple[Path, Outcome]:
        """(workspace as the expert saw it, expert outcome), built once per turn (`key`); the
        caller must `_release(base)` when done with the workspace."""
        with self._lock:
            hit = self._acquire(key)
            if hit is not None:
                return hit
            turn_lock = self._turn_locks.setdefault(key, threading.Lock())
        with turn_lock:
            with self._lock:
                hit = self._acquire(key)
                if hit is not None:
                    return hit
            require_sandbox()
            self._require_recording()
            base = copy_workspace(None)
            try:
                materialize_workspace(workspace_files(turn), base)
                if self.config.replay_context:
                    for msg in turn.context:
                        if msg.role != "assistant":
                            continue
                        act = extract_action(msg, self.config)
                        for cmd in act.commands if act.kind == "commands" else []:
                            run_in_sandbox(cmd, base, self._limits)
                    freeze_mtimes(base)
                expert = self._execute(base, expert_commands)
            except BaseException:
                remove_workspace(base)
                raise
            with self._lock:
                self._cache[key] = (base, expert)
                self._turn_locks.pop(key, None)
                while len(self._cache) > max(1, self.config.cache_turns):
                    _, (old, _) = self._cache.popitem(last=False)
                    if self._users.get(old):
                        self._evicted.add(old)
                    else:
                        self._remove(old)
                return self._acquire(key)  # type: ignore[return-value]

    def _require_recording(self) -> None:
        if not self._recording_checked and self.config.compare_effects:
            require_recorded(allow=self.config.allow_unrecorded_effects, who="the shell verifier",
                             option="allow_unrecorded_effects: true")
        self._recording_checked = True

    def close(self) -> None:
        """Remove the prepared workspaces (also done when the verifier is garbage-collected)."""
        with self._lock:
            for base, _ in self._cache.values():
                self._remove(base)
            for base in self._evicted:
                self._remove(base)
            self._cache.clear()
            self._evicted.clear()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: best effort
            pass


def _turn_key(turn: Turn) -> str:
    body = json.dumps([turn.metadata.get("workspace"), turn.metadata.get("world_config"),
                       [m.model_dump(mode="json", exclude_none=True) for m in turn.context],
                       turn.expected.model_dump(mode="json", exclude_none=True)],
                      sort_keys=True, default=str)
    return f"{turn.id}#{hashlib.sha256(body.encode()).hexdigest()[:16]}"
