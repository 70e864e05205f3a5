"""A run's checkpoints are all scored on dev; the eval split is scored only where the report's
choice (each world's run its own best dev step, ties to the earlier step and smaller lr) lands."""

from dataclasses import dataclass
from pathlib import Path

import pytest

from pivotrl_testbed.checkpoint_eval import eval_targets, merge_eval, score_dev
from pivotrl_testbed.report import chosen_sides


class FakeEvaluator:
    """Turn outcomes on 10 items per split at each (world, checkpoint)'s rate; records calls."""

    def __init__(self, rates: dict[tuple[str, str], float]):
        self.rates = rates
        self.calls: list[tuple[str, str, tuple[str, ...]]] = []

    def __call__(self, ckpt: Path, world: str, splits=("dev", "eval")):
        self.calls.append((world, ckpt.name, splits))
        rate = self.rates[(world, ckpt.name)]
        row, items = {"kl_to_base": 0.5, "rank_corr": 0.9}, []
        for split in splits:
            items += [{"split": split, "measure": "turn", "item": i, "cluster": i // 2,
                       "outcome": int(i < round(rate * 10))} for i in range(10)]
            rates = {"in_domain": {"turn_accuracy": rate}, "ood": {}}
            row.update(rates if split == "eval" else {"dev": rates})
        return row, items


@dataclass(frozen=True)
class Run:
    world: str
    method: str
    lr: float
    seed: int


def test_dev_everywhere_then_eval_only_at_the_reports_choice():
    # lr 1e-4: world a's run peaks at step 20 (30 ties: the earlier), world b's at step 10; its
    # kept checkpoints score (0.6 + 0.5) / 2 = 0.55 against lr 3e-4's 0.5: the method's lr is 1e-4
    rates = {1e-4: {"a": (0.3, 0.6, 0.6), "b": (0.5, 0.4, 0.4)},
             3e-4: {"a": (0.5, 0.5, 0.5), "b": (0.5, 0.5, 0.5)}}
    rows, items, runs = [], [], []
    for lr, by_world in rates.items():
        for world, per_step in by_world.items():
            run = Run(world, "pivotrl", lr, 0)
            runs.append(run)
            ev = FakeEvaluator({(world, f"checkpoint-{s}"): r for s, r in zip((10, 20, 30), per_step)})
            ckpts = {s: Path(f"checkpoint-{s}") for s in (10, 20, 30)}
            key = dict(method="pivotrl", world=world, seed=0, lr=lr)
            got_rows, got_items = score_dev(key, ckpts, ev, lambda step: {"rollout_turns": step})
            assert [c[2] for c in ev.calls] == [("dev",)] * 3  # no eval while training runs finish
            assert [r["rollout_turns"] for r in got_rows] == [10, 20, 30]
            rows += got_rows
            items += got_items
    targets = eval_targets(chosen_sides(items, "turn", [0]), runs)
    # each world's run at its own step (pooled over the worlds, step 10 and 20 both score 0.5)
    assert sorted((r.world, r.lr, step) for r, step in targets) == [("a", 1e-4, 20), ("b", 1e-4, 10)]
    merge_eval(rows, dict(method="pivotrl", world="a", seed=0, lr=1e-4), 20,
               {"in_domain": {"turn_accuracy": 0.7}, "ood": {}})
    with_eval = [(r["world"], r["lr"], r["step"]) for r in rows if "in_domain" in r]
    assert with_eval == [("a", 1e-4, 20)]
    with pytest.raises(KeyError):
        merge_eval(rows, dict(method="sft", world="a", seed=0, lr=1e-4), 20, {"in_domain": {}, "ood": {}})


def _score_one_checkpoint(monkeypatch, cfg):
    """(what was scored as (split, measure, decoding), the row, the item rows) of one checkpoint's
    own scoring (`Evaluator.__call__`) under `cfg`, with the scorers faked."""
    import pivotrl_testbed.drift as drift
    import pivotrl_testbed.evaluate as ev
    from pivotrl_testbed.checkpoint_eval import Evaluator

    scored: list[tuple[str, str, str]] = []

    def fake_world(model, tok, world, trajs, cfg, items, sampled=None):
        scored.append((trajs, "world", "sampled" if sampled else "greedy"))
        items.append({"measure": "turn", "item": 0, "cluster": 0, "outcome": 1.0})
        return {"turn_accuracy": 1.0}

    def fake_ood(model, tok, tasks, batch_size, items, sampled=None):
        scored.append((tasks, "ood", "sampled" if sampled else "greedy"))
        return {"next": {"accuracy": 1.0, "ci95": [0, 1], "n": 1}}

    monkeypatch.setattr(ev, "evaluate_world", fake_world)
    monkeypatch.setattr(ev, "evaluate_ood", fake_ood)
    monkeypatch.setattr(drift, "ood_logprob_stats", lambda *a, **k: {"kl": 0.1, "rank_corr": 0.9})
    evaluator = Evaluator.__new__(Evaluator)
    evaluator.cfg = cfg
    evaluator.dev_greedy, evaluator.dev_sampled = Evaluator.wants_dev_greedy(cfg), Evaluator.wants_dev_sampled(cfg)
    evaluator.base, evaluator.tokenizer, evaluator.kl_texts = object(), object(), []
    evaluator.trajs = {"toolshop": {"dev": "dev", "eval": "eval"}}
    evaluator.ood = {"dev": "dev", "eval": "eval"}
    row, items = evaluator(None, "toolshop")
    return scored, row, items


@pytest.mark.parametrize("dev_greedy", [False, True])
def test_dev_is_scored_greedy_only_when_asked_and_eval_always_both_ways(monkeypatch, dev_greedy):
    """With sampled selection, the dev split is scored sampled (what the budget rule, the choices
    and the frontier read) and greedy only with `dev_greedy`; the eval split, which the verdicts
    read, is scored both ways either way."""
    from pivotrl_testbed.demo import DemoConfig

    scored, row, items = _score_one_checkpoint(
        monkeypatch, DemoConfig(dev_greedy=dev_greedy, select_decoding="sampled"))
    expected = {("eval", m, d) for m in ("world", "ood") for d in ("greedy", "sampled")}
    expected |= {("dev", m, "sampled") for m in ("world", "ood")}
    expected |= {("dev", m, "greedy") for m in ("world", "ood")} if dev_greedy else set()
    assert set(scored) == expected and len(scored) == len(expected)
    assert {(r["split"], r["decoding"]) for r in items} == {(s, d) for s, _, d in expected}
    assert set(row["dev"]) == ({"in_domain", "ood", "sampled"} if dev_greedy else {"sampled"})
    assert {"in_domain", "ood", "sampled"} <= set(row)


def test_greedy_selection_always_scores_dev_greedy():
    from pivotrl_testbed.checkpoint_eval import Evaluator
    from pivotrl_testbed.demo import DemoConfig

    cfg = DemoConfig(dev_greedy=False, select_decoding="greedy")
    assert Evaluator.wants_dev_greedy(cfg) and Evaluator.wants_dev_greedy(DemoConfig())
    assert not Evaluator.wants_dev_greedy(DemoConfig(select_decoding="sampled"))


@pytest.mark.parametrize("dev_sampled", [False, True])
def test_greedy_selection_scores_dev_sampled_only_when_asked(monkeypatch, dev_sampled):
    """With greedy selection (the default) the dev split is scored greedily, what every choice
    reads, and sampled only with `dev_sampled`; the eval split both ways either way. What the
    checkpoint leaves out on dev at the training temperature, the decoding grid scores."""
    from pivotrl_testbed.checkpoint_eval import GRID_MEASURES, Evaluator, unscored
    from pivotrl_testbed.demo import DemoConfig

    assert not Evaluator.wants_dev_sampled(DemoConfig())  # the default leaves it out
    assert Evaluator.wants_dev_sampled(DemoConfig(select_decoding="sampled"))
    cfg = DemoConfig(dev_sampled=dev_sampled)
    scored, row, _ = _score_one_checkpoint(monkeypatch, cfg)
    expected = {("eval", m, d) for m in ("world", "ood") for d in ("greedy", "sampled")}
    expected |= {("dev", m, "greedy") for m in ("world", "ood")}
    expected |= {("dev", m, "sampled") for m in ("world", "ood")} if dev_sampled else set()
    assert set(scored) == expected and len(scored) == len(expected)
    assert ("sampled" in row["dev"]) is dev_sampled
    left = unscored(cfg, cfg.sampled.temperature, "dev", GRID_MEASURES,
                    Evaluator.wants_dev_greedy(cfg), Evaluator.wants_dev_sampled(cfg))
    assert left == (("episode",) if dev_sampled else GRID_MEASURES)
    assert unscored(cfg, cfg.sampled.temperature, "eval", GRID_MEASURES) == ("episode",)  # eval: always sampled


def test_the_grid_scores_dev_turns_and_eval_only_at_an_asked_temperature(monkeypatch):
    """Dev over the grid's temperatures, episodes and turns (an arm's temperature is chosen on
    episodes, turns reported beside), where a checkpoint's own scoring left them out; eval at
    one temperature on request, turns, OOD and episodes; never again at greedy, and at the
    training temperature only the episodes its sampled scoring leaves out."""
    import pivotrl_testbed.evaluate as ev
    from pivotrl_testbed.checkpoint_eval import Evaluator
    from pivotrl_testbed.decoding import DecodingRule
    from pivotrl_testbed.demo import DemoConfig

    scored: list[tuple[str, str, float]] = []  # (split, measure, temperature)

    def fake_turns(policy, trajs, verifier, items, k):
        scored.append((trajs[0], "turn", policy.temperature))
        items.append({"measure": "turn", "item": 0, "cluster": 0, "outcome": 1.0})

    def fake_ood(model, tok, tasks, batch_size, items, sampled=None):
        scored.append((tasks, "ood", sampled.temperature if sampled else 0.0))
        return {}

    def fake_world(model, tok, world, trajs, cfg, items, sampled=None):
        scored.append((trajs[0], "episode", sampled.temperature if sampled else 0.0))
        items += [{"measure": "episode", "item": 0, "cluster": 0, "outcome": 1.0},
                  {"measure": "turn", "item": 0, "cluster": 0, "outcome": 1.0}]
        return {}

    monkeypatch.setattr(ev, "evaluate_turns", fake_turns)
    monkeypatch.setattr(ev, "evaluate_ood", fake_ood)
    monkeypatch.setattr(ev, "evaluate_world", fake_world)
    evaluator = Evaluator.__new__(Evaluator)
    evaluator.cfg = DemoConfig(select_decoding="sampled", dev_greedy=False)
    evaluator.dev_greedy, evaluator.dev_sampled = False, True
    evaluator.base, evaluator.tokenizer = object(), object()
    evaluator.trajs = {"toolshop": {"dev": ["dev"], "eval": []}}
    evaluator.ood = {"dev": "dev", "eval": "eval"}
    rule = DecodingRule(temperatures=[0.0, 0.5, 1.0])
    rows = evaluator.grid(None, "toolshop", rule, with_pass=False)
    assert sorted(scored) == [("dev", "episode", 0.0), ("dev", "episode", 0.5), ("dev", "episode", 1.0),
                              ("dev", "turn", 0.0), ("dev", "turn", 0.5)]
    assert {(r["split"], r["decoding"], r["measure"]) for r in rows} == {
        ("dev", d, m) for d in ("greedy", "T0.5") for m in ("turn", "episode")} | {("dev", "sampled", "episode")}
    scored.clear()
    evaluator.trajs = {"toolshop": {"dev": [], "eval": ["eval"]}}
    rows = evaluator.at_temperature(None, "toolshop", 0.5, rule)
    assert sorted(scored) == [("eval", "episode", 0.5), ("eval", "ood", 0.5), ("eval", "turn", 0.5)]
    assert {(r["split"], r["decoding"]) for r in rows} == {("eval", "T0.5")}
    scored.clear()
    assert {r["measure"] for r in evaluator.at_temperature(None, "toolshop", 1.0, rule)} == {"episode"}
    with pytest.raises(ValueError):
        evaluator.at_temperature(None, "toolshop", 0.0, rule)


def test_pass_at_k_is_sampled_on_the_first_seeds_only(monkeypatch, tmp_path):
    """pass@k's n samples per turn (a descriptive mean, no verdict reads it) are drawn at the
    headline arms' chosen checkpoints of the first `pass_seeds` seeds and at the base; the grid's
    dev side is scored at every chosen checkpoint."""
    import pivotrl_testbed.jobs as jobs
    from pivotrl_testbed.checkpoint_eval import Evaluator
    from pivotrl_testbed.demo import DemoConfig

    asked: list[tuple[int | None, bool]] = []

    def fake_cached(job, world, step, testbed, out, cfg, what, score):
        class Ev:
            def grid(self, ckpt, world, rule, with_pass=True):
                asked.append((job.seed if job else None, with_pass))
                return []
        return score(Ev(), None)

    monkeypatch.setattr(jobs, "_cached_rows", fake_cached)
    cfg = DemoConfig(seeds=[0, 1, 2])
    for seed in (None, 0, 1, 2):
        job = None if seed is None else jobs.Job("toolshop", "pivotrl", 1e-4, seed)
        jobs.grid_at(job, "toolshop", 10, tmp_path, tmp_path, cfg)
    assert asked == [(None, True), (0, True), (1, False), (2, False)]
    asked.clear()
    every = cfg.model_copy(update={"decoding": cfg.decoding.model_copy(update={"pass_seeds": 0})})
    jobs.grid_at(jobs.Job("toolshop", "pivotrl", 1e-4, 2), "toolshop", 10, tmp_path, tmp_path, every)
    assert asked == [(2, True)]
    asked.clear()  # the ablations are judged on turn accuracy alone: no pass@k at any seed
    jobs.grid_at(jobs.Job("toolshop", "pivotrl_random", 1e-4, 0), "toolshop", 10, tmp_path, tmp_path, every)
    assert asked == [(0, False)]
    # and the grid itself skips the n samples when told to
    evaluator = Evaluator.__new__(Evaluator)
    evaluator.cfg, evaluator.dev_greedy, evaluator.dev_sampled = DemoConfig(), False, True
    evaluator.base, evaluator.tokenizer = object(), object()
    evaluator.trajs = {"toolshop": {"dev": [], "eval": ["t"]}}
    monkeypatch.setattr("pivotrl_testbed.episodes.expert_turns",
                        lambda trajs: pytest.fail("pass@k was sampled"))
    assert evaluator.grid(None, "toolshop", DemoConfig().decoding.model_copy(
        update={"temperatures": [1.0]}), with_pass=False) == []


def test_a_split_short_of_its_asked_size_is_an_error():
    """An eval file with fewer tasks than dev + eval asks for would shrink every verdict's items
    without a word: it stops with the file and the sizes."""
    from pivotrl_testbed.checkpoint_eval import split_tasks

    assert split_tasks(list(range(10)), 4, 6, "w/eval.jsonl") == {"dev": [0, 1, 2, 3], "eval": [4, 5, 6, 7, 8, 9]}
    assert split_tasks(list(range(10)), 4, 0, "w/eval.jsonl")["eval"] == [4, 5, 6, 7, 8, 9]  # 0: the rest
    with pytest.raises(ValueError, match=r"w/eval.jsonl: 10 tasks, but 4 dev and 7 eval"):
        split_tasks(list(range(10)), 4, 7, "w/eval.jsonl")
    with pytest.raises(ValueError, match="leaves none for eval"):
        split_tasks(list(range(4)), 4, 0, "w/eval.jsonl")
