"""Execution-based verifiers: shell (bubblewrap), state (any World), judge (a real HTTP server)."""

import json
import re
from pathlib import Path
from typing import Any

import pytest

from pivotrl.formats.actions import parse_completion
from pivotrl.io.records import FunctionCall, Message, ToolCall, Turn
from pivotrl.sandbox.bwrap import sandbox_available
from pivotrl.verifiers import get_verifier
from pivotrl.verifiers.judge import JudgeUnavailable, parse_verdict
from pivotrl.verifiers.world import register_world

from fake_judge import FakeJudge

needs_bwrap = pytest.mark.skipif(not sandbox_available(), reason="bubblewrap not usable here")


def call(name: str, **args: Any) -> ToolCall:
    return ToolCall(id=f"c_{name}", function=FunctionCall(name=name, arguments=json.dumps(args)))


def calls(*cs: ToolCall, content: str | None = None) -> Message:
    return Message(role="assistant", content=content, tool_calls=list(cs))


def say(text: str) -> Message:
    return Message(role="assistant", content=text)


def tool(text: str, cid: str = "c_run") -> Message:
    return Message(role="tool", tool_call_id=cid, content=text)


# ---------------------------------------------------------------- shell

WORKSPACE = {"notes.txt": "apple\nbanana\napple pie\ncherry\n", "src/main.py": "print('hi')\n",
             "logs/": None}


def shell_turn(command: str | None, context: list[Message] | None = None, tid: str = "t/1",
               message: str | None = None) -> Turn:
    expected = say(message) if command is None else calls(call("run", command=command))
    ctx = [Message(role="user", content="work on the files")] + (context or [])
    return Turn(id=tid, trajectory_id="t", turn=1, context=ctx, expected=expected,
                metadata={"workspace": WORKSPACE})


@pytest.fixture(scope="module")
def shell():
    v = get_verifier("shell", timeout_s=2.0, cpu_s=2)
    yield v
    v.close()


def run(cmd: str) -> Message:
    return calls(call("run", command=cmd))


@needs_bwrap
@pytest.mark.parametrize("expert,cand", [
    ("ls -la", "ls -al"),
    ("grep -c apple notes.txt", "grep apple notes.txt | wc -l"),
    ("wc -l < notes.txt", "cat notes.txt | wc -l"),
    ("mkdir out && cp notes.txt out/", "mkdir -p out; cp ./notes.txt out/notes.txt"),
    ("sed -i 's/apple/APPLE/g' notes.txt", "perl -pi -e 's/apple/APPLE/g' notes.txt"),
    ("cat src/main.py", "cat ./src/../src/main.py"),
])
def test_shell_equivalent_commands_score_1(shell, expert, cand):
    sc = shell.score(shell_turn(expert, tid=f"eq/{expert}"), run(cand))
    assert (sc.reward, sc.valid) == (1.0, True), sc.reason


@needs_bwrap
@pytest.mark.parametrize("expert,cand,why", [
    ("grep -c apple notes.txt", "grep -c banana notes.txt", "stdout"),
    ("ls", "ls -a", "stdout"),
    ("cat notes.txt", "cat nothere.txt", "exit code"),
    ("mkdir out", "mkdir output", "files"),
    ("sed -i 's/apple/APPLE/g' notes.txt", "sed 's/apple/APPLE/g' notes.txt", "stdout"),
    ("rm notes.txt", "true", "files"),
])
def test_shell_different_commands_score_0(shell, expert, cand, why):
    sc = shell.score(shell_turn(expert, tid=f"ne/{expert}"), run(cand))
    assert sc.reward == 0.0 and sc.valid and why in sc.reason, sc.reason


@needs_bwrap
def test_shell_state_replays_context(shell):
    """The expert saw the files the context's commands made; so must the candidate."""
    ctx = [calls(call("run", command="echo one > made.txt && echo two >> made.txt")),
           tool(""), say("```bash\nmv made.txt logs/\n```"),
           Message(role="user", content="count lines")]
    turn = shell_turn("wc -l logs/made.txt", ctx, tid="replay/1")
    assert shell.score(turn, run("wc -l 'logs/made.txt'")).reward == 1.0
    assert shell.score(turn, run("cd logs && wc -l ../logs/made.txt | sed 's#../##'")).reward == 1
    sc = shell.score(turn, run("cat logs/made.txt | wc -l"))  # prints no file name
    assert sc.reward == 0.0 and "stdout" in sc.reason
    sc = shell.score(turn, run("wc -l made.txt"))  # not where the context left it
    assert sc.reward == 0.0 and "exit code" in sc.reason


@needs_bwrap
def test_shell_fenced_blocks_and_parsed_completions(shell):
    fenced = Turn(id="fence/0", trajectory_id="t", turn=1, expected=say(
        "```bash\nsort notes.txt | head -2\n```"), context=[Message(role="user", content="x")],
        metadata={"workspace": WORKSPACE})  # an agent whose harness runs markdown blocks
    assert shell.score(fenced, say("Sorting:\n```bash\nsort notes.txt | head -n 2\n```")).reward == 1
    assert shell.score(fenced, say("```console\n$ sort < notes.txt | head -2\n```")).reward == 1
    assert shell.score(fenced, run("sort notes.txt | head -n 2")).reward == 0
    turn = shell_turn("sort notes.txt | head -2", tid="fence/1")
    sc = shell.score(turn, say("Sorting:\n```bash\nsort notes.txt | head -n 2\n```"))
    assert sc.reward == 0 and "fenced" in sc.reason  # a message is not a run() call
    parsed = parse_completion('<tool_call>{"name": "run", "arguments": '
                              '{"command": "head -2 <(sort notes.txt)"}}</tool_call>')
    assert parsed.valid and shell.score(turn, parsed.message).reward == 1.0
    bad = parse_completion('<tool_call>{"name": "run", "arguments": {"command": </tool_call>')
    assert not bad.valid
    sc = shell.score(turn, bad.message)
    assert (sc.reward, sc.valid) == (0.0, False)


@needs_bwrap
def test_shell_call_vs_message_and_shape(shell):
    turn = shell_turn("ls", tid="shape/1")
    assert shell.score(turn, say("The files are notes.txt and src.")).reward == 0
    two = calls(call("run", command="ls"), call("run", command="ls"))
    assert shell.score(turn, two).reward == 0
    assert shell.score(turn, calls(call("run", cmd="ls"))).reward == 1  # another arg name
    sc = shell.score(turn, calls(call("run", path="ls")))
    assert (sc.reward, sc.valid) == (0.0, False) and "without a command" in sc.reason
    assert shell.score(turn, calls(call("delete_everything", command="ls"))).reward == 0
    msg_turn = shell_turn(None, tid="shape/2", message="There are three files in the workspace.")
    assert shell.score(msg_turn, run("ls")).reward == 0  # a command is not an answer
    assert shell.score(msg_turn, say(" There are three files in the workspace.\n")).reward == 1
    assert shell.score(msg_turn, say("There are three files in the\nworkspace.")).reward == 0
    assert shell.score(msg_turn, say("There are three files in the workspace")).reward == 0
    assert shell.score(msg_turn, say("I deleted everything.")).reward == 0


@needs_bwrap
@pytest.mark.parametrize("cand,reason", [
    ("curl -sS -m 1 http://1.1.1.1 || echo > /dev/tcp/1.1.1.1/80", "exit code"),
    ("python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 80), timeout=1)'",
     "exit code"),
    ("echo x > /etc/passwd && touch /root/x /usr/x && ls", "exit code"),
    ("touch /root/x || touch /usr/x || ls /root", "exit code"),
    ("cat /root/.bashrc", "exit code"),
    (":(){ :|:& };:", ""),
    ("yes", "cap"),
    ("sleep 100", "timed out"),
])
def test_shell_hacks_score_0_and_touch_nothing(shell, cand, reason):
    passwd = Path("/etc/passwd").read_bytes()
    turn = shell_turn("ls", tid="hack/ls")
    sc = shell.score(turn, run(cand))
    assert sc.reward == 0.0 and reason in sc.reason, sc.reason
    assert Path("/etc/passwd").read_bytes() == passwd
    assert not Path("/root/x").exists() and not Path("/usr/x").exists()


@needs_bwrap
def test_shell_expert_cached_and_samples_isolated(shell):
    """K samples: one expert run; a sample that deletes files cannot affect the next one."""
    turn = shell_turn("cat notes.txt | wc -l", tid="cache/1")
    assert shell.score(turn, run("rm -rf ./* ; echo 4")).reward == 0  # files differ
    assert shell.score(turn, run("wc -l < notes.txt")).reward == 1  # fresh copy again
    n = len(shell._cache)
    shell.score_batch([turn] * 4, [run("grep -c '' notes.txt")] * 4)
    assert len(shell._cache) == n


@needs_bwrap
def test_shell_options(tmp_path):
    # a constant expert (its turn is unverifiable with probes): the options alone
    v = get_verifier("shell", order_insensitive_lines=True, tool_names=["terminal"],
                     arg_names=["script"], workers=1, probes=False)
    turn = Turn(id="o/1", trajectory_id="o", turn=0, context=[],
                expected=calls(call("terminal", script="printf 'b\\na\\n'")),
                metadata={"world_config": {"workspace": {"x": "1"}}})
    assert v.score(turn, calls(call("terminal", script="printf 'a\\nb\\n'"))).reward == 1
    assert v.score(turn, calls(call("run", command="printf 'a\\nb\\n'"))).reward == 0
    with pytest.raises(Exception):
        get_verifier("shell", no_such_option=1)
    v.close()


@needs_bwrap
def test_shell_stderr_is_compared_as_its_messages_not_their_order():
    """With compare_stderr, a pipeline whose processes fail at once is its own equal every time
    (their messages reach stderr in the scheduler's order), and a command whose messages
    differ, with stdout, exit code and files the same, still scores 0."""
    v = get_verifier("shell", compare_stderr=True, timeout_s=5.0, workers=1)
    try:
        racy = "cat m1.txt | cat m2.txt | cat m3.txt | nosuchcmd"
        # A fresh turn id each time: the expert's command runs again too, not from the cache.
        assert all(v.score(shell_turn(racy, tid=f"r/{i}"), run(racy)).reward == 1 for i in range(8))
        turn = shell_turn(racy)
        other = v.score(turn, run("cat m1.txt | cat m2.txt | cat m4.txt | nosuchcmd"))
        assert other.reward == 0 and "stderr differs" in other.reason
        fewer = v.score(turn, run("cat m1.txt | cat m2.txt | nosuchcmd"))
        assert fewer.reward == 0 and "stderr differs" in fewer.reason
    finally:
        v.close()


# ---------------------------------------------------------------- state


class KVWorld:
    """A dict-backed key-value store: set/get/delete/list (a test world, not the testbed's)."""
    name = "kv_test"

    def reset(self, config: dict[str, Any]) -> None:
        self.data = dict(config.get("data", {}))

    def execute(self, name: str, arguments: dict[str, Any]) -> str:
        if name == "set":
            self.data[str(arguments["key"])] = arguments["value"]
            return json.dumps({"ok": True, "key": arguments["key"]})
        if name == "get":
            return json.dumps({"value": self.data.get(str(arguments.get("key")))})
        if name == "delete":
            return json.dumps({"deleted": self.data.pop(str(arguments.get("key")), None)
                               is not None})
        if name == "list":
            return json.dumps(sorted(self.data))
        if name == "explode":
            raise RuntimeError("boom")
        return f"error: unknown tool {name}"

    def snapshot(self) -> Any:
        return self.data

    def success(self, goal: dict[str, Any], final_message: str | None) -> bool:
        return all(self.data.get(k) == v for k, v in goal.items())


register_world("kv_test", KVWorld)


def kv_turn(expected: Message, context: list[Message] | None = None, world: str = "kv_test",
            tid: str = "kv/1") -> Turn:
    return Turn(id=tid, trajectory_id="kv", turn=1, domain=world,
                context=[Message(role="user", content="do it")] + (context or []),
                expected=expected, metadata={"world": world,
                                             "world_config": {"data": {"a": 1, "b": 2}}})


def test_state_equivalence_by_execution():
    v = get_verifier("state")
    turn = kv_turn(calls(call("set", key="c", value=3)))
    assert v.score(turn, calls(call("set", value=3, key="c"))).reward == 1  # key order
    assert v.score(turn, calls(call("set", key="c", value=3.0))).reward == 1  # 3 == 3.0 in JSON
    assert v.score(turn, calls(call("set", key="c", value=4))).reward == 0
    sc = v.score(turn, calls(call("set", key="c", value=3), call("delete", key="a")))
    assert sc.reward == 0 and "state" in sc.reason
    read = kv_turn(calls(call("get", key="a"), call("get", key="b")), tid="kv/2")
    assert v.score(read, calls(call("get", key="b"), call("get", key="a"))).reward == 1
    sc = v.score(read, calls(call("get", key="a"), call("get", key="a")))
    assert sc.reward == 0 and "observations" in sc.reason
    assert v.score(read, calls(call("get", key="a"))).reward == 0


def test_state_replays_context_and_isolates_samples():
    v = get_verifier("state")
    ctx = [calls(call("set", key="z", value=9)), tool('{"ok":true}', "c_set")]
    turn = kv_turn(calls(call("get", key="z")), ctx, tid="kv/3")
    assert v.score(turn, calls(call("get", key="z"))).reward == 1
    # a sample that deletes z must not leak into the next sample's world (another call id: a
    # new action to the verdict cache, so the world runs again)
    assert v.score(turn, calls(call("delete", key="z"))).reward == 0
    again = call("get", key="z").model_copy(update={"id": "c_again"})
    assert v.score(turn, calls(again)).reward == 1
    delete = kv_turn(calls(call("delete", key="a")), tid="kv/4")
    assert [s.reward for s in v.score_batch([delete] * 3, [calls(call("delete", key="a"))] * 3)] \
        == [1.0, 1.0, 1.0]


class CountingKVWorld(KVWorld):
    """KVWorld that counts the calls it executes (class-wide: the verifier builds a world per sample)."""
    name = "kv_counting"
    executed = 0

    def execute(self, name: str, arguments: dict[str, Any]) -> str:
        CountingKVWorld.executed += 1
        return super().execute(name, arguments)


register_world("kv_counting", CountingKVWorld)


def test_state_verdict_cache_runs_an_action_once_and_never_pays_another():
    """The same action on the same turn, in later batches: the cached verdict, no execution.
    Attacks on the key: one changed argument, the same action on another turn (another context)
    and the expert's action with a changed config each run and get their own verdict."""
    v = get_verifier("state")
    turn = kv_turn(calls(call("set", key="c", value=3)), world="kv_counting", tid="kv/c1")
    right, wrong = calls(call("set", key="c", value=3)), calls(call("set", key="c", value=4))
    assert [s.reward for s in v.score_batch([turn, turn], [right, wrong])] == [1.0, 0.0]
    runs = CountingKVWorld.executed
    assert [s.reward for s in v.score_batch([turn] * 3, [right, wrong, right])] == [1.0, 0.0, 1.0]
    assert CountingKVWorld.executed == runs  # every verdict came from the cache
    off_by_one = calls(call("set", key="c", value=30))
    assert v.score(turn, off_by_one).reward == 0 and CountingKVWorld.executed > runs
    other = kv_turn(calls(call("set", key="c", value=4)), world="kv_counting", tid="kv/c1")
    assert v.score(other, right).reward == 0 and v.score(other, wrong).reward == 1
    moved = turn.model_copy(update={"metadata": {**turn.metadata,
                                                 "world_config": {"data": {"c": 3}}}})
    assert v.score(moved, right).reward == 1 and v.score(moved, calls(call("delete", key="c"))).reward == 0
    uncached = get_verifier("state", cache_verdicts=0)
    uncached.score(turn, right)  # the expert's run is cached even so
    runs = CountingKVWorld.executed
    uncached.score(turn, right), uncached.score(turn, right)
    assert CountingKVWorld.executed == runs + 2  # the action ran again each time


class FlakyKVWorld(KVWorld):
    """KVWorld whose second build fails (a transient failure: the sandbox out of processes)."""
    name = "kv_flaky"
    builds = 0

    def reset(self, config: dict[str, Any]) -> None:
        FlakyKVWorld.builds += 1
        if FlakyKVWorld.builds == 2:
            raise OSError("resource temporarily unavailable")
        super().reset(config)


register_world("kv_flaky", FlakyKVWorld)


def test_state_caches_do_not_keep_a_world_that_failed_to_build():
    v = get_verifier("state")
    turn = kv_turn(calls(call("set", key="c", value=3)), world="kv_flaky", tid="kv/f1")
    right = calls(call("set", key="c", value=3))
    FlakyKVWorld.builds = 1  # the next build fails, the ones after it succeed
    first = v.score(turn, right)
    assert (first.reward, first.valid) == (0.0, False) and "rebuilt" in first.reason
    assert v.score(turn, right).reward == 1.0  # tried again, not a kept failure
    runs = FlakyKVWorld.builds
    assert v.score(turn, right).reward == 1.0 and FlakyKVWorld.builds == runs  # kept once valid


def test_state_failures_and_messages():
    v = get_verifier("state")
    unknown = kv_turn(calls(call("get", key="a")), world="no_such_world", tid="kv/5")
    sc = v.score(unknown, calls(call("get", key="a")))
    assert (sc.reward, sc.valid) == (0.0, False) and "no_such_world" in sc.reason
    turn = kv_turn(calls(call("get", key="a")), tid="kv/6")
    sc = v.score(turn, calls(call("explode")))
    assert sc.reward == 0 and "boom" in sc.reason
    assert v.score(turn, say("a is 1")).reward == 0
    assert v.score(turn, None).valid is False
    bad = calls(ToolCall(function=FunctionCall(name="get", arguments="{not json")))
    assert v.score(turn, bad) == v.score(turn, bad) and v.score(turn, bad).valid is False
    answer = kv_turn(say("The value of a is 1."), tid="kv/7")
    assert v.score(answer, say(" The value of a is 1.\n")).reward == 1  # the ends trimmed
    assert v.score(answer, say("The value of a  is 1.")).reward == 0  # the text is not the same
    assert v.score(answer, say("the value of a is 1")).reward == 0  # not proven the same
    assert v.score(answer, calls(call("get", key="a"))).reward == 0


# ---------------------------------------------------------------- judge


def _norm(s: str) -> str:
    return re.sub(r"[^a-z0-9 ]", "", s.lower()).strip()


def fair(a: str, b: str) -> str:
    return ("<think>compare</think>\nVERDICT: YES" if _norm(a) == _norm(b)
            else "They differ.\nVERDICT: NO")


def biased(a: str, b: str) -> str:
    return "YES" if "paris" in a.lower() else "NO"  # likes whatever sits in position A


QA = Turn(id="q/1", trajectory_id="q", turn=1, expected=say("The capital is Paris."),
          context=[Message(role="user", content="What is the capital of France?")])


def test_judge_equivalence_and_cache(tmp_path):
    srv = FakeJudge(fair)
    try:
        cache = tmp_path / "judge.jsonl"
        v = get_verifier("judge", base_url=srv.url, model="m", cache_path=str(cache))
        assert v.score(QA, say("the capital is paris")).reward == 1
        assert v.score(QA, say("The capital is Lyon.")).reward == 0
        n = srv.requests
        assert v.score(QA, say("the capital is paris")).reward == 1
        assert srv.requests == n  # answered from the cache
        v2 = get_verifier("judge", base_url=srv.url, model="m", cache_path=str(cache))
        assert v2.score(QA, say("the capital is paris")).reward == 1 and srv.requests == n
        assert v.score(QA, calls(call("search", q="paris"))).reward == 0  # call vs message
        assert srv.requests == n
        scores = v.score_batch([QA] * 3, [say("THE CAPITAL IS PARIS"), say("x"), None])
        assert [s.reward for s in scores] == [1, 0, 0] and scores[2].valid is False
    finally:
        srv.close()


def test_judge_swap_check_defeats_position_bias():
    srv = FakeJudge(biased)
    try:
        wrong = say("The capital is London.")
        no_swap = get_verifier("judge", base_url=srv.url, swap_check=False)
        assert no_swap.score(QA, wrong).reward == 1  # the bias leaks reward without the check
        sc = get_verifier("judge", base_url=srv.url).score(QA, wrong)
        assert sc.reward == 0 and "swapped" in sc.reason
    finally:
        srv.close()


def test_judge_down_is_a_clear_error():
    srv = FakeJudge(fair)
    url = srv.url
    srv.close()
    v = get_verifier("judge", base_url=url, retries=0, timeout_s=2)
    with pytest.raises(JudgeUnavailable, match=re.escape(url)):
        v.score(QA, say("Paris"))


@pytest.mark.parametrize("reply,verdict", [
    ("VERDICT: YES", True), ("verdict: no", False), ("<think>yes? no...</think>\nVERDICT: NO", False),
    ("A and B both cancel o12.\n  VERDICT:YES  ", True),
    ("YES", None), ("They are equivalent.", None), ("They are NOT functionally equivalent.", None),
    ("Equivalent? No.", None), ("VERDICT: YES, they are", None), ("**Verdict:** yes", True),
    ("VERDICT: NO\nVERDICT: YES", None), ("VERDICT: YES\nThey differ.", None),
    ("", None), ("maybe", None), ("<think>unfinished\nVERDICT: YES", None),
])
def test_parse_verdict(reply, verdict):
    assert parse_verdict(reply) is verdict


@needs_bwrap
def test_shell_cache_eviction_under_threads():
    """More turns than the cache holds, scored concurrently: evicted workspaces in use by
    another thread are kept until released, and nothing is left behind."""
    v = get_verifier("shell", cache_turns=2, workers=4, timeout_s=2.0)
    turns = [shell_turn(f"cat notes.txt; echo {i}", tid=f"evict/{i}") for i in range(5)]
    cands = [run(f"cat ./notes.txt && echo {i}") for i in range(5)]
    scores = v.score_batch(turns * 2, cands * 2)
    assert [s.reward for s in scores] == [1.0] * 10, [s.reason for s in scores]
    bases = [b for b, _ in v._cache.values()]
    assert len(bases) == 2 and not v._users and not v._evicted
    v.close()
    assert not any(b.exists() for b in bases)


@pytest.mark.parametrize("name", ["state", "shell", "judge"])
def test_yaml_configs_document_the_defaults(name):
    import importlib

    import yaml

    module = importlib.import_module(f"pivotrl.verifiers.{name}")
    config = getattr(module, f"{name.capitalize()}Config")
    path = Path(__file__).resolve().parents[1] / "configs" / "verifiers" / f"{name}.yaml"
    assert yaml.safe_load(path.read_text()) == config().model_dump()
    assert all(field.description for field in config.model_fields.values())
