"""The theory checks: sampled token ids kept as generated, progress measured on held-out actions,
null controls that behave as nulls, and the Theorem 3.3 statistics at their known values."""

import math

import pytest
import torch

from pivotrl_testbed.theory import (perturbed_like, policy_gradient, preference_check,
                                       sample_actions, sequence_logps, state_signal, summarise_gradient)
from pivotrl.io.records import Profile


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from pivotrl_testbed.testbed.tiny import load_tiny

    return load_tiny(tiny_model_dir)


def state(expected="I will look up order O-12 now."):
    return Profile(id="t/0", trajectory_id="t", turn=0, tools=[],
                   context=[{"role": "user", "content": "Please help with order O-12"}],
                   expected={"role": "assistant", "content": expected},
                   k=0, samples=[], reward_mean=0.0, reward_std=0.0)


def test_samples_are_the_generated_ids_without_an_added_end_token(tiny):
    model, tok = tiny
    prompt, comps, texts = sample_actions(model, tok, state(), 6, max_new_tokens=4, seed=0)
    assert len(comps) == 6 and all(1 <= len(c) <= 4 for c in comps)
    for c, t in zip(comps, texts):
        assert tok.eos_token_id not in c[:-1]  # cut after the end token, never padded on
        if len(c) == 4 and c[-1] != tok.eos_token_id:
            assert t == tok.decode(c, skip_special_tokens=True)  # truncated: left as generated
    again = sample_actions(model, tok, state(), 6, max_new_tokens=4, seed=0)
    assert again[1] == comps  # seeded


def test_policy_gradient_is_linear_in_the_coefficients(tiny):
    model, tok = tiny
    prompt, comps, _ = sample_actions(model, tok, state(), 4, max_new_tokens=5, seed=1)
    g1 = policy_gradient(model, prompt, comps, [1.0, -1.0, 0.5, 0.0])
    g2 = policy_gradient(model, prompt, comps, [2.0, -2.0, 1.0, 0.0])
    assert torch.allclose(2 * g1, g2, atol=1e-5) and float(g1.norm()) > 0
    assert float(policy_gradient(model, prompt, comps, [0.0] * 4).norm()) == 0.0


def test_held_out_progress_is_maximal_when_held_out_actions_repeat_the_batch(tiny):
    """B = A with the same rewards: g_B = g_A, so progress = ‖g_A‖; the shuffled null can only be
    smaller (Cauchy–Schwarz) and is here, since the shuffle moves the one reward."""
    import random

    model, tok = tiny
    prompt, comps, _ = sample_actions(model, tok, state(), 4, max_new_tokens=5, seed=2)
    assert len({tuple(c) for c in comps}) == 4
    got = state_signal(model, prompt, comps + comps, [1.0, 0.0, 0.0, 0.0] * 2, random.Random(3))
    assert got["progress"] == pytest.approx(got["grad_norm"], rel=1e-4)
    assert got["signal"] == pytest.approx(got["grad_norm"] ** 2, rel=1e-4)
    assert got["null_progress"] < got["progress"] - 1e-6
    assert got["grad_norm_grpo"] > got["grad_norm"]  # ÷ a sample std below 1


def test_summary_separates_zero_std_states_and_reports_the_null():
    pts = [{"id": str(i), "pivot": i % 2 == 0, "reward_std": s, "grad_norm": 2 * s,
            "null_grad_norm": 2 * s, "progress": s, "null_progress": -s, "grad_norm_grpo": 1.0}
           for i, s in enumerate([0.0, 0.0, 0.2, 0.4, 0.5])]
    got = summarise_gradient(pts)
    assert got["zero_std_states"] == 2 and got["mixed_states"] == 3
    assert got["grad_norm_vs_std_corr"] == pytest.approx(1.0)
    assert got["null_grad_norm_vs_std_corr"] == pytest.approx(1.0)  # the construction, shown
    assert got["progress_positive"] == 1.0 and got["null_progress_positive"] == 0.0
    lo, hi = got["progress_ci95"]
    assert lo < got["progress_mean"] < hi and got["null_progress_ci95"][1] < 0


def test_preference_statistics_at_known_values(tiny):
    """Against itself a model keeps every preference (dispersion 0, rank corr. 1); a random move
    of the same size as a real one does not."""
    from pivotrl.verifiers import get_verifier

    model, tok = tiny
    import copy

    shifted = copy.deepcopy(model)
    with torch.no_grad():
        for p in shifted.parameters():
            p.add_(0.003)
    moved = perturbed_like(model, shifted, seed=6)
    dist = math.sqrt(sum(float((a - b).detach().pow(2).sum()) for a, b in zip(moved.parameters(), model.parameters())))
    assert dist > 0
    got = preference_check(model, {"same": model, "moved": moved}, tok, [state()] * 2,
                           get_verifier("exact"), samples=8, max_new_tokens=6)
    assert got["states"] == 2
    assert got["models"]["same"]["dispersion"] == pytest.approx(0.0, abs=1e-5)
    assert got["models"]["same"]["rank_corr"] == pytest.approx(1.0)
    assert got["models"]["moved"]["dispersion"] > 1e-3


def test_perturbation_has_the_target_distance(tiny):
    model, _ = tiny
    target = perturbed_like(model, model, seed=1)  # distance 0: an exact copy
    assert all(torch.equal(a, b) for a, b in zip(target.parameters(), model.parameters()))
    with torch.no_grad():
        for p in target.parameters():
            p.add_(0.01)
    want = math.sqrt(sum(p.numel() for p in model.parameters())) * 0.01
    moved = perturbed_like(model, target, seed=2)
    got = math.sqrt(sum(float((a - b).detach().pow(2).sum()) for a, b in zip(moved.parameters(), model.parameters())))
    assert got == pytest.approx(want, rel=1e-3)
    assert sequence_logps(model, [1, 2], [[], [3]]).shape == (2,)
