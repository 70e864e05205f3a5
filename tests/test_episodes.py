"""The episode runner: expert 100%, random ≈ 0%, invalid actions and turn limits, model policy."""

from __future__ import annotations

import json

import pytest

from pivotrl.sandbox import bwrap as sandbox
from pivotrl_testbed.episodes import (ModelPolicy, RandomPolicy, ScriptedPolicy, expert_turns,
                              run_episodes, success_rate, turn_accuracy)
from pivotrl.io.records import check_trajectory
from pivotrl_testbed.testbed.experts import generate_trajectories
from pivotrl_testbed.testbed.tasks import make_tasks
from pivotrl.verifiers import get_verifier

needs_sandbox = pytest.mark.skipif(not sandbox.sandbox_available(), reason="bubblewrap unavailable")


def test_scripted_expert_scores_100_percent_and_counts_turns():
    tasks = make_tasks("toolshop", "eval", 60)
    results = run_episodes("toolshop", tasks, ScriptedPolicy(tasks, seed=5))
    assert success_rate(results) == 1.0
    expert = generate_trajectories("toolshop", "eval", 60, seed=5)
    # whole trajectories work as tasks too: only their opening is used
    again = run_episodes("toolshop", expert, ScriptedPolicy(tasks, seed=5))
    assert [r.trajectory.messages for r in again] == [r.trajectory.messages for r in results]
    for r, e in zip(results, expert):
        n_assistant = sum(m.role == "assistant" for m in r.trajectory.messages)
        assert r.model_turns == n_assistant and r.invalid_actions == 0
        # the runner's trajectory is the expert's, through render → parse → execute
        assert r.trajectory.messages == e.messages
        assert check_trajectory(r.trajectory) is None
        assert r.final_message == e.messages[-1].content


@needs_sandbox
def test_scripted_expert_scores_100_percent_on_terminal():
    tasks = make_tasks("terminal", "eval", 10)
    results = run_episodes("terminal", tasks, ScriptedPolicy(tasks, seed=1))
    assert success_rate(results) == 1.0


def test_random_policy_scores_near_zero():
    tasks = make_tasks("toolshop", "eval", 100)
    results = run_episodes("toolshop", tasks, RandomPolicy(seed=0))
    assert success_rate(results) <= 0.03
    assert all(1 <= r.model_turns <= 8 for r in results)
    assert all(check_trajectory(r.trajectory) is None for r in results)


@needs_sandbox
def test_terminal_episodes_in_threads_are_the_episodes_in_one(monkeypatch):
    """The terminal world is `concurrent`: its episodes step in threads, with the same outcome,
    call for call, as one thread (random actions: errors, writes and reads interleave)."""
    import pivotrl_testbed.episodes as episodes

    assert episodes.concurrent_world("terminal") and not episodes.concurrent_world("toolshop")
    tasks = make_tasks("terminal", "eval", 6)
    threaded = run_episodes("terminal", tasks, RandomPolicy(seed=3), max_turns=4)
    monkeypatch.setattr(episodes, "concurrent_world", lambda name: False)
    single = run_episodes("terminal", tasks, RandomPolicy(seed=3), max_turns=4)
    assert [r.trajectory for r in threaded] == [r.trajectory for r in single]
    assert sum(m.role == "tool" for r in single for m in r.trajectory.messages) >= 6


@needs_sandbox
def test_random_policy_scores_near_zero_on_terminal():
    tasks = make_tasks("terminal", "eval", 8)
    assert success_rate(run_episodes("terminal", tasks, RandomPolicy(seed=0), max_turns=3)) == 0.0


class _Fixed:
    def __init__(self, text: str):
        self.text, self.calls = text, 0

    def act(self, context, tools):
        self.calls += 1
        return self.text


def test_invalid_action_ends_the_episode_as_failure():
    tasks = make_tasks("toolshop", "eval", 3)
    bad = '<tool_call>\n{"name": "find_customer", "arguments": {"email": '
    results = run_episodes("toolshop", tasks, _Fixed(bad))
    for r in results:
        assert not r.success and r.model_turns == 1 and r.invalid_actions == 1
        assert r.trajectory.messages[-1].content == bad
        assert check_trajectory(r.trajectory) is None
    empty = run_episodes("toolshop", tasks[:1], _Fixed(""))[0]
    assert empty.invalid_actions == 1 and check_trajectory(empty.trajectory) is None


def test_turn_limit_and_errors_are_observations():
    tasks = make_tasks("toolshop", "eval", 2)
    loop = '<tool_call>\n{"name": "get_order", "arguments": {"order_id": "nope"}}\n</tool_call>'
    policy = _Fixed(loop)
    results = run_episodes("toolshop", tasks, policy, max_turns=4)
    assert policy.calls == 8
    for r in results:
        assert not r.success and r.model_turns == 4 and r.final_message is None
        tool_msgs = [m for m in r.trajectory.messages if m.role == "tool"]
        assert len(tool_msgs) == 4 and all("error" in json.loads(m.content) for m in tool_msgs)
        ids = [c.id for m in r.trajectory.messages for c in (m.tool_calls or [])]
        assert len(set(ids)) == len(ids)  # unique call ids within a trajectory


def test_the_agent_meets_the_consequences_of_its_actions():
    """Same request, a wrong first step: the episode continues from the error it caused."""
    tasks = make_tasks("toolshop", "eval", 20)
    expert = ScriptedPolicy(tasks, seed=0)

    class WrongFirst:
        def act(self, context, tools):
            if not any(m.role == "tool" for m in context):
                return '<tool_call>\n{"name": "find_customer", "arguments": {"email": "no@x.y"}}\n</tool_call>'
            return expert.act(context, tools)

    results = run_episodes("toolshop", tasks, WrongFirst())
    # the expert reads the error observation and gives up: every episode fails
    assert success_rate(results) == 0.0
    assert all("error" in r.trajectory.messages[3].content for r in results)


def test_turn_accuracy_functional_vs_exact():
    trajs = generate_trajectories("toolshop", "train", 30, seed=0)
    tasks = make_tasks("toolshop", "train", 30)
    turns = [t for t in expert_turns(trajs) if t.expected.tool_calls]
    other_seed = ScriptedPolicy(tasks, seed=9)  # the expert, picking other equivalent forms
    state = turn_accuracy(other_seed, turns, get_verifier("state"))
    exact = turn_accuracy(other_seed, turns, get_verifier("exact"))
    assert state.accuracy == 1.0 and state.n == len(turns) and state.invalid == 0
    assert exact.accuracy < 0.9  # exact match is unfair to equivalent forms
    rand = turn_accuracy(RandomPolicy(seed=0), turns, get_verifier("state"))
    assert rand.accuracy < 0.1


def test_model_policy_runs_batched_episodes(tiny_model_dir):
    from pivotrl_testbed.testbed.tiny import load_tiny

    model, tok = load_tiny(tiny_model_dir)
    tasks = make_tasks("toolshop", "eval", 3)
    runs = []
    for _ in range(2):
        policy = ModelPolicy(model, tok, max_new_tokens=12, temperature=0.0, seed=0, batch_size=2)
        runs.append(run_episodes("toolshop", tasks, policy, max_turns=2))
        assert policy.generated_tokens > 0
    for a, b in zip(*runs):
        assert a.trajectory.messages == b.trajectory.messages  # greedy: deterministic
        assert 1 <= a.model_turns <= 2 and not a.success
        assert check_trajectory(a.trajectory) is None
    sampled = ModelPolicy(model, tok, max_new_tokens=8, temperature=1.0, seed=3)
    texts = sampled.act_batch([t.messages for t in tasks], [t.tools for t in tasks])
    assert len(texts) == 3 and all(isinstance(t, str) for t in texts)


def test_scripted_policy_survives_foreign_contexts():
    """On states it did not make (a random policy's), the expert answers, never crashes."""
    from pivotrl.formats.actions import parse_completion

    from pivotrl.io.records import Message

    tasks = make_tasks("toolshop", "eval", 20)
    for r in run_episodes("toolshop", tasks, RandomPolicy(seed=1), max_turns=3):
        ctx = r.trajectory.messages
        assert parse_completion(ScriptedPolicy(tasks).act(ctx, tasks[0].tools)).valid
    term = make_tasks("terminal", "eval", 10)
    for t in term:
        ctx = t.messages + [Message(role="tool", tool_call_id="x", content="/work")]
        assert parse_completion(ScriptedPolicy(term).act(ctx, t.tools)).valid
