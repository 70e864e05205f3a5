"""Pivot selection on hand-made profiles: the rule on the binary outcome, budget order, baselines,
statistics, the plot and the CLI."""

from __future__ import annotations

import json
import statistics

import pytest
from typer.testing import CliRunner

from pivotrl.cli import app
from pivotrl.io.empty import EmptyResultError
from pivotrl.io.records import Profile, Turn, iter_valid, write_atomic
from pivotrl.select import LAMBDA_DIFF, SelectConfig, binary_std, select, select_file, success_rate


def prof(pid: str, rewards: list[float], domain: str = "shop", valid: bool = True) -> Profile:
    return Profile.model_validate({
        "id": pid, "trajectory_id": pid.split("/")[0], "turn": 1, "domain": domain,
        "context": [{"role": "user", "content": "hi"}],
        "expected": {"role": "assistant", "content": "ok"}, "k": len(rewards),
        "samples": [{"completion": f"c{i}", "reward": r, "valid": valid} for i, r in enumerate(rewards)],
        "reward_mean": statistics.fmean(rewards) if rewards else 0.0,
        "reward_std": statistics.pstdev(rewards) if rewards else 0.0})


FAIL = prof("fail/1", [0, 0, 0, 0], "bank", valid=False)
PASS = prof("pass/1", [1, 1, 1, 1])
HARD = prof("hard/1", [1, 0, 0, 0])  # success 0.25
MID = prof("mid/1", [1, 1, 0, 0], "bank")  # 0.5
EASY = prof("easy/1", [1, 1, 1, 0])  # 0.75: mixed but not < λ_diff 0.75
SHAPED_FAIL = prof("shaped/1", [0.1, 0.2, 0.3, 0.4])  # variance > 0, yet no sample succeeded
SHAPED_MIX = prof("shapedmix/1", [0.9, 0.2, 0.3, 0.1])  # one success ≥ 0.5
ALL = [FAIL, PASS, HARD, MID, EASY, SHAPED_FAIL, SHAPED_MIX]


def ids(ps):
    return [p.id for p in ps]


def test_the_rule_on_the_binary_outcome():
    assert LAMBDA_DIFF == 0.75
    kept = select(ALL, SelectConfig())
    # Input order kept; shaped all-fail dropped although its reward std > 0.
    assert ids(kept) == ["hard/1", "mid/1", "shapedmix/1"]
    assert SHAPED_FAIL.reward_std > 0 and binary_std(SHAPED_FAIL) == 0
    assert success_rate(SHAPED_MIX) == 0.25
    # A higher λ_diff admits the easy mixed turn; min_std removes low-variance ones.
    assert "easy/1" in ids(select(ALL, SelectConfig(lambda_diff=0.9)))
    # binary std: 0.25 → 0.433, 0.5 → 0.5; min_std 0.45 keeps only the 50/50 turn.
    assert ids(select(ALL, SelectConfig(min_std=0.45))) == ["mid/1"]
    # A success threshold of 0.35 turns the shaped "fail" group into a mixed one (1 of 4).
    assert "shaped/1" in ids(select(ALL, SelectConfig(success_threshold=0.35)))


def test_budget_drops_the_easiest_first():
    more = ALL + [prof("mid2/1", [1, 0, 1, 0]), prof("hard2/1", [0, 0, 0, 1, 0, 0, 0, 0])]
    # Pivots by success rate: hard2 0.125, hard 0.25, shapedmix 0.25, mid 0.5, mid2 0.5.
    assert ids(select(more, SelectConfig(budget=3))) == ["hard/1", "shapedmix/1", "hard2/1"]
    assert ids(select(more, SelectConfig(budget=1))) == ["hard2/1"]
    assert len(select(more, SelectConfig(budget=100))) == 5
    assert select(more, SelectConfig(budget=0)) == []


def test_baselines_all_and_random():
    assert ids(select(ALL, SelectConfig(strategy="all"))) == ids(ALL)
    rnd = select(ALL, SelectConfig(strategy="random", seed=1))
    assert len(rnd) == 3  # as many as the pivot rule keeps
    assert ids(rnd) == ids(select(ALL, SelectConfig(strategy="random", seed=1)))  # seeded
    seeds = {tuple(ids(select(ALL, SelectConfig(strategy="random", seed=s)))) for s in range(20)}
    assert len(seeds) > 1 and any(set(s) - {"hard/1", "mid/1", "shapedmix/1"} for s in seeds)
    assert len(select(ALL, SelectConfig(strategy="random", budget=5))) == 5
    # "all" with a budget keeps the hardest.
    assert ids(select(ALL, SelectConfig(strategy="all", budget=2))) == ["fail/1", "shaped/1"]


def test_select_file_statistics_plot_and_cli(tmp_path):
    path = tmp_path / "profile.jsonl"
    write_atomic(path, ALL)
    with path.open("a") as fh:
        fh.write("{bad line\n")
    out = tmp_path / "pivots.jsonl"
    stats = select_file(path, out, SelectConfig())
    assert ids(iter_valid(out, Profile)) == ["hard/1", "mid/1", "shapedmix/1"]
    saved = json.loads((tmp_path / "pivots.stats.json").read_text())
    assert saved == {**stats, "histogram": stats["histogram"]}
    assert (stats["all_fail"], stats["all_pass"], stats["mixed"]) == (2, 1, 4)
    assert stats["mixed_but_too_easy"] == 1 and stats["kept"] == 3 and stats["turns"] == 7
    assert stats["shaped_rewards"] is True and stats["rejected_lines"] == 1
    assert stats["per_domain"]["bank"] == {"turns": 2, "kept": 1, "kept_fraction": 0.5,
                                           "unverifiable": 0}
    assert stats["per_domain"]["shop"] == {"turns": 5, "kept": 2, "kept_fraction": 0.4,
                                           "unverifiable": 0}
    png = tmp_path / "pivots.hist.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert (tmp_path / "pivots.rejects.jsonl").exists()

    res = CliRunner().invoke(app, ["select", str(path), "--out", str(tmp_path / "b.jsonl"),
                                   "--budget", "1", "--no-plot"])
    assert res.exit_code == 0, res.output
    assert ids(iter_valid(tmp_path / "b.jsonl", Profile)) == ["hard/1"]
    assert not (tmp_path / "b.hist.png").exists()


def test_empty_profile_file_is_an_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(EmptyResultError, match="0 profiles: the file holds no records") as err:
        select_file(path, tmp_path / "p.jsonl", SelectConfig(), allow_empty=True)
    assert err.value.flag is None  # no input: nothing to allow


def test_no_pivot_is_an_error_unless_allowed(tmp_path):
    path = tmp_path / "profile.jsonl"
    write_atomic(path, [FAIL, PASS, EASY])
    with pytest.raises(EmptyResultError, match="0 pivots.*1 all fail, 1 all pass, 1 mixed but") as err:
        select_file(path, tmp_path / "p.jsonl", SelectConfig(), plot_png=False)
    assert "--allow-empty" in str(err.value) and err.value.result["turns"] == 3
    assert (tmp_path / "p.stats.json").exists()  # the outputs are written before the error
    stats = select_file(path, tmp_path / "q.jsonl", SelectConfig(), plot_png=False, allow_empty=True)
    assert stats["kept"] == 0 and (tmp_path / "q.jsonl").read_text() == ""


def test_a_turns_or_trajectory_file_is_named_for_what_it_is(tmp_path):
    turns = tmp_path / "turns.jsonl"
    write_atomic(turns, [Turn.model_validate(FAIL.model_dump(include=set(Turn.model_fields)))])
    with pytest.raises(EmptyResultError, match="file of turns, not profiles; run `pivotrl profile`"):
        select_file(turns, tmp_path / "p.jsonl", SelectConfig())
    with pytest.raises(EmptyResultError, match="file of trajectories, not profiles"):
        select_file("examples/trajectories.jsonl", tmp_path / "p.jsonl", SelectConfig())


def test_the_rule_alone_holds_nothing_per_profile_and_a_budget_only_pivots():
    """What a streamed selection keeps in memory: nothing for the paper's rule, (success, std,
    id) of each pivot under a budget, of each profile for the random baseline."""
    from pivotrl.select import Selection, score

    for cfg, held in ((SelectConfig(), 0), (SelectConfig(budget=2), 3),
                      (SelectConfig(strategy="random"), len(ALL))):
        selection = Selection(cfg)
        for p in ALL:
            selection.add(score(p))
        assert len(selection.candidates) == held, cfg
        assert [p.id for p in ALL if selection.keeps(score(p))] == ids(select(ALL, cfg))


@pytest.mark.parametrize("rewards,keep", [([0.0], False), ([1.0], False), ([], False)])
def test_degenerate_groups_are_never_pivots(rewards, keep):
    assert bool(select([prof("x/1", rewards)], SelectConfig(lambda_diff=1.01))) is keep


def _failing(pid: str, n: int = 8, **sample) -> Profile:
    p = prof(pid, [0.0] * n)
    return p.model_copy(update={"samples": [s.model_copy(update=sample) for s in p.samples]})


@pytest.mark.parametrize("profiles,first,absent", [
    # 94 of 96 samples cut at the token budget, the rest valid failures
    ([_failing(f"t{i}/1", 8, finish_reason="length", valid=False) for i in range(11)]
     + [_failing("u/1", 6, finish_reason="length", valid=False), _failing("v/1", 2)],
     "94 of 96 samples were cut at the token budget", "a larger K"),
    # half the samples invalid
    ([_failing(f"t{i}/1", 4, valid=False, reason="unparseable action") for i in range(4)]
     + [_failing(f"u{i}/1", 4, reason="get_order vs cancel_order") for i in range(4)],
     "16 of 32 samples were invalid", "a larger K"),
    # an e-mail body that differs word for word: only a judge could ever pay it
    ([_failing(f"t{i}/1", 4, reason="body: strings differ (not proven equal)") for i in range(3)],
     "3 all-fail turns failed only on free text", "a larger K"),
    # plain valid failures: then, and only then, the rule's knobs
    ([_failing(f"t{i}/1", 4, reason="get_order vs cancel_order") for i in range(3)],
     "a larger K in profile", "judge"),
])
def test_zero_pivots_name_the_real_cause(tmp_path, profiles, first, absent):
    path = tmp_path / "profile.jsonl"
    write_atomic(path, profiles)
    with pytest.raises(EmptyResultError) as err:
        select_file(path, tmp_path / "p.jsonl", SelectConfig(), plot_png=False)
    causes = str(err.value).split("see ")[1]
    assert first in causes.split("; ")[1], causes  # the largest cause comes first
    assert absent not in causes
    if "free text" in first:
        assert "pivotrl serve --model" in causes and "unproven_rule: judge" in causes
