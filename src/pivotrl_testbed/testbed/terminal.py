"""`terminal`: a small file tree and one tool, `run(command)`, executed in the bubblewrap sandbox.

Every workspace holds one file of each kind (`.log`, `.csv`, `.txt`, `.ini`) under a random
name, so the agent must look (`ls`, `grep -l`) before it acts: later commands depend on earlier
output. Tasks take 2–3 commands and end with a message; success is the resulting file tree
(exactly the goal tree) plus, for questions, the number or value in the final message.

Commands run ONLY through `pivotrl.sandbox.bwrap.run_in_sandbox`, on this world's own workspace copy.
The observation is the command's output (stdout then stderr, capped), with `[exit N]` appended
when the command failed: deterministic, because workspaces start with frozen timestamps.
"""

from __future__ import annotations

import random
import weakref
from pathlib import Path
from typing import Any

from pivotrl_testbed.testbed.common import read_answer, sentence_end
from pivotrl.sandbox import bwrap as sandbox
from pivotrl.sandbox.environment import DEFAULT_ENV
from pivotrl.verifiers.probes import perturb_workspace, probe_environment
from pivotrl.verifiers.world import register_world

NAME = "terminal"
SYSTEM_PROMPT = ("You are a shell assistant. Use the run tool to run bash commands in the "
                 "user's directory. When done, reply to the user.")
TOOLS = [{"type": "function", "function": {
    "name": "run", "description": "Run a bash command in the working directory.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"]}}}]
KINDS = ["count", "head", "copy", "sort", "move", "config", "lines"]
CALLS_PER_KIND = {"count": 2, "head": 2, "copy": 2, "sort": 2, "move": 3, "config": 2, "lines": 2}
MAX_OBSERVATION_CHARS = 800
LIMITS = sandbox.SandboxLimits(timeout_s=5.0, max_output_bytes=16384)

BASES = ["app", "data", "main", "notes", "server", "info", "jobs", "list", "users", "web"]
LEVELS = ["ERROR", "WARN", "INFO"]
EVENTS = ["disk full", "db down", "started", "slow query", "user login", "retry", "timeout"]
PEOPLE = ["ann", "bob", "cat", "dan", "eve", "fay", "gus", "hal"]
MARKERS = ["zebra", "mango", "comet", "tulip", "ember", "otter"]
KEYS = {"port": lambda r: str(r.randrange(1000, 9999)), "host": lambda r: r.choice(["alpha", "beta", "gamma"]),
        "user": lambda r: r.choice(PEOPLE), "mode": lambda r: r.choice(["fast", "safe", "debug"])}
DIRS = ["old", "archive", "backup", "logs"]

# The final answers the expert chooses among, by task kind: the forms in one list are the same
# answer (the world's `canonical_message` reads them back; "Done, see {out}." is the short form
# of both the head and the sort answer, and the state says whether the long form is true).
ANSWERS: dict[str, list[str]] = {
    "copy": ["Copied {f} to {out}.", "Done: {out} is a copy of {f}."],
    "count": ["There are {n} {level} lines.", "{n} lines contain {level}."],
    "lines": ["The csv file has {n} lines.", "{f} has {n} lines."],
    "config": ["The {key} is {value}.", "{key} is set to {value}."],
    "head": ["Saved the first {n} lines to {out}.", "Done, see {out}."],
    "sort": ["Wrote the sorted names to {out}.", "Done, see {out}."],
    "move": ["Moved {f} into {d}.", "Done: {f} is now in {d}/."],
    "sorry": ["Sorry, a command failed."],
}


class TerminalWorld:
    name = NAME
    concurrent = True  # every call waits on a bwrap subprocess; instances share nothing

    def __init__(self) -> None:
        self.workdir: Path | None = None
        self._cleanup = None
        self.effects: dict[str, str | None] = {}  # what commands did outside the workspace
        self.env = DEFAULT_ENV  # the environment commands run in (a probe's: `perturb`)

    def reset(self, config: dict[str, Any]) -> None:
        self._drop()
        self.effects, self.env = {}, DEFAULT_ENV
        self.workdir = sandbox.copy_workspace(None)
        files = config.get("workspace", config.get("files", {}))  # {path: content}
        sandbox.materialize_workspace(files, self.workdir)
        # The temp dir goes with the world object, however the caller forgets it.
        self._cleanup = weakref.finalize(self, sandbox.remove_workspace, str(self.workdir))

    def _drop(self) -> None:
        if self._cleanup is not None:
            self._cleanup()
        self._cleanup, self.workdir = None, None

    def close(self) -> None:
        self._drop()

    def execute(self, name: str, arguments: dict[str, Any]) -> str:
        if self.workdir is None:
            return "error: world not reset"
        if name != "run":
            return f"error: unknown tool {name}"
        command = arguments.get("command") if isinstance(arguments, dict) else None
        if not isinstance(command, str) or not command.strip():
            return "error: command must be a non-empty string"
        if set(arguments) - {"command"}:
            return f"error: unknown argument {sorted(set(arguments) - {'command'})[0]}"
        res = sandbox.run_in_sandbox(command, self.workdir, LIMITS, env=self.env)
        self.effects.update(res.effects)
        return observation(res)

    def fork(self) -> "TerminalWorld":
        """An independent copy in the same state (verifiers fork one world per sample instead of
        replaying the context's commands each time)."""
        twin = TerminalWorld()
        twin.effects = dict(self.effects)
        twin.env = self.env
        if self.workdir is not None:
            twin.workdir = sandbox.copy_workspace(self.workdir)
            sandbox.freeze_mtimes(twin.workdir)  # what the twin's calls touch shows (snapshot)
            twin._cleanup = weakref.finalize(twin, sandbox.remove_workspace, str(twin.workdir))
        return twin

    def perturb(self, probe: int, seed: str = "", keep: str = "", extra: str = "") -> bool:
        """Change the files and the environment the way probe number `probe` does
        (`pivotrl.verifiers.probes`: lines around the literals of `keep` and `extra` too), so
        verifiers can tell a command that reads the files, the clock or the user from one that
        only prints what they held; False when no such probe."""
        if self.workdir is None or not perturb_workspace(self.workdir, probe, seed, keep, extra):
            return False
        sandbox.freeze_mtimes(self.workdir)
        self.env = probe_environment(seed, probe, keep)
        return True

    def snapshot(self) -> dict[str, str]:
        """The file tree with what else a command can change (`snapshot_dir(details=True)`:
        modes, extended attributes, files touched), plus what the commands so far did outside it (keys "\0" + `~/path`,
        `/tmp/path` or `<network>`: no file name holds a NUL), so a command that deletes the
        home or tries the network leaves another state than one that does not."""
        files = sandbox.snapshot_dir(self.workdir, details=True) if self.workdir else {}
        files.update({"\0" + k: v for k, v in sorted(self.effects.items())})
        return files

    def files(self) -> dict[str, str]:
        return sandbox.snapshot_dir(self.workdir) if self.workdir is not None else {}

    def canonical_message(self, text: str) -> tuple | None:
        """A final answer as this world reads it (`pivotrl.verifiers.world`): its kind and the
        facts it states. Facts a form leaves out come from the files (which file is "the csv
        file"); a claim about a written file ("the first 3 lines", "the sorted names") is
        dropped when the file bears it out and kept, so it differs, when it does not. Paths
        read as the shell reads them ("./out.txt" is "out.txt", "old/" is "old"), and the end
        of a sentence as the user reads it ("!" or no full stop for ".")."""
        read = read_answer(sentence_end(text), ANSWERS)
        if read is None:
            return None
        kind, slots = read
        for key in ("f", "out", "d"):
            while slots.get(key, "").startswith("./") and len(slots[key]) > 2:
                slots[key] = slots[key][2:]
        files = self.files()
        if kind == "lines" and "f" not in slots:
            csv = [p for p in files if "/" not in p and p.endswith(".csv")]
            slots["f"] = csv[0] if len(csv) == 1 else "the csv file"
        if kind in ("head", "sort"):  # both read as "wrote {out}", true or not
            body = files.get(slots["out"])
            lines = body.splitlines() if isinstance(body, str) else None
            true = lines is not None and (
                "n" not in slots and kind == "head"
                or kind == "head" and str(len(lines)) == slots["n"]
                or kind == "sort" and lines == sorted(set(lines)))
            return ("wrote", slots["out"]) if true else ("wrote", slots["out"], kind, slots.get("n"))
        if kind == "move":
            slots["d"] = slots["d"].rstrip("/")
        return (kind, *sorted(slots.items()))

    def success(self, goal: dict[str, Any], final_message: str | None) -> bool:
        from pivotrl_testbed.testbed.toolshop import mentions

        if final_message is None or self.files() != goal["files"]:
            return False
        return all(mentions(final_message, m) for m in goal.get("mention", []))


# The extension of the one file each kind reads (found in the `ls` listing; `copy` greps instead).
KIND_EXT = {"count": "log", "move": "log", "head": "csv", "lines": "csv", "sort": "txt", "config": "ini"}


def file_in(listing: str, ext: str) -> str:
    """The file with extension `ext` in an `ls` listing (a workspace has one of each)."""
    return next(n for n in listing.split() if n.endswith("." + ext))


def observation(res: sandbox.SandboxResult) -> str:
    # The processes of a pipeline write stderr concurrently, in an order the scheduler picks
    # (`cat a | nosuch` shows either error first), and a world must be deterministic: its
    # observations are replayed by `world_at_turn` and compared by the verifiers. So stderr's
    # lines are shown sorted; stdout comes from one process (the pipeline's last) and keeps its
    # order.
    errors = res.stderr.splitlines()
    text = (res.stdout + "".join(line + "\n" for line in sorted(errors))).rstrip("\n")
    if len(text) > MAX_OBSERVATION_CHARS:
        text = text[:MAX_OBSERVATION_CHARS] + "\n[output cut]"
    if res.timed_out:
        text += "\n[timed out]"
    elif res.exit_code != 0:
        text += f"\n[exit {res.exit_code}]"
    return text.strip("\n") or "(no output)"


register_world(NAME, TerminalWorld)


# ---------------------------------------------------------------- task generation

_TEMPLATES = {
    "count": ["How many {level} lines are in the log file?",
              "Count the lines with {level} in the .log file.",
              "Tell me how many lines of the log contain {level}."],
    "head": ["Save the first {n} lines of the csv file to {out}.",
             "Write the top {n} lines of the .csv file into {out}.",
             "Put the first {n} lines of the csv into a file named {out}."],
    "copy": ["One file mentions {word}. Copy it to {out}.",
             "Find the file that contains the word {word} and copy it to {out}.",
             "Copy the file with {word} in it to {out}."],
    "sort": ["Write the names from the .txt file, sorted and without duplicates, to {out}.",
             "Sort the txt file, drop repeated names, and save it as {out}.",
             "Save the unique names of the text file in sorted order to {out}."],
    "move": ["Make a folder named {dir} and move the log file into it.",
             "Move the .log file into a new directory {dir}.",
             "Create the directory {dir} and put the log file there."],
    "config": ["What is the {key} in the ini file?",
               "Which {key} is set in the .ini config?",
               "Tell me the value of {key} in the config file."],
    "lines": ["How many lines does the csv file have?",
              "Count the lines of the .csv file.",
              "Tell me the number of lines in the csv."],
}
OUTS = ["out.txt", "top.txt", "res.txt", "found.txt", "names.txt"]


def generate(task_id: str, rng: random.Random) -> dict[str, Any]:
    kind = KINDS[rng.randrange(len(KINDS))]
    bases = rng.sample(BASES, 4)
    names = {ext: f"{b}.{ext}" for ext, b in zip(("log", "csv", "txt", "ini"), bases)}
    log = [f"{rng.choice(LEVELS)} {rng.choice(EVENTS)}" for _ in range(rng.randrange(4, 9))]
    csv = ["id,name,qty"] + [f"{i},{rng.choice(PEOPLE)},{rng.randrange(1, 20)}"
                             for i in range(1, rng.randrange(4, 8))]
    txt = [rng.choice(PEOPLE) for _ in range(rng.randrange(5, 9))]
    keys = rng.sample(sorted(KEYS), 3)
    ini = [f"{k}={KEYS[k](rng)}" for k in keys]
    lines = {"log": log, "csv": csv, "txt": txt, "ini": ini}
    task: dict[str, Any] = {"kind": kind}
    if kind == "copy":
        task["word"] = rng.choice(MARKERS)
        ext = rng.choice(sorted(lines))
        lines[ext].insert(rng.randrange(len(lines[ext]) + 1), f"note {task['word']}")
    if kind == "count":  # at least one hit: `grep -c` exits 1 on none, `grep | wc -l` does not
        task["level"] = rng.choice(LEVELS)
        if not any(task["level"] in ln for ln in log):
            log[rng.randrange(len(log))] = f"{task['level']} {rng.choice(EVENTS)}"
    files = {names[e]: "\n".join(ls) + "\n" for e, ls in lines.items()}
    goal_files = dict(files)
    mention: list[str] = []
    if kind == "count":
        mention.append(str(sum(task["level"] in ln for ln in log)))
    elif kind == "head":
        task.update(n=rng.randrange(2, 4), out=rng.choice(OUTS))
        goal_files[task["out"]] = "".join(ln + "\n" for ln in csv[: task["n"]])
    elif kind == "copy":
        task["out"] = rng.choice(OUTS)
        goal_files[task["out"]] = files[names[ext]]
    elif kind == "sort":
        task["out"] = rng.choice(OUTS)
        goal_files[task["out"]] = "".join(n + "\n" for n in sorted(set(txt)))
    elif kind == "move":
        task["dir"] = rng.choice(DIRS)
        content = goal_files.pop(names["log"])
        goal_files[f"{task['dir']}/"] = None
        goal_files[f"{task['dir']}/{names['log']}"] = content
    elif kind == "config":
        task["key"] = rng.choice(keys)
        mention.append(ini[keys.index(task["key"])].split("=", 1)[1])
    elif kind == "lines":
        mention.append(str(len(csv)))
    user = rng.choice(_TEMPLATES[kind]).format(**task)
    return {"user": user, "world_config": {"workspace": files},
            "goal": {"files": _as_snapshot(goal_files), "mention": mention}, "task": task}


def _as_snapshot(files: dict[str, str | None]) -> dict[str, str]:
    """The goal tree in `snapshot_dir`'s format (directories end in "/" and read "<dir>")."""
    out = {}
    for rel, content in files.items():
        out[rel] = "<dir>" if content is None else content
    return dict(sorted(out.items()))
