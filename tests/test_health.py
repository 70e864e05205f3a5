"""Nothing silent: collapsed measures and failing worlds are flagged with their cause."""

from __future__ import annotations

from pivotrl.io.records import Message
from pivotrl_testbed.health import episode_failure, flags


def _rows(method, n, wins, *, measure="episode", step=10, seed=0, failure=None, world="terminal"):
    return [{"method": method, "world": world, "seed": seed, "lr": 0.0 if method == "base" else 1e-4,
             "step": 0 if method == "base" else step, "split": "eval", "measure": measure,
             "item": f"t{i}", "cluster": f"t{i}", "outcome": 1.0 if i < wins else 0.0,
             "decoding": "greedy", **({"failure": failure} if failure and i >= wins else {})}
            for i in range(n)]


def test_zero_successes_where_the_base_had_many_is_flagged_with_the_reference():
    items = _rows("base", 100, 36, seed=0) + _rows("base", 100, 36, seed=1) + _rows("sft", 100, 0)
    got = flags(items)
    assert len(got) == 1 and got[0]["kind"] == "collapse" and got[0]["method"] == "sft"
    assert "0 of 100 where the base on these items had 0.360" in got[0]["why"]
    assert "no world failure was recorded" in got[0]["why"]
    # a real drop that is not a collapse, and a 0 that a low reference explains, pass quietly
    assert flags(_rows("base", 100, 36) + _rows("sft", 100, 20)) == []
    assert flags(_rows("base", 100, 2) + _rows("sft", 100, 0)) == []
    assert flags(_rows("base", 5, 2) + _rows("sft", 5, 0)) == []  # 0.6^5: not implausible


def test_the_base_is_checked_against_its_build_record():
    build = {"base": {"in_domain": {"terminal": {"success": 0.34, "turn_accuracy": 0.72}},
                      "ood": {"next": {"accuracy": 0.97}}}}
    got = flags(_rows("base", 100, 0) + _rows("base", 100, 0, seed=1), build)
    assert len(got) == 1 and "where its build record had 0.340" in got[0]["why"]  # once, not per seed
    assert flags(_rows("base", 100, 0, measure="ood"), build)[0]["kind"] == "collapse"
    assert flags(_rows("base", 100, 30), build) == []


def test_a_failing_world_is_flagged_with_its_cause_whatever_the_rate():
    cause = "world could not be rebuilt: OSError: out of processes"
    got = flags(_rows("base", 100, 36) + _rows("sft", 100, 30, failure=cause))
    assert [g["kind"] for g in got] == ["world failure"] and got[0]["failures"] == 70
    assert cause in got[0]["why"]
    got = flags(_rows("base", 100, 36) + _rows("sft", 100, 0, failure=cause))
    assert got[0]["kind"] == "collapse" and cause in got[0]["why"]


def test_episode_failures_are_told_from_the_commands_own_errors():
    def tool(text):
        return Message(role="tool", tool_call_id="c", content=text)

    assert episode_failure([tool("error: OSError: [Errno 11] Resource temporarily unavailable")])
    assert episode_failure([tool("bwrap: Creating new namespace failed: No space left on device")])
    assert episode_failure([], ["success check failed: KeyError 'files'"])
    for normal in ("error: unknown tool find", '{"error":"no order o12"}', "grep: x: No such file",
                   "error: command must be a non-empty string"):
        assert episode_failure([tool(normal)], ["turn limit 8 reached"]) is None


def test_evaluation_records_the_failure_on_the_items_it_decided(monkeypatch):
    # A world that raises on every call: the episodes and the state verifier's turns fail for
    # the world's reason, and their item rows say so.
    import pivotrl_testbed.episodes as episodes
    from pivotrl_testbed.evaluate import EvalConfig, evaluate_world
    from pivotrl_testbed.testbed.experts import run_expert
    from pivotrl_testbed.testbed.tasks import make_tasks
    from pivotrl_testbed.testbed.toolshop import ToolshopWorld

    trajs = [run_expert(t, 0) for t in make_tasks("toolshop", "eval", 2)]
    monkeypatch.setattr(episodes, "ModelPolicy", lambda *a, **kw: episodes.ScriptedPolicy(trajs))

    def broken(self, name, arguments):
        raise OSError("backend down")

    monkeypatch.setattr(ToolshopWorld, "execute", broken)
    items: list[dict] = []
    evaluate_world(None, None, "toolshop", trajs,
                   EvalConfig(episodes=2, turn_trajectories=2, verifiers={"toolshop": "state"}), items)
    episodes_rows = [r for r in items if r["measure"] == "episode"]
    assert episodes_rows and all("OSError: backend down" in r["failure"] for r in episodes_rows)
    turn_rows = [r for r in items if r["measure"] == "turn"]
    assert any("backend down" in r.get("failure", "") for r in turn_rows)


def test_the_two_ood_kinds_are_checked_against_their_own_reference():
    """A base at 0 on the agentic-format families is judged against the build record's agentic
    accuracy, not against the non-agentic families' pooled with it."""
    build = {"base": {"in_domain": {}, "ood": {"next": {"accuracy": 0.97}, "reverse": {"accuracy": 0.95},
                                               "no_tool_fits": {"accuracy": 0.03}}}}
    agentic = [{**r, "item": f"no_tool_fits-{i}", "cluster": f"no_tool_fits-{i}"}
               for i, r in enumerate(_rows("base", 100, 0, measure="ood"))]
    assert flags(agentic, build) == []  # 0.97^100 ≈ 0.05: plausible at its own reference
    plain = [{**r, "item": f"next-{i}", "cluster": f"next-{i}"}
             for i, r in enumerate(_rows("base", 100, 0, measure="ood"))]
    got = flags(plain, build)
    assert len(got) == 1 and got[0]["measure"] == "ood" and "had 0.960" in got[0]["why"]
