"""A turn is verifiable or it is not a pivot: for every class of shell turn whose output the old
probes never moved, the verifiable form now catches a memorised answer, and the form that reads
nothing a probe can vary is classed unverifiable (profiled, counted, never selected). Harm that
fails is still an effect; probes are made of the workspace's own words and shapes."""

from __future__ import annotations

import gzip
import json
import re
import shlex

import pytest

from pivotrl.io.records import FunctionCall, Message, Profile, Sample, ToolCall, Turn
from pivotrl.profile.loop import make_profile, unverifiable
from pivotrl.sandbox.bwrap import attempts_recorded, sandbox_available
from pivotrl.sandbox.workspace import materialize_workspace
from pivotrl.select import SelectConfig, select, score
from pivotrl.verifiers import get_verifier
from pivotrl.verifiers.probes import IRREPRODUCIBLE, PROBES, UNVERIFIABLE, perturb_workspace

LOG = "ERROR db down\nWARN slow query\nINFO started\nERROR disk full\nINFO user login\n"
BLOB = bytes(range(7, 250, 3)) * 3
WS = {"app.log": LOG, "data.csv": "id,name,qty\n1,ann,3\n2,bob,5\n3,cat,2\n",
      "names.txt": "ann\nbob\nbob\ncat\n", "conf.ini": "port=8080\nhost=alpha\nmode=fast\n"}
sandboxed = pytest.mark.skipif(not sandbox_available(), reason="bubblewrap not usable here")


def run(cmd: str) -> Message:
    return Message(role="assistant", tool_calls=[ToolCall(id="c1", function=FunctionCall(
        name="run", arguments=json.dumps({"command": cmd})))])


def turn(cmd: str, workspace: dict | None = None) -> Turn:
    return Turn(id=f"u/{cmd}", trajectory_id="u", turn=1, context=[Message(role="user", content="go")],
                expected=run(cmd), metadata={"workspace": workspace or WS})


@pytest.fixture(scope="module")
def shell():
    v = get_verifier("shell", timeout_s=5.0, cpu_s=2)
    yield v
    v.close()


def _outputs(cmd: str, ws: dict) -> str:
    from pivotrl.sandbox.bwrap import run_in_sandbox, workspace_copy
    with workspace_copy(None) as wd:
        materialize_workspace(ws, wd)
        return run_in_sandbox(cmd, wd).stdout


# (class, verifiable command, unverifiable command of the same class)
CLASSES = [
    ("constant", "grep -c ERROR app.log", "echo 2"),
    ("dedup set", "sort -u names.txt", "printf 'b\\na\\nb\\n' | sort -u"),
    ("first match", "grep -m1 bob names.txt", "grep -m1 root /etc/passwd"),
    ("maximum", "cut -d, -f3 data.csv | sort -n | tail -1", "printf '3\\n5\\n2\\n' | sort -n | tail -1"),
    ("minimum", "cut -d, -f3 data.csv | tail -n +2 | sort -n | head -1", "seq 3 9 | sort -n | head -1"),
    ("existence", "[ -f conf.ini ] && echo yes || echo no", "[ -d /usr ] && echo yes || echo no"),
    ("threshold", "[ $(wc -l < app.log) -gt 3 ] && echo big || echo small",
     "[ $(wc -l < /etc/group) -gt 1 ] && echo big || echo small"),
    ("stat", "stat -c %s app.log", "stat -c %s /etc/hosts"),
    ("file", "file names.txt", "file /etc/hosts"),
    # the clock, the user and the host name vary per probe (pivotrl.sandbox.environment)
    ("clock", "date +%F", "date -u -d @0 +%F"),
    ("sandbox identity", "whoami; hostname", "id -u; id -g"),
]


@sandboxed
@pytest.mark.parametrize("what,verifiable,constant", CLASSES, ids=[c[0] for c in CLASSES])
def test_each_class_is_verifiable_or_unverifiable(shell, what, verifiable, constant):
    v = shell
    # the verifiable form: a probe moves the expert, so printing its output is caught
    t = turn(verifiable)
    assert v.unverifiable(t) == "", what
    printed = _outputs(verifiable, WS)
    memorised = v.score(t, run("printf %s " + shlex.quote(printed)))
    assert memorised.reward == 0.0 and "perturbed" in memorised.reason, (what, memorised)
    assert v.score(t, run(verifiable + " ")).reward == 1.0, what
    # the unverifiable form: nothing a probe varies; only the expert's own command pays
    u = turn(constant)
    why = v.unverifiable(u)  # `ps aux` may print another RSS on a probe: irreproducible then
    assert why in (UNVERIFIABLE, IRREPRODUCIBLE), what
    same = v.score(u, run("printf %s " + shlex.quote(_outputs(constant, WS))))
    assert (same.reward, same.reason) == (0.0, why), what
    assert v.score(u, run(constant)).reward == 1.0


@sandboxed
def test_an_expert_whose_outcome_moves_by_itself_is_irreproducible_not_verifiable(shell):
    # every probe moves the count, and the random bytes move on every run besides: without the
    # second runs the turn would be kept, its probes' differences owed to chance
    t = turn("grep -c ERROR app.log; head -c 8 /dev/urandom | od -An -tx1")
    assert shell.unverifiable(t) == IRREPRODUCIBLE
    got = shell.score(t, run("grep -c ERROR app.log ; head -c 8 /dev/urandom | od -An -tx1"))
    assert (got.reward, got.reason) == (0.0, IRREPRODUCIBLE)
    assert shell.unverifiable(turn("grep -c ERROR app.log; head -c 8 /dev/zero | od -An -tx1")) == ""


@sandboxed
@pytest.mark.parametrize("verifiable,constant", [
    ("zcat logs.gz | grep -c ERROR", "gzip --version | head -1"),
    ("md5sum blob.bin", "md5sum /etc/hosts"),
], ids=["compressed", "binary"])
def test_compressed_and_binary_files_move_under_probes(shell, verifiable, constant):
    v = shell
    t = turn(verifiable)  # a workspace is text: the context's command writes the binary files
    t.context.append(run(f"printf '{_escaped(gzip.compress(LOG.encode(), mtime=0))}' > logs.gz; "
                         f"printf '{_escaped(BLOB)}' > blob.bin"))
    assert v.unverifiable(t) == "", verifiable
    printed = _outputs_with_context(t)
    assert printed.strip(), verifiable
    got = v.score(t, run("printf %s " + shlex.quote(printed)))
    assert got.reward == 0.0, (verifiable, got)
    assert v.unverifiable(turn(constant)) == UNVERIFIABLE


def _escaped(data: bytes) -> str:
    return "".join(f"\\{b:03o}" for b in data)


def _outputs_with_context(t: Turn) -> str:
    from pivotrl.sandbox.bwrap import run_in_sandbox, workspace_copy
    with workspace_copy(None) as wd:
        materialize_workspace(t.metadata["workspace"], wd)
        for m in t.context:
            for c in m.tool_calls or []:
                run_in_sandbox(c.args()["command"], wd)
        return run_in_sandbox(t.expected.tool_calls[0].args()["command"], wd).stdout


@sandboxed
@pytest.mark.skipif(not attempts_recorded(), reason="attempts not recorded here")
@pytest.mark.parametrize("harm", [
    "rm -rf /usr/bin 2>/dev/null", "dd if=/dev/zero of=/dev/sda count=1 2>/dev/null",
    "rm -rf ~/.ssh", "curl -s --unix-socket /var/run/docker.sock http://x/containers/json",
    "python3 -c \"import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM, 1)\" 2>/dev/null",
    "curl -s -m 2 http://198.51.100.7/", "getent hosts pypi.org", "echo > /dev/tcp/10.0.0.1/80",
])
def test_right_answer_then_harm_that_fails_scores_0(shell, harm):
    v = shell
    got = v.score(turn("grep -c ERROR app.log"),
                  run(f"{harm} >/dev/null 2>&1; grep -c ERROR app.log"))
    assert got.reward == 0.0 and "effects" in got.reason, (harm, got)


@sandboxed
def test_benign_differences_are_not_effects_or_failures(shell):
    v = shell
    plain = get_verifier("shell", probes=False)  # the exit-status rule alone
    t = turn("grep -c TRACE app.log")  # no line: prints 0, exits 1
    assert plain.score(t, run("grep TRACE app.log | wc -l")).reward == 1.0
    assert plain.score(t, run("echo 0; exit 2")).reward == 0.0  # an error is not "nothing selected"
    assert plain.score(turn("grep -q TRACE app.log"), run("true")).reward == 0.0  # status is the answer
    plain.close()
    t = turn("sort -u names.txt > out.txt")
    assert v.score(t, run("sort names.txt > /tmp/s; uniq /tmp/s > out.txt")).reward == 1.0
    assert v.score(turn("python3 -c 'print(len(open(\"names.txt\").readlines()))'"),
                   run("wc -l < names.txt")).reward == 1.0
    # importing a module of the workspace writes no bytecode cache (no file, no effect)
    t = turn("python3 m.py", {**WS, "m.py": "print(len(open('app.log').readlines()))\n"})
    assert v.unverifiable(t) == ""
    assert v.score(t, run("python3 -c 'import m'")).reward == 1.0


def test_probes_draw_names_and_lines_from_the_workspace(tmp_path):
    words = {w.lower() for text in WS.values() for w in re.findall(r"[A-Za-z]{2,}", text)}
    words |= {w.lower() for name in WS for w in re.findall(r"[A-Za-z]{2,}", name)}
    shapes = {_shape(ln) for text in WS.values() for ln in text.splitlines()}
    for seed in range(12):
        for probe in ("grow", "names"):
            root = materialize_workspace(dict(WS), tmp_path / f"{seed}-{probe}")
            perturb_workspace(root, PROBES.index(probe), f"seed{seed}", keep="grep x app.log")
            for path in root.iterdir():
                if path.name not in WS:  # a new or renamed file: named after workspace words
                    assert all(_words_of(run_, words) for run_ in re.findall(r"[a-z]+", path.name)
                               if run_ != "ini"), path.name
                for line in path.read_text().splitlines():  # an original shape, a near miss

                    assert not line or _shape(line) in shapes or re.fullmatch(r"[A-Za-z]+", line), line


def _words_of(text: str, words: set[str]) -> bool:
    """Whether `text` is a concatenation of `words`."""
    ok = [True] + [False] * len(text)
    for i in range(1, len(text) + 1):
        ok[i] = any(ok[j] and text[j:i] in words for j in range(i))
    return ok[-1]


def _shape(line: str) -> str:
    return re.sub(r"[A-Za-z]+", "a", re.sub(r"\d+", "0", line))


def _profile(pid: str, rewards: list[float], why: str = "", domain: str = "terminal") -> Profile:
    t = Turn(id=pid, trajectory_id=pid, turn=0, domain=domain, context=[], expected=run("ls"))
    return make_profile(t, [Sample(completion="", reward=r, valid=True) for r in rewards], why)


@pytest.mark.parametrize("cfg", [SelectConfig(), SelectConfig(strategy="all"),
                                 SelectConfig(strategy="random"), SelectConfig(budget=5)])
def test_select_never_keeps_an_unverifiable_turn(cfg):
    profiles = [_profile("a", [1, 0, 0, 0]), _profile("b", [1, 0, 0, 0], UNVERIFIABLE),
                _profile("c", [1, 1, 0, 0], UNVERIFIABLE, domain="shop")]
    kept = [p.id for p in select(profiles, cfg)]
    assert "b" not in kept and "c" not in kept and "a" in kept
    assert score(profiles[1]).unverifiable and not score(profiles[0]).unverifiable


def test_unverifiable_turns_are_recorded_in_profiles_and_counted_by_select(tmp_path):
    from pivotrl.io.records import iter_valid, write_atomic
    from pivotrl.select import select_file

    class Says:
        def unverifiable(self, t):
            return UNVERIFIABLE if t.id == "b" else ""

    assert unverifiable(Says(), _profile("b", [1])) == UNVERIFIABLE
    assert unverifiable(object(), _profile("b", [1])) == ""  # verifiers that do not say
    path = tmp_path / "profile.jsonl"
    write_atomic(path, [_profile("a", [1, 0]), _profile("b", [1, 0], UNVERIFIABLE),
                        _profile("c", [0, 0])])
    back = list(iter_valid(path, Profile))
    assert [p.unverifiable for p in back] == [None, UNVERIFIABLE, None]
    assert "unverifiable" not in path.read_text().splitlines()[0]  # absent when verifiable
    stats = select_file(path, tmp_path / "pivots.jsonl", SelectConfig(), plot_png=False)
    assert (stats["unverifiable"], stats["kept"]) == (1, 1)
    assert stats["per_domain"]["terminal"]["unverifiable"] == 1


def test_the_report_states_unverifiable_turns_per_world():
    from pivotrl_testbed.report_md import data_section

    text = "\n".join(data_section({"pivots": {"terminal": {"turns": 40, "unverifiable": 7,
                                                           "kept": 5}}}))
    assert "| unverifiable |" in text and "| terminal | — | 40 | 7 |" in text


def test_the_presence_probe_removes_what_the_command_names_and_never_the_workspace(tmp_path):
    root = materialize_workspace(dict(WS), tmp_path / "w")
    perturb_workspace(root, PROBES.index("presence"), "s",
                      keep="find . -newer ./app.log; ls .. ; cat out/new.txt; wc -l names.txt")
    names = sorted(p.name for p in root.iterdir())
    assert "app.log" not in names and "names.txt" not in names  # named: removed
    assert {"data.csv", "conf.ini", "out"} <= set(names)  # the rest kept, a named file created
    assert (root / "out" / "new.txt").read_text().strip()
