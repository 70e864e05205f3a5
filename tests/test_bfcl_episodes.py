"""BFCL multi-turn as a real domain: the episode runner drives BFCL's backends user turn by user
turn, and success is BFCL's own multi_turn_checker (BfclWorld.success after begin_turn())."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

pytest.importorskip("bfcl_eval")

from pivotrl_testbed.bfcl import CATEGORIES, decode_turns, write_bfcl  # noqa: E402
from pivotrl_testbed.episodes import (ModelPolicy, RandomPolicy, ScriptedPolicy, run_episodes,  # noqa: E402
                              split_user_turns, success_rate)
from pivotrl_testbed.evaluate import BFCL_STEP_LIMIT, EvalConfig, evaluate_model  # noqa: E402
from pivotrl.io.records import Message, Trajectory, check_trajectory, iter_valid  # noqa: E402


@pytest.fixture(scope="module")
def bfcl(tmp_path_factory):
    out = tmp_path_factory.mktemp("bfcl_episodes") / "bfcl.jsonl"
    write_bfcl(out)
    by_cat: dict[str, list[Trajectory]] = defaultdict(list)
    for traj in iter_valid(out, Trajectory):
        by_cat[traj.metadata["category"]].append(traj)
    return out, dict(by_cat)


def _sample(by_cat, n):
    return [t for c in CATEGORIES for t in by_cat[c][:n]]


class _Fixed:
    def __init__(self, text):
        self.text, self.calls = text, 0

    def act(self, context, tools):
        self.calls += 1
        return self.text


def test_split_user_turns():
    msgs = [Message(role="system", content="s"), Message(role="user", content="a"),
            Message(role="assistant", content="x"), Message(role="user", content="b"),
            Message(role="user", content="b2"), Message(role="assistant", content="y"),
            Message(role="tool", tool_call_id="1", content="o"), Message(role="user", content="c")]
    head, later = split_user_turns(msgs)
    assert [m.content for m in head] == ["s", "a"]
    assert [[m.content for m in t] for t in later] == [["b", "b2"], ["c"]]
    assert split_user_turns(msgs[:2]) == (msgs[:2], [])


def test_expert_replay_passes_bfcl_checker_on_all_800(bfcl):
    """Every task, every user turn, through render → parse → execute in a live BFCL world."""
    _, by_cat = bfcl
    for category in CATEGORIES:
        # one policy per category: base and long_context tasks open with the same question and
        # tools, so no context-only policy can tell them apart before the first observation
        tasks = by_cat[category]
        results = run_episodes("bfcl", tasks, ScriptedPolicy(tasks), max_turns=0)
        failed = [r.trajectory.id for r in results if not r.success]
        assert failed == [], (category, failed[:5])
        for r, t in zip(results, tasks):
            assert decode_turns(r.trajectory.messages) == decode_turns(t.messages)
            assert r.model_turns == sum(m.role == "assistant" for m in t.messages)
            assert r.trajectory.metadata["user_turns"] == sum(m.role == "user" for m in t.messages)
            assert r.invalid_actions == 0


def test_bfcl_step_limit_force_quits_like_bfcl(bfcl):
    """BFCL quits an episode once a user turn runs more than MAXIMUM_STEP_LIMIT steps; the
    expert replays one call per step, so exactly its tasks with a longer turn fail."""
    _, by_cat = bfcl
    assert BFCL_STEP_LIMIT == 20
    tasks = by_cat["long_context"]

    def quits(t):
        calls = [sum(len(step) for step in turn) for turn in decode_turns(t.messages)]
        # the 21st step trips the limit; in the last turn that only loses the closing text
        return any(n > BFCL_STEP_LIMIT + 1 or (n == BFCL_STEP_LIMIT + 1 and i < len(calls) - 1)
                   for i, n in enumerate(calls))

    long = [t for t in tasks if quits(t)]
    assert long, "BFCL long_context has turns longer than the step limit"
    chosen = long + tasks[:10]
    results = run_episodes("bfcl", chosen, ScriptedPolicy(chosen), max_turns=0,
                           max_steps_per_turn=BFCL_STEP_LIMIT)
    for r, t in zip(results, chosen):
        assert r.success == (not quits(t)), t.id
        if quits(t):
            assert any("forced to quit" in n for n in r.trajectory.metadata["notes"])


def test_held_out_functions_arrive_at_their_turn(bfcl):
    _, by_cat = bfcl
    tasks = by_cat["miss_func"][:10]
    expert = ScriptedPolicy(tasks)
    seen = []

    class Watch:
        def act(self, context, tools):
            users = sum(m.role == "user" for m in context)
            seen.append((context[0].content, users, {t["function"]["name"] for t in tools}))
            return expert.act(context, tools)

    results = run_episodes("bfcl", tasks, Watch(), max_turns=0)
    assert success_rate(results) == 1.0
    for task in tasks:
        (turn, names), = task.metadata["missed_function"].items()
        first = task.messages[0].content
        for _, users, tools in (s for s in seen if s[0] == first):
            # user turn k (0-based) is live once k + 1 user messages are in the context
            assert (set(names) <= tools) == (users > int(turn)), (task.id, users, turn)


def test_the_checker_judges_every_turn(bfcl):
    """Skipping the last user turn's calls, or stopping before the last user turn, fails,
    though every earlier turn matched BFCL's ground truth."""
    _, by_cat = bfcl
    tasks = [t for t in by_cat["base"][:20] if t.metadata["goal"]["ground_truth"][-1]][:8]
    expert = ScriptedPolicy(tasks)

    total = {t.messages[0].content: sum(m.role == "user" for m in t.messages) for t in tasks}
    assert len(total) == len(tasks)

    class LazyAtTheEnd:
        def act(self, context, tools):
            if sum(m.role == "user" for m in context) == total[context[0].content]:
                return "I did it."
            return expert.act(context, tools)

    results = run_episodes("bfcl", tasks, LazyAtTheEnd(), max_turns=0)
    assert success_rate(results) == 0.0
    # a turn cap that ends the episode after the first user turn: the rest is never played
    msgs = tasks[0].messages
    second_user = next(i for i, m in enumerate(msgs) if i and m.role == "user")
    first_turn = sum(m.role == "assistant" for m in msgs[:second_user])
    stop = run_episodes("bfcl", tasks[:1], expert, max_turns=first_turn)[0]
    assert not stop.success and stop.trajectory.metadata["user_turns"] == 1
    assert any("never delivered" in n for n in stop.trajectory.metadata["notes"])


def test_invalid_actions_end_the_user_turn_not_the_episode(bfcl):
    _, by_cat = bfcl
    tasks = _sample(by_cat, 2)
    policy = _Fixed('<tool_call>\n{"name": "ls", "arguments": ')
    results = run_episodes("bfcl", tasks, policy, max_turns=0, max_steps_per_turn=BFCL_STEP_LIMIT)
    for r, t in zip(results, tasks):
        n_users = sum(m.role == "user" for m in t.messages)
        assert not r.success and r.model_turns == r.invalid_actions == n_users
        assert [m.content for m in r.trajectory.messages if m.role == "user"] == \
               [m.content for m in t.messages if m.role == "user"]
        assert check_trajectory(r.trajectory) is None


def test_random_policy_scores_near_zero(bfcl):
    _, by_cat = bfcl
    tasks = _sample(by_cat, 25)
    results = run_episodes("bfcl", tasks, RandomPolicy(seed=0), max_turns=0,
                           max_steps_per_turn=BFCL_STEP_LIMIT)
    assert success_rate(results) <= 0.02
    assert sum(r.model_turns for r in results) > len(tasks)  # it did act, turn after turn


def test_tiny_model_runs_bfcl_episodes(bfcl, tiny_model_dir):
    """BFCL's tool docs alone exceed the tiny model's window: each such turn is a counted
    invalid action; with a trimmed tool list the model really generates in BFCL's backends."""
    from pivotrl_testbed.testbed.tiny import load_tiny

    model, tok = load_tiny(tiny_model_dir)
    tasks = _sample(by_cat := bfcl[1], 1)
    policy = ModelPolicy(model, tok, max_new_tokens=16, batch_size=4)
    results = run_episodes("bfcl", tasks, policy, max_turns=0, max_steps_per_turn=BFCL_STEP_LIMIT)
    n_users = sum(m.role == "user" for t in tasks for m in t.messages)
    assert policy.overlong_prompts == n_users == sum(r.invalid_actions for r in results)
    assert not any(r.success for r in results)
    # the same task with only the function of its first call fits the window
    task = by_cat["base"][0]
    used = {next(m for m in task.messages if m.tool_calls).tool_calls[0].function.name}
    small = task.model_copy(update={"tools": [t for t in task.tools if t["function"]["name"] in used]})
    policy = ModelPolicy(model, tok, max_new_tokens=16)
    r = run_episodes("bfcl", [small], policy, max_turns=6, max_steps_per_turn=BFCL_STEP_LIMIT)[0]
    assert policy.generated_tokens > 0 and 1 <= r.model_turns <= 6 and not r.success
    assert check_trajectory(r.trajectory) is None


def test_evaluate_with_bfcl_file(bfcl, tiny_model_dir, tmp_path):
    from typer.testing import CliRunner

    from pivotrl.cli import app
    from pivotrl_testbed.testbed.tiny import load_tiny

    path, _ = bfcl
    model, tok = load_tiny(tiny_model_dir)
    result = evaluate_model(model, tok, None, EvalConfig(episodes=1), bfcl=path)
    assert set(result["in_domain"]) == {f"bfcl_{c}" for c in CATEGORIES}
    for v in result["in_domain"].values():
        assert v["episodes"] == 1 and v["success"] == 0.0 and 0 <= v["ci95"][0] <= v["ci95"][1] <= 1
        assert v["model_turns"] == v["user_turns"] >= 1
    out = tmp_path / "RESULT.json"
    cli = CliRunner().invoke(app, ["testbed", "evaluate", "--model", str(tiny_model_dir), "--bfcl", str(path),
                                   "--episodes", "1", "--out", str(out)])
    assert cli.exit_code == 0, cli.output
    written = json.loads(out.read_text())
    assert set(written["in_domain"]) == set(result["in_domain"]) and written["ood"] == {}
    assert "bfcl_miss_func" in out.with_suffix(".md").read_text()
    missing = CliRunner().invoke(app, ["testbed", "evaluate", "--model", str(tiny_model_dir), "--out", str(out)])
    assert missing.exit_code == 2
