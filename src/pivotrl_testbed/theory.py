"""The demo's theory checks, each beside a null control that shows what it gives by construction.

Both work on sampled actions kept as the token ids the model generated (never re-tokenised from
decoded text; a sample cut at the token limit stays cut, no end token added), scored by the
world's functional verifier through the one scoring path.

Theorem 3.2 (a state's learning signal grows with its reward std). Per state s, 2G actions are
sampled from the base and split in half: A (the update's batch) and B (held out).
- g_A = ∇ (1/G) Σ_A (r_i − r̄) log π(a_i|s), the plain policy gradient of the one-turn
  objective; its norm scales with std(r) for ANY model and rewards (the coefficients r_i − r̄
  do), so `grad_norm_vs_std_corr` is shown beside the same number with A's rewards shuffled
  within the state (`null`: same std, reward–action link broken). Equal numbers mean the
  correlation is the construction, not the theorem.
- `progress`: the first-order gain in expected reward on the HELD-OUT samples B from a unit step
  along g_A: (g_A / ‖g_A‖) · g_B, g_B the same gradient on B. It is positive only if what A
  rewards generalises to other actions at s; under the null (A's rewards shuffled) its mean is
  ~0. The theorem predicts real progress > null, rising with std.
- `signal` = g_A · g_B: with A and B independent, an unbiased estimate of ‖∇J(s)‖², the squared
  norm of the TRUE policy gradient at s, whereas ‖g_A‖² adds the sampling noise, which is what
  grows with std for any rewards. Under the null its expectation is 0 at every std.
- `grad_norm_grpo`: the GRPO-normalised gradient (advantages ÷ the sample std, as TRL), pivots
  vs other mixed states; zero-std states are 0 by construction and are counted, not correlated.

Theorem 3.3 (a functional reward keeps the base's preferences among actions not equivalent to
the expert's). At pivot states, the sampled actions the verifier rejects are the non-equivalent
ones; for a checkpoint θ, ℓ(a) = log π_θ(a|s) − log π_0(a|s). `dispersion` = std of ℓ over
those actions (0: every one scaled by the same factor, i.e. the base's preferences kept exactly)
and `rank_corr` = Spearman of log π_θ vs log π_0 among them, per state, averaged. PivotRL and SFT
(their dev-chosen checkpoints, first seed) against a null: the base moved in a random direction
by the same parameter distance as PivotRL's checkpoint.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pivotrl.formats.chat import prompt_text
from pivotrl.io.records import Profile

THEORY_VERSION = 3  # bump when the checks change: an older theory.json is recomputed, not reused


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    n = len(x)
    if n < 3:
        return float("nan")
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sx = math.sqrt(sum((a - mx) ** 2 for a in x))
    sy = math.sqrt(sum((b - my) ** 2 for b in y))
    return sxy / (sx * sy) if sx > 0 and sy > 0 else float("nan")


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    def ranks(v: Sequence[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        for rank, i in enumerate(order):
            r[i] = float(rank)
        return r

    return pearson(ranks(x), ranks(y))


# ------------------------------------------------------------------ sampling with token ids


def sample_actions(model: Any, tokenizer: Any, turn: Profile, n: int, max_new_tokens: int,
                   seed: int) -> tuple[list[int], list[list[int]], list[str]]:
    """(prompt ids, n completions as generated token ids, their decoded texts). A completion is
    cut after its end token; one that hit the limit stays as generated (no end token added)."""
    import torch

    prompt = list(tokenizer(prompt_text(tokenizer, turn.context, turn.tools),
                            add_special_tokens=False)["input_ids"])
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    torch.manual_seed(seed)
    with torch.no_grad():
        gen = model.generate(input_ids=torch.tensor([prompt] * n), max_new_tokens=max_new_tokens,
                             do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=pad,
                             attention_mask=torch.ones(n, len(prompt), dtype=torch.long))
    completions = []
    for row in gen[:, len(prompt):].tolist():
        if eos in row:
            row = row[: row.index(eos) + 1]
        completions.append(row)
    texts = [tokenizer.decode([t for t in c if t != eos], skip_special_tokens=True) for c in completions]
    return prompt, completions, texts


def sequence_logps(model: Any, prompt: list[int], completions: Sequence[list[int]]):
    """log π(completion | prompt) summed over the completion's tokens, one per completion (a
    tensor with the graph kept, so callers may differentiate it)."""
    import torch

    keep = [c for c in completions if c]
    if not keep:
        return torch.zeros(len(completions))
    width = max(len(prompt) + len(c) for c in keep)
    ids = torch.tensor([prompt + c + [0] * (width - len(prompt) - len(c)) for c in keep])
    mask = torch.tensor([[1] * (len(prompt) + len(c)) + [0] * (width - len(prompt) - len(c)) for c in keep])
    logits = model(input_ids=ids, attention_mask=mask).logits[:, len(prompt) - 1:-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, len(prompt):, None]).squeeze(-1)
    tok_mask = mask[:, len(prompt):].float()
    per_seq = iter((logp * tok_mask).sum(-1))
    return torch.stack([next(per_seq) if c else torch.zeros(()) for c in completions])


def policy_gradient(model: Any, prompt: list[int], completions: Sequence[list[int]],
                    coefficients: Sequence[float]):
    """∇ (1/n) Σ c_i log π(a_i|s) as one flat vector (zeros when every coefficient is 0)."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    if all(abs(c) < 1e-12 for c in coefficients):
        return torch.zeros(sum(p.numel() for p in params))
    logps = sequence_logps(model, prompt, completions)
    objective = (torch.tensor(list(coefficients), dtype=logps.dtype) * logps).sum() / len(coefficients)
    grads = torch.autograd.grad(objective, params, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1)
                      for g, p in zip(grads, params)])


def _centred(rewards: Sequence[float], normalise: bool = False) -> list[float]:
    mean = sum(rewards) / len(rewards)
    coef = [r - mean for r in rewards]
    if normalise:  # TRL's group scaling: the sample (Bessel-corrected) std, + 1e-4
        std = math.sqrt(sum(c * c for c in coef) / max(len(coef) - 1, 1))
        coef = [c / (std + 1e-4) for c in coef]
    return coef


# ------------------------------------------------------------------ Theorem 3.2


def state_signal(model: Any, prompt: list[int], completions: list[list[int]], rewards: list[float],
                 rng: random.Random) -> dict[str, float]:
    """Gradient norms and held-out progress at one state (module doc), real and null."""
    half = len(completions) // 2
    ca, cb, ra, rb = completions[:half], completions[half:], rewards[:half], rewards[half:]
    shuffled = ra[:]
    rng.shuffle(shuffled)
    g_b = policy_gradient(model, prompt, cb, _centred(rb))
    out: dict[str, float] = {}
    for tag, r in (("", ra), ("null_", shuffled)):
        g_a = policy_gradient(model, prompt, ca, _centred(r))
        norm = float(g_a.norm())
        out[f"{tag}grad_norm"] = norm
        out[f"{tag}signal"] = float(g_a @ g_b)
        out[f"{tag}progress"] = out[f"{tag}signal"] / norm if norm > 0 else 0.0
    out["grad_norm_grpo"] = float(policy_gradient(model, prompt, ca, _centred(ra, True)).norm())
    return out


def gradient_check(model: Any, tokenizer: Any, states: Sequence[tuple[Profile, bool]], verifier: Any,
                   *, samples: int, max_new_tokens: int, seed: int = 0) -> dict[str, Any]:
    """Theorem 3.2 with its null control over `states` ((profile, is_pivot) pairs)."""
    from pivotrl.scoring import score_completions

    rng = random.Random(seed)
    points = []
    for i, (turn, pivot) in enumerate(states):
        prompt, comps, texts = sample_actions(model, tokenizer, turn, 2 * samples, max_new_tokens,
                                              seed * 100_003 + i)
        rewards = [s.reward for s in score_completions(verifier, [turn] * len(texts), texts)]
        ra = rewards[:samples]
        std = math.sqrt(sum((r - sum(ra) / len(ra)) ** 2 for r in ra) / len(ra))
        points.append({"id": turn.id, "pivot": pivot, "reward_std": std,
                       **state_signal(model, prompt, comps, rewards, rng)})
    return summarise_gradient(points)


def summarise_gradient(points: list[dict[str, Any]]) -> dict[str, Any]:
    mixed = [p for p in points if p["reward_std"] > 0]

    def corr(key: str) -> float | None:  # None, not NaN: results.json stays strict JSON
        r = pearson([p["reward_std"] for p in mixed], [p[key] for p in mixed])
        return None if math.isnan(r) else r

    def mean(vals: list[float]) -> float | None:
        return sum(vals) / len(vals) if vals else None

    def interval(vals: list[float]) -> list[float] | None:  # 95%, normal, over states
        if len(vals) < 2:
            return None
        m = sum(vals) / len(vals)
        half = 1.96 * math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1) / len(vals))
        return [m - half, m + half]

    return {"points": points, "states": len(points), "mixed_states": len(mixed),
            "zero_std_states": len(points) - len(mixed),
            "grad_norm_vs_std_corr": corr("grad_norm"),
            "null_grad_norm_vs_std_corr": corr("null_grad_norm"),
            "progress_mean": mean([p["progress"] for p in mixed]),
            "null_progress_mean": mean([p["null_progress"] for p in mixed]),
            "progress_positive": mean([float(p["progress"] > 0) for p in mixed]),
            "null_progress_positive": mean([float(p["null_progress"] > 0) for p in mixed]),
            "signal_mean": mean([p.get("signal", 0.0) for p in mixed]),
            "null_signal_mean": mean([p.get("null_signal", 0.0) for p in mixed]),
            "signal_ci95": interval([p.get("signal", 0.0) for p in mixed]),
            "null_signal_ci95": interval([p.get("null_signal", 0.0) for p in mixed]),
            "progress_ci95": interval([p["progress"] for p in mixed]),
            "null_progress_ci95": interval([p["null_progress"] for p in mixed]),
            "signal_vs_std_corr": corr("signal") if all("signal" in p for p in mixed) else None,
            "progress_vs_std_corr": corr("progress"),
            "null_progress_vs_std_corr": corr("null_progress"),
            "grad_norm_grpo_pivots": mean([p["grad_norm_grpo"] for p in mixed if p["pivot"]]),
            "grad_norm_grpo_other_mixed": mean([p["grad_norm_grpo"] for p in mixed if not p["pivot"]])}


# ------------------------------------------------------------------ Theorem 3.3


def preference_check(base: Any, models: dict[str, Any], tokenizer: Any, states: Sequence[Profile],
                     verifier: Any, *, samples: int, max_new_tokens: int, seed: int = 0) -> dict[str, Any]:
    """Dispersion and rank correlation of log π_θ/π_0 over the non-equivalent sampled actions at
    each state (module doc), per model in `models`."""
    import torch

    from pivotrl.scoring import score_completions

    per_model: dict[str, dict[str, list[float]]] = {m: {"dispersion": [], "rank_corr": []} for m in models}
    used = 0
    for i, turn in enumerate(states):
        prompt, comps, texts = sample_actions(base, tokenizer, turn, samples, max_new_tokens,
                                              seed * 100_003 + 7 + i)
        scores = score_completions(verifier, [turn] * len(texts), texts)
        wrong = list({tuple(c): None for c, s in zip(comps, scores) if c and s.reward < 0.5})
        if len(wrong) < 3:
            continue
        used += 1
        wrong_ids = [list(c) for c in wrong]
        with torch.no_grad():
            lp0 = sequence_logps(base, prompt, wrong_ids).tolist()
            for name, model in models.items():
                lp = sequence_logps(model, prompt, wrong_ids).tolist()
                ratio = [a - b for a, b in zip(lp, lp0)]
                m = sum(ratio) / len(ratio)
                per_model[name]["dispersion"].append(math.sqrt(sum((x - m) ** 2 for x in ratio) / len(ratio)))
                per_model[name]["rank_corr"].append(spearman(lp, lp0))
    summary = {}
    for name, v in per_model.items():
        rc = [x for x in v["rank_corr"] if not math.isnan(x)]
        summary[name] = {"dispersion": sum(v["dispersion"]) / len(v["dispersion"]) if v["dispersion"] else None,
                         "rank_corr": sum(rc) / len(rc) if rc else None}
    return {"states": used, "models": summary}


def perturbed_like(base: Any, target: Any, seed: int = 0) -> Any:
    """A copy of `base` moved in a random direction by the parameter distance ‖target − base‖."""
    import copy

    import torch

    gen = torch.Generator().manual_seed(seed)
    pb, pt = list(base.parameters()), list(target.parameters())
    dist = math.sqrt(sum(float((a - b).detach().pow(2).sum()) for a, b in zip(pt, pb)))
    noise = [torch.randn(p.shape, generator=gen) for p in pb]
    scale = dist / max(math.sqrt(sum(float(n.pow(2).sum()) for n in noise)), 1e-12)
    model = copy.deepcopy(base)
    with torch.no_grad():
        for p, n in zip(model.parameters(), noise):
            p.add_(n * scale)
    return model


# ------------------------------------------------------------------ the demo's stage


def theory_states(data_dir: Path, n: int) -> list[tuple[Profile, bool]]:
    """Up to n profiled states of one world: half pivots, half other turns (file order)."""
    from pivotrl.io.records import iter_valid

    pivots = {p.id for p in iter_valid(data_dir / "pivots.jsonl", Profile)}
    profiles = list(iter_valid(data_dir / "profile.jsonl", Profile))
    yes = [(p, True) for p in profiles if p.id in pivots][: n - n // 2]
    no = [(p, False) for p in profiles if p.id not in pivots][: n // 2]
    return yes + no


def run_theory(out: Path, testbed: Path, cfg: Any, items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Both checks on every world (cached in OUT/theory.json)."""
    from pivotrl_testbed.stats import choose, side_runs, step_of
    from pivotrl_testbed.testbed.tiny import load_tiny
    from pivotrl.verifiers import get_verifier

    chosen = choose(items, measure=cfg.select_on)
    # The checks load each method's dev-chosen checkpoint of its first seed in each world (each
    # world's run has its own): that is the cache key.
    checkpoints = {}
    for m, side in chosen.items():
        if m in ("pivotrl", "sft"):
            seed = min(s for _, s, _ in side_runs(side))
            checkpoints[m] = {"lr": side["lr"], "seed": seed,
                              "steps": {w: step_of(side, w, seed) for w in cfg.worlds
                                        if step_of(side, w, seed) is not None}}
    path = out / "theory.json"
    if path.exists():  # reused only for the same checks on the same checkpoints
        cached = json.loads(path.read_text())
        if cached.get("version") == THEORY_VERSION and cached.get("checkpoints") == checkpoints:
            return cached
    base, tok = load_tiny(testbed / "base")
    verifier = get_verifier(cfg.verifier)
    per_world = max(1, cfg.theory_turns // len(cfg.worlds))
    states, grad_points, prefs = [], [], {}
    for world in cfg.worlds:
        got = theory_states(out / "data" / world, per_world)
        states += got
        grad_points += gradient_check(base, tok, got, verifier, samples=cfg.theory_samples,
                                      max_new_tokens=cfg.max_completion_length)["points"]
        models = {}
        for method in ("pivotrl", "sft"):
            side = checkpoints.get(method)
            if side and world in side["steps"]:
                seed, step = side["seed"], side["steps"][world]
                run = out / "runs" / f"{world}/{method}/lr{side['lr']:g}-seed{seed}"
                ckpt = run / f"checkpoint-{step}"
                ckpt = ckpt if (ckpt / "config.json").exists() else run
                if (ckpt / "config.json").exists():  # a world without pivots trains no PivotRL
                    models[method] = load_tiny(ckpt)[0]
        if "pivotrl" in models:
            models["null: random direction, PivotRL's distance"] = perturbed_like(base, models["pivotrl"])
        if models:
            prefs[world] = preference_check(base, models, tok, [p for p, pivot in got if pivot], verifier,
                                            samples=cfg.theory_samples, max_new_tokens=cfg.max_completion_length)
    result = {"version": THEORY_VERSION, **summarise_gradient(grad_points), "preferences": prefs,
              "checkpoints": checkpoints}
    path.write_text(json.dumps(result))
    return result
