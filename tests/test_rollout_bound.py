"""The largest rollout ratio a demo's schedule can show, known before training."""

from __future__ import annotations

import pytest

from pivotrl_testbed.budget import largest_rollout_ratio, schedule_bound
from pivotrl_testbed.demo import DemoConfig


def test_the_bound_is_e2e_at_its_cap_over_pivotrl_at_its_first_checkpoint():
    cfg = DemoConfig(worlds=["a", "b"], steps=60, e2e_steps=60, eval_every=10, pivots_per_step=16,
                     num_generations=8, e2e_tasks_per_step=4, early_until=0)
    pivots = {"a": {"kept": 100, "profile_rollout_turns": 3000},
              "b": {"kept": 50, "profile_rollout_turns": 1000}}
    got = largest_rollout_ratio(cfg, pivots, {"a": 3.0, "b": 2.0})
    e2e = 60 * 4 * 8 * 3.0 + 60 * 4 * 8 * 2.0  # 9600 model turns at the cap
    first = 2 * 10 * 16 * 8  # 2560 one-turn rollouts at the first checkpoint
    assert got["without_profiling"] == pytest.approx(e2e / first)  # 3.75: below 4x by design
    assert got["with_profiling"] == pytest.approx(e2e / (first + 4000))
    # finer early checkpoints or a longer E2E cap lift it over 4x
    assert largest_rollout_ratio(cfg.model_copy(update={"eval_every": 5}), pivots,
                                 {"a": 3.0, "b": 2.0})["without_profiling"] == pytest.approx(7.5)
    # the default schedule: a checkpoint every 5 steps over the first 20
    assert cfg.model_copy(update={"early_until": 20}).checkpoint_steps("pivotrl") == [5, 10, 15, 20, 30, 40, 50, 60]
    assert largest_rollout_ratio(cfg.model_copy(update={"early_until": 20}), pivots,
                                 {"a": 3.0, "b": 2.0})["without_profiling"] == pytest.approx(7.5)
    longer = largest_rollout_ratio(cfg.model_copy(update={"e2e_steps": 150}), pivots, {"a": 3.0, "b": 2.0})
    assert longer["e2e_turns_at_cap"] == pytest.approx(2.5 * e2e)
    assert longer["with_profiling"] == pytest.approx(2.5 * e2e / (first + 4000))
    # a world without pivots trains no PivotRL there; E2E RL still trains in it
    one = largest_rollout_ratio(cfg, {**pivots, "b": {"kept": 0}}, {"a": 3.0, "b": 2.0})
    assert one["without_profiling"] == pytest.approx(e2e / (10 * 16 * 8))
    assert largest_rollout_ratio(cfg, {"a": {"kept": 0}, "b": {"kept": 0}}, {"a": 3, "b": 2}) is None


def test_the_demo_reads_episode_length_from_the_base_rows():
    cfg = DemoConfig(worlds=["a"], steps=60, eval_every=10)  # E2E RL's own cap by default
    base = [{"method": "base", "world": "a", "seed": 0,
             "in_domain": {"episodes": 100, "model_turns": 350, "success": 0.4}}]
    got = schedule_bound(cfg, {"a": {"kept": 10, "profile_rollout_turns": 0}}, base)
    assert got["e2e_turns_at_cap"] == pytest.approx(cfg.e2e_steps * cfg.e2e_tasks_per_step * cfg.num_generations * 3.5)
    assert schedule_bound(cfg.model_copy(update={"methods": ["sft", "pivotrl"]}),
                          {"a": {"kept": 10}}, base) is None
