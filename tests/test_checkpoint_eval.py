"""A run's checkpoints: all scored on dev, the eval split only at the dev-chosen one, chosen by
the same rule as the report (best dev score, ties to the earlier step)."""

from pathlib import Path

from pivotrl.experiment.checkpoint_eval import score_run
from pivotrl.experiment.stats import choose


class FakeEvaluator:
    """Turn outcomes on 10 dev and 10 eval items at each checkpoint's rates; records its calls."""

    def __init__(self, dev: dict[str, float], eval_: dict[str, float]):
        self.rates = {"dev": dev, "eval": eval_}
        self.calls: list[tuple[str, tuple[str, ...]]] = []

    def __call__(self, ckpt: Path, world: str, splits=("dev", "eval")):
        self.calls.append((ckpt.name, splits))
        row, items = {"kl_to_base": 0.5, "rank_corr": 0.9}, []
        for split in splits:
            rate = self.rates[split][ckpt.name]
            got = [{"split": split, "measure": "turn", "item": i, "cluster": i // 2,
                    "outcome": int(i < round(rate * 10))} for i in range(10)]
            items += got
            rates = {"in_domain": {"turn_accuracy": rate}, "ood": {}}
            row.update(rates if split == "eval" else {"dev": rates})
        return row, items


def test_eval_is_scored_once_at_the_dev_chosen_step():
    ckpts = {s: Path(f"checkpoint-{s}") for s in (10, 20, 30)}
    ev = FakeEvaluator(dev={"checkpoint-10": 0.3, "checkpoint-20": 0.6, "checkpoint-30": 0.6},
                       eval_={"checkpoint-10": 0.9, "checkpoint-20": 0.5, "checkpoint-30": 0.7})
    key = dict(method="pivotrl", world="w", seed=3, lr=1e-4)
    rows, items, chosen = score_run(key, ckpts, ev, "turn", lambda step: {"rollout_turns": step * 2})
    assert chosen == 20  # dev tie between 20 and 30 goes to the earlier step; eval's best (10) is unseen
    assert ev.calls == [("checkpoint-10", ("dev",)), ("checkpoint-20", ("dev",)),
                        ("checkpoint-30", ("dev",)), ("checkpoint-20", ("eval",))]
    assert [r["step"] for r in rows] == [10, 20, 30]
    assert [r["rollout_turns"] for r in rows] == [20, 40, 60]
    assert [("in_domain" in r) for r in rows] == [False, True, False]
    assert rows[1]["in_domain"]["turn_accuracy"] == 0.5 and rows[1]["dev"]["in_domain"]["turn_accuracy"] == 0.6
    assert {(r["split"], r["step"]) for r in items} == {("dev", 10), ("dev", 20), ("dev", 30), ("eval", 20)}
    # the report's rule, applied to the saved item rows, picks the same checkpoint
    assert choose(items, measure="turn")["pivotrl"]["steps"] == {3: 20}
