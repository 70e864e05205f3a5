"""Sampled scoring beside greedy: an item's outcome is the mean over its k samples, the draws are
seeded (the same items give the same outcomes in every run), and they are real samples."""

from types import SimpleNamespace

import pytest

from pivotrl_testbed.evaluate import SampledConfig, evaluate_ood, item_means


def test_item_means_average_each_items_k_values():
    assert item_means([1, 0, 0, 1, 1, 1], 3) == [pytest.approx(1 / 3), 1.0]
    assert item_means([0.0, 1.0], 1) == [0.0, 1.0]


def test_sampled_ood_is_seeded_per_item_and_differs_from_greedy(tiny_model_dir, monkeypatch):
    from pivotrl_testbed.testbed import ood
    from pivotrl_testbed.testbed.tiny import load_tiny

    answers: list[str] = []

    def check(family, answer, expected):  # a random model never answers right: score the text
        answers.append(answer)
        return len(answer) % 2 == 0

    monkeypatch.setattr(ood, "check", check)
    model, tok = load_tiny(tiny_model_dir)
    tasks = [SimpleNamespace(id=f"t{i}", family="next", prompt=f"What comes after {i}?", answer=str(i + 1))
             for i in range(6)]

    def run(sampled):
        items: list[dict] = []
        answers.clear()
        evaluate_ood(model, tok, tasks, 8, items, sampled)
        return [r["outcome"] for r in items], list(answers)

    greedy, greedy_texts = run(None)
    k3 = SampledConfig(k=3, temperature=1.0, seed=0)
    first, texts = run(k3)
    again, texts_again = run(k3)
    assert len(first) == len(tasks) and len(texts) == 3 * len(tasks)
    assert (first, texts) == (again, texts_again)  # seeded: the same draws every run
    assert first == item_means([float(len(a) % 2 == 0) for a in texts], 3)
    assert texts != [a for a in greedy_texts for _ in range(3)]  # sampled, not the greedy answer
    assert run(SampledConfig(k=3, temperature=1.0, seed=1))[1] != texts  # the seed matters
    assert set(greedy) <= {0.0, 1.0}
