"""Theorem 3.2 check: the policy-gradient signal at a state grows with the reward's std there.

The paper: the natural-gradient norm of the state-wise objective is sqrt(Var_a r(s,a)) / β².
We measure the plain (Euclidean) gradient of the unnormalised one-turn objective at each profiled
state, using the profile's own K samples:  g(s) = ∇θ (1/K) Σ_i (r_i − r̄) log π(a_i|s),
and correlate ‖g(s)‖ with std(r) across states. It is a proxy (no Fisher preconditioning), and
the report says so. Zero-std states give g = 0 by construction; the informative part is whether
the norm rises with the std among the others.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pivotrl.chat import prompt_text
from pivotrl.records import Profile


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    n = len(x)
    if n < 3:
        return float("nan")
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sx = math.sqrt(sum((a - mx) ** 2 for a in x))
    sy = math.sqrt(sum((b - my) ** 2 for b in y))
    return sxy / (sx * sy) if sx > 0 and sy > 0 else float("nan")


def state_gradient_norm(model: Any, tokenizer: Any, profile: Profile) -> float:
    """‖∇ (1/K) Σ (r_i − r̄) log π(a_i|s)‖ for one profiled state."""
    import torch

    rewards = [s.reward for s in profile.samples]
    mean_r = sum(rewards) / len(rewards)
    if all(abs(r - mean_r) < 1e-12 for r in rewards):
        return 0.0
    prompt_ids = tokenizer(prompt_text(tokenizer, profile.context, profile.tools),
                           add_special_tokens=False)["input_ids"]
    model.zero_grad(set_to_none=True)
    objective = 0.0
    for sample, r in zip(profile.samples, rewards):
        if abs(r - mean_r) < 1e-12:
            continue
        completion = tokenizer(sample.completion, add_special_tokens=False)["input_ids"]
        if tokenizer.eos_token_id is not None:  # the sampler decoded without the end token
            completion = completion + [tokenizer.eos_token_id]
        ids = torch.tensor([prompt_ids + completion])
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1:-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt_ids):, None]).sum()
        objective = objective + (r - mean_r) * logp / len(rewards)
    objective.backward()
    sq = sum(float(p.grad.pow(2).sum()) for p in model.parameters() if p.grad is not None)
    model.zero_grad(set_to_none=True)
    return math.sqrt(sq)


def gradient_vs_std(model: Any, tokenizer: Any, profiles: Sequence[Profile]) -> dict[str, Any]:
    points = [{"id": p.id, "reward_std": p.reward_std,
               "grad_norm": state_gradient_norm(model, tokenizer, p)} for p in profiles]
    mixed = [p for p in points if p["reward_std"] > 0]
    zero = [p["grad_norm"] for p in points if p["reward_std"] == 0]
    return {"points": points,
            "grad_norm_vs_std_corr": pearson([p["reward_std"] for p in points],
                                             [p["grad_norm"] for p in points]),
            "grad_norm_vs_std_corr_mixed_only": pearson([p["reward_std"] for p in mixed],
                                                        [p["grad_norm"] for p in mixed]),
            "zero_std_grad_norm": max(zero) if zero else None,
            "note": "Euclidean gradient of the unnormalised one-turn objective with the profile's "
                    "K samples (a proxy for the paper's natural-gradient norm)."}
