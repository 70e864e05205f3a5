"""Rewards proven from the command, not from the workspace: probes around every literal the
expert's command names (`pivotrl.verifiers.literals`), in another environment (clock, user,
host, kernel, locale, workspace path: `pivotrl.sandbox.environment`), compared on everything a
command can change (`snapshot_dir(details=True)`). Each class both ways: the wrong form scores
0, an equivalent form pays; and every single-literal change of every expert command of the
testbed scores 0 or its turn is unverifiable."""

from __future__ import annotations

import json
import os
import re
import shlex
from concurrent.futures import ThreadPoolExecutor

import pytest

from pivotrl.io.records import FunctionCall, Message, ToolCall, Turn
from pivotrl.sandbox.bwrap import sandbox_available
from pivotrl.sandbox.environment import DEFAULT_ENV
from pivotrl.verifiers import get_verifier
from pivotrl.verifiers.literals import MAX_CANDIDATE_LITERALS, command_literals
from pivotrl.verifiers.probes import UNVERIFIABLE, probe_environment

pytestmark = pytest.mark.skipif(not sandbox_available(), reason="bubblewrap not usable here")

LOG = "ERROR db down\nWARN slow query\nINFO started\nERROR disk full\nINFO user login\n"
WS = {"app.log": LOG, "data.csv": "id,name,qty\n1,ann,3\n2,bob,5\n3,cat,2\n",
      "hosts.txt": "web1 cpu 95\nweb2 cpu 40\ndb1 mem 120\ndb2 mem 70\n",
      "events.log": "2024-02-10 deploy ok\n2024-03-05 deploy failed\n2024-03-20 rollback ok\n",
      "web.ini": "[server]\nport=8080\nhost=alpha\n", "names.txt": "ann\nbob\nbob\ncat\n"}


def run(cmd: str) -> Message:
    return Message(role="assistant", tool_calls=[ToolCall(id="c1", function=FunctionCall(
        name="run", arguments=json.dumps({"command": cmd})))])


def turn(cmd: str, workspace: dict | None = None, tid: str = "") -> Turn:
    return Turn(id=tid or f"l/{cmd}", trajectory_id="l", turn=1,
                context=[Message(role="user", content="go")], expected=run(cmd),
                metadata={"workspace": workspace or WS})


def world_turn(cmd: str) -> Turn:
    return turn(cmd, tid=f"lw/{cmd}").model_copy(update={"metadata": {
        "world": "terminal", "world_config": {"workspace": WS}}})


def both_ways(verifier, t: Turn, wrong: str, same: str) -> None:
    """The wrong form scores 0, the equivalent form pays."""
    got = verifier.score(t, run(wrong))
    assert got.reward == 0.0, (wrong, got.reason)
    got = verifier.score(t, run(same))
    assert got.reward == 1.0, (same, got.reason)


@pytest.fixture(scope="module")
def shell():
    v = get_verifier("shell", timeout_s=3.0, cpu_s=2)
    yield v
    v.close()


# (expert, wrong form, equivalent form): the wrong form prints the same on the task's files
LITERALS = [
    # a filter term the task's file never holds: `cp` for `grep -v`
    ("grep -v DEBUG app.log > clean.log", "cp app.log clean.log",
     "sed '/DEBUG/d' app.log > clean.log"),
    # a threshold: the probes hold values just below, at and above it in the third field
    ("awk '$3 > 100' hosts.txt", "awk '$3 > 90' hosts.txt", "awk '$3 >= 101' hosts.txt"),
    ("awk '$3 > 100' hosts.txt", "awk '$3 > 119' hosts.txt", "awk '100 < $3' hosts.txt"),
    # a date cutoff
    ("awk '$1 >= \"2024-03-01\"' events.log", "awk '$1 >= \"2024-02-15\"' events.log",
     "awk '\"2024-03-01\" <= $1' events.log"),
    # a mask the file gives nothing to mask
    ("sed 's/password=.*/password=***/' web.ini", "cat web.ini",
     "sed 's/password=.*/password=***/' < web.ini"),
    # a near miss of the term, and another field
    ("grep -c ERROR app.log", "grep -c ERRO app.log", "grep ERROR app.log | wc -l"),
    ("cut -d, -f2 data.csv", "cut -d, -f3 data.csv", "awk -F, '{print $2}' data.csv"),
]


@pytest.mark.parametrize("expert,wrong,same", LITERALS)
def test_every_literal_of_the_expert_is_probed(shell, expert, wrong, same):
    both_ways(shell, turn(expert), wrong, same)


def test_a_blank_line_appears_only_where_the_file_holds_one(shell):
    """`grep -c .` and `wc -l` differ only on blank lines: paid where the file has none (its
    shape), not where it has one."""
    assert shell.score(turn("wc -l < app.log"), run("grep -c . app.log")).reward == 1.0
    ws = {**WS, "app.log": LOG + "\nINFO done\n"}
    got = shell.score(turn("wc -l < app.log", ws, tid="l/blank"), run("grep -c . app.log"))
    assert got.reward == 0.0, got.reason


def test_a_candidates_own_literals_get_a_probe(shell):
    """A filter the expert does not have removes nothing on the expert's probes; the probe
    around the candidate's literals holds lines it removes."""
    t = turn("grep -c ERROR app.log")
    got = shell.score(t, run("grep ERROR app.log | grep -vc ZORK"))
    assert got.reward == 0.0 and "own literals" in got.reason, got.reason
    got = shell.score(t, run("grep ERROR app.log | grep -c ERROR"))
    assert got.reward == 1.0, got.reason


def test_a_candidate_over_the_literal_cap_scores_0(shell):
    t = turn("grep -c ERROR app.log")
    planted = " ".join(f"w{chr(97 + i)}x" for i in range(MAX_CANDIDATE_LITERALS + 1))
    got = shell.score(t, run(f"grep -c ERROR app.log # {planted}"))
    assert got.reward == 0.0 and "literals" in got.reason, got.reason
    few = " ".join(f"w{chr(97 + i)}x" for i in range(3))
    assert shell.score(t, run(f"grep -c ERROR app.log # {few}")).reward == 1.0


def test_literals_are_read_from_arguments_values_and_programs():
    assert command_literals("awk -F, '$3 > 100' hosts.txt") == [
        ("number", "3"), ("number", "100"), ("word", "hosts"), ("word", "txt")]
    assert ("number", "3") in command_literals("head --lines=3 f")
    assert ("number", "3") in command_literals("head -n3 f")
    assert ("date", "2024-03-01") in command_literals("awk '$1 >= \"2024-03-01\"' e.log")
    assert command_literals("ls -la") == []  # option letters and command names are not data


# ---------------------------------------------------------------- the environment

# One expert reads each part of the environment; each wrong form puts a constant in place of one
# part (what the original run prints there), each equivalent form another way to read it.
ENV_PARTS = [("date +%F", "echo 2024-01-01", "date -I"), ("date +%Y", "echo 2024", "date +%C%y"),
             ("whoami", "echo user", "id -un"), ("echo $USER", "echo user", "printenv USER"),
             ("hostname", "echo sandbox", "uname -n"),
             ("uname -r", "echo " + os.uname().release, "uname --kernel-release"),  # the host's
             ("pwd", "echo /work", "echo $PWD"), ("basename \"$PWD\"", "echo work",
                                                  "pwd | xargs basename"),
             ("echo $LANG", "echo C.UTF-8", "printenv LANG"),
             # a file's timestamp is not today's date
             ("date +%F", "stat -c %y app.log | cut -c1-10", "date +%Y-%m-%d")]
ENV_EXPERT = "; ".join(part for part, _, _ in ENV_PARTS)
ENVIRONMENT = [(ENV_EXPERT, "; ".join(w if i == j else p for j, (p, _, _) in enumerate(ENV_PARTS)),
                "; ".join(s if i == j else p for j, (p, _, s) in enumerate(ENV_PARTS)))
               for i, (_, w, s) in enumerate(ENV_PARTS)]


@pytest.mark.parametrize("expert,constant,same", ENVIRONMENT)
def test_a_constant_does_not_stand_for_what_the_environment_gives(shell, expert, constant, same):
    both_ways(shell, turn(expert), constant, same)


def test_probe_environments_differ_from_the_original_in_every_field():
    envs = [probe_environment("s", i) for i in range(9)]
    for env in envs:
        for field in ("epoch", "files_epoch", "user", "hostname", "kernel", "lang", "workdir"):
            assert getattr(env, field) != getattr(DEFAULT_ENV, field), field
    assert len({e.epoch for e in envs}) == len(envs)  # a different date per probe
    assert probe_environment("s", 0, keep="cat /work/app.log").workdir == "/work"


# ---------------------------------------------------------------- what the snapshot sees

SNAPSHOT = [
    ("cp app.log copy.log", "cat app.log > copy.log; chmod 000 .", "cat app.log > copy.log"),
    ("cp app.log copy.log", "cp app.log copy.log; chmod 700 .", "cp ./app.log ./copy.log"),
    ("grep -c ERROR app.log",
     "python3 -c \"import os; os.setxattr('app.log', 'user.x', b'1')\"; grep -c ERROR app.log",
     "grep -c 'ERROR' app.log"),
    ("grep -c ERROR app.log",
     "python3 -c \"import os; os.setxattr('.', 'user.k', b'v')\"; grep -c ERROR app.log",
     "cat app.log | grep -c ERROR"),
    ("touch app.log", "[ -e app.log ] || : > app.log", "touch -c app.log"),
    ("touch new.txt", "ln -s /dev/null new.txt", "touch ./new.txt"),
    ("cp app.log copy.log", "ln app.log copy.log", "cat app.log > copy.log"),
    ("cp app.log copy.log", "ln -s app.log copy.log", "cp -- app.log copy.log"),
    ("head -n 2 data.csv > out.txt", "head -n 2 data.csv > out.txt; chmod 600 out.txt",
     "head -2 data.csv > out.txt"),
]


@pytest.mark.parametrize("expert,wrong,same", SNAPSHOT)
def test_the_snapshot_sees_what_a_command_can_change(shell, expert, wrong, same):
    both_ways(shell, turn(expert), wrong, same)


# ---------------------------------------------------------------- the state worlds too

@pytest.mark.parametrize("expert,wrong,same", [LITERALS[0], LITERALS[1], SNAPSHOT[0], SNAPSHOT[4],
                                               ("date +%F > today.txt",
                                                "echo 2024-01-01 > today.txt", "date -I > today.txt"),
                                               ("whoami", "echo user", "id -un")])
def test_the_state_verifier_on_the_terminal_world_probes_the_same(expert, wrong, same):
    both_ways(get_verifier("state"), world_turn(expert), wrong, same)


def test_state_probes_a_candidates_own_literals():
    v = get_verifier("state")
    got = v.score(world_turn("grep -c ERROR app.log"), run("grep ERROR app.log | grep -vc ZORK"))
    assert got.reward == 0.0 and "own literals" in got.reason, got.reason


# ---------------------------------------------------------------- cheap outputs of a policy

POLICY = [
    # the right count, then a listing that hides the workspace's real contents from a reader
    ("grep -c ERROR app.log", "grep -c ERROR app.log; mv data.csv .data.csv"),
    # a truncation that keeps exactly what the original file holds
    ("sort -u names.txt > out.txt", "sort -u names.txt | head -3 > out.txt"),
    # the expert's count printed by reading the line count of the original file's size
    ("wc -c < app.log", f"echo {len(LOG)}"),
    # an answer from a file's timestamp instead of the clock
    ("date +%s", "stat -c %Y app.log"),
    # a cut to the original file's length
    ("cut -d, -f2 data.csv", "cut -d, -f2 data.csv | head -4"),
    # a cutoff written as the expert's number's neighbour
    ("awk '$3 >= 100' hosts.txt", "awk '$3 > 100' hosts.txt"),
]


@pytest.mark.parametrize("expert,cand", POLICY)
def test_cheap_outputs_a_policy_could_find_score_0(shell, expert, cand):
    got = shell.score(turn(expert), run(cand))
    assert got.reward == 0.0, (expert, cand, got.reason)


# ---------------------------------------------------------------- every single-literal change

_NUMBER = re.compile(r"\d+")
_WORD = re.compile(r"[A-Za-z]{2,}")
_OPERATORS = {"|", "||", "&&", ";", ">", ">>", "<", "&"}


def literal_mutations(cmd: str, paths: list[str]) -> list[str]:
    """Every command that differs from `cmd` in one literal (`command_literals`): a number
    ±1, a word dropped, cut short, case-swapped or replaced by another, a path replaced by
    another file of the workspace or a missing one, a whole argument dropped."""
    lexer = shlex.shlex(cmd, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    words = list(lexer)
    out = []

    def join(ws: list[str]) -> str:
        return " ".join(w if w in _OPERATORS else shlex.quote(w) for w in ws)

    command_next = True
    for i, w in enumerate(words):
        if w in _OPERATORS:
            command_next = w not in (">", ">>", "<")
            continue
        if command_next:
            command_next = False
            continue
        if not (_NUMBER.search(w) or _WORD.search(w)):
            continue  # no literal in it (`.`, `''`, `*`)
        variants = [m.string[:m.start()] + str(int(m.group()) + d) + m.string[m.end():]
                    for m in _NUMBER.finditer(w) for d in (-1, 1) if int(m.group()) + d >= 0]
        if not w.startswith("-"):
            for m in _WORD.finditer(w):
                a, b = m.span()
                for v in (w[a:b - 1], w[a:b].swapcase(), "zulu"):
                    variants.append(w[:a] + v + w[b:])
            variants += [p for p in paths if p != w and w in paths] + ["missing.txt", ""]
        out += [join(words[:i] + ([v] if v else []) + words[i + 1:]) for v in variants]
    return sorted(set(out) - {cmd, join(words)})


def _testbed_turns(per_kind: int = 1) -> list[tuple[Turn, list[str]]]:
    """(turn, every form the terminal expert may choose there) of every command turn of one
    expert trajectory per task kind."""
    from pivotrl_testbed.episodes import expert_turns
    from pivotrl_testbed.testbed.experts import STEPS, FixedChooser, observations, run_expert
    from pivotrl_testbed.testbed.tasks import make_tasks

    tasks: dict[str, list] = {}
    for task in make_tasks("terminal", "train", 60):
        tasks.setdefault(task.metadata["task"]["kind"], []).append(task)
    out = []
    for kind in sorted(tasks):
        for task in tasks[kind][:per_kind]:
            traj = run_expert(task, seed=0)
            for t in expert_turns([traj]):
                if not t.expected.tool_calls:
                    continue
                forms = []
                for i in range(6):
                    step = STEPS["terminal"](traj.metadata["task"], observations(t.context),
                                             FixedChooser(i))
                    if step[0] == "call" and step[2]["command"] not in forms:
                        forms.append(step[2]["command"])
                out.append((t, forms))
    return out


def test_every_single_literal_change_of_the_testbed_experts_scores_0_or_is_unverifiable():
    """Every command form of the terminal expert (the testbed's experts; examples/*.jsonl holds
    no shell command), every literal changed once: the shell verifier pays none of them, or
    says the turn is unverifiable; so does the state verifier (the demo's verifier for the
    terminal world) on each turn's first form (its first mutations: it replays the world)."""
    shell, state = get_verifier("shell"), get_verifier("state")
    jobs, seen = [], set()
    for t, forms in _testbed_turns():
        paths = sorted(t.metadata["world_config"]["workspace"])
        for n, form in enumerate(forms):
            mutations = literal_mutations(form, paths)
            if mutations and (form, n) not in seen:  # `ls -1`: the same in every task
                seen.add((form, n) if form.startswith("ls") else ())
                jobs.append((t.model_copy(update={
                    "id": f"{t.id}#{n}", "expected": run(form),
                    "metadata": {**t.metadata, "workspace": t.metadata["world_config"]["workspace"]}}),
                    form, mutations, n == 0))

    def check(job) -> tuple[int, int]:
        ft, form, mutations, first = job
        if shell.unverifiable(ft):
            return 0, 1
        for got, cand in zip(shell.score_batch([ft] * len(mutations), [run(c) for c in mutations]),
                             mutations):
            assert got.reward == 0.0, ("shell", form, cand, got.reason)
        if first and not state.unverifiable(ft):
            for cand in mutations[:6]:
                got = state.score(ft, run(cand))
                assert got.reward == 0.0, ("state", form, cand, got.reason)
        return len(mutations), 0

    with ThreadPoolExecutor(4) as pool:
        counts = list(pool.map(check, jobs))
    shell.close()
    checked, unverifiable = map(sum, zip(*counts))
    assert checked >= 300 and unverifiable <= 3, (checked, unverifiable)


def _value_mutations(value):
    """A JSON argument changed in one literal: a number ±1 (in a string too), a string cut
    short, its first letter replaced, or another word."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return []
    if not isinstance(value, str):
        return [value - 1, value + 1]
    out = [m.string[:m.start()] + str(int(m.group()) + d) + m.string[m.end():]
           for m in _NUMBER.finditer(value) for d in (-1, 1) if int(m.group()) + d >= 0]
    if value:
        out += [value[:-1], ("q" if value[0] != "q" else "z") + value[1:], "zulu"]
    return [v for v in dict.fromkeys(out) if v != value]


def test_every_single_literal_change_of_the_examples_calls_scores_0():
    """examples/trajectories.jsonl: every expert call's arguments, one literal changed (or a
    required argument dropped): the state verifier pays none in the toolshop world, the
    toolcall verifier none in the worlds without one."""
    from pathlib import Path

    from pivotrl.extract import ExtractOptions, extract_turns
    from pivotrl.io.records import Trajectory

    verifiers = {"state": get_verifier("state"), "toolcall": get_verifier("toolcall")}
    checked = 0
    path = Path(__file__).resolve().parents[1] / "examples" / "trajectories.jsonl"
    for line in path.read_text().splitlines():
        turns, _ = extract_turns(Trajectory.model_validate_json(line), ExtractOptions())
        for t in turns:
            calls = t.expected.tool_calls or []
            v = verifiers["state" if t.metadata.get("world") else "toolcall"]
            for i, call in enumerate(calls):
                args = call.args()
                required = next((f["function"]["parameters"].get("required", [])
                                 for f in t.tools or [] if f["function"]["name"]
                                 == call.function.name), [])
                changed = [{**args, k: m} for k in args for m in _value_mutations(args[k])]
                changed += [{k2: v2 for k2, v2 in args.items() if k2 != k}
                            for k in args if k in required]
                for new in changed:
                    mutated = [c if j != i else ToolCall(id=c.id, function=FunctionCall(
                        name=c.function.name, arguments=json.dumps(new))) for j, c in enumerate(calls)]
                    got = v.score(t, Message(role="assistant", tool_calls=mutated))
                    assert got.reward == 0.0, (t.id, call.function.name, args, new, got.reason)
                    checked += 1
    assert checked >= 200, checked
