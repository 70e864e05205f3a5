"""Paired comparison of models on the same items (`pivotrl compare`), and the one bootstrap rule
every paired verdict uses (the demo's report too: pivotrl_testbed.stats).

Values. One side's outcomes are `{key: (cluster, outcome)}`, where a key is `(seed, *item)`: the
seed the side was trained with (0 when there is one model per side) and the item it was scored
on. Two sides pair on the keys they share; diff = Σ (outcome_a − outcome_b) / n over every pair:
the difference of the two sides' mean outcomes on the same items.

95% interval (`paired_values`, `bootstrap_weights`): percentile bootstrap, B = 2000 replicates
  from `numpy.random.default_rng(0)`. A replicate draws the seeds with replacement (S of S; with
  one seed no draw is made), then the clusters with replacement (C of C, one draw shared by every
  seed, since every seed is scored on the same items; clusters are the values' cluster keys as
  strings, in sorted order; seeds in sorted order), and recomputes diff with each (seed,
  cluster) cell counted as often as it was drawn (seed count × cluster count). The interval is
  the 2.5% and 97.5% quantiles of the replicates (numpy's default linear interpolation).
  Clusters, not items, are drawn because items of one cluster are not independent: for turns,
  the cluster is the trajectory (same task, same user, earlier turns' context).

Verdict (`verdict`): "met" when the interval lies above 0 (a is better), "not met" when it lies
  below 0 (b is better), otherwise "within noise".

`compare_models` scores each model on a Turn file with `pivotrl.evaluate.turns` (each turn's success
under the same verifier, settings and per-turn seeds) and pairs every two models on the turns
both scored; `compare_results` pairs results `pivotrl evaluate --turns` already wrote (one job
per model, any backend).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

BOOTSTRAP_REPLICATES = 2000
BOOTSTRAP_SEED = 0
Values = dict[tuple, tuple[str, float]]  # {(seed, *item): (cluster, outcome)}


def verdict(ci: Sequence[float] | None) -> str:
    if ci is None:
        return "not measurable"
    lo, hi = ci
    return "met" if lo > 0 else "not met" if hi < 0 else "within noise"


def bootstrap_weights(n_seeds: int, n_clusters: int, replicates: int = BOOTSTRAP_REPLICATES,
                      seed: int = BOOTSTRAP_SEED) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Per replicate: how often each seed and each cluster was drawn (see the module doc)."""
    rng = np.random.default_rng(seed)
    for _ in range(replicates):
        if n_seeds > 1:
            w_seed = np.bincount(rng.integers(0, n_seeds, n_seeds), minlength=n_seeds)
        else:
            w_seed = np.ones(n_seeds, dtype=np.int64)
        w_cluster = np.bincount(rng.integers(0, n_clusters, n_clusters), minlength=n_clusters)
        yield w_seed, w_cluster


def cell_sums(values: Values, seeds: list, clusters: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(sum of values, count) per (seed, cluster) cell, as S × C arrays."""
    si = {s: i for i, s in enumerate(seeds)}
    ci = {c: j for j, c in enumerate(clusters)}
    total = np.zeros((len(seeds), len(clusters)))
    count = np.zeros((len(seeds), len(clusters)))
    for key, (cluster, value) in values.items():
        total[si[key[0]], ci[cluster]] += value
        count[si[key[0]], ci[cluster]] += 1
    return total, count


def weighted_mean(total: np.ndarray, count: np.ndarray, w_seed: np.ndarray,
                  w_cluster: np.ndarray) -> float:
    n = w_seed @ count @ w_cluster
    return float(w_seed @ total @ w_cluster / n) if n else float("nan")


def paired_values(sa: Values, sb: Values, replicates: int = BOOTSTRAP_REPLICATES) -> dict[str, Any] | None:
    """The paired difference a − b with its cluster-bootstrap 95% interval and verdict (module
    doc); None when no key is on both sides. Clusters are side a's."""
    common = sorted(set(sa) & set(sb))
    if not common:
        return None
    diffs = {k: (sa[k][0], sa[k][1] - sb[k][1]) for k in common}
    seeds = sorted({k[0] for k in common})
    clusters = sorted({c for c, _ in diffs.values()})
    total, count = cell_sums(diffs, seeds, clusters)
    diff = float(total.sum() / count.sum())
    reps = [weighted_mean(total, count, ws, wc)
            for ws, wc in bootstrap_weights(len(seeds), len(clusters), replicates)]
    reps = np.array([r for r in reps if not math.isnan(r)])
    lo, hi = (float(np.quantile(reps, 0.025)), float(np.quantile(reps, 0.975)))
    return {"diff": diff, "ci95": [lo, hi], "verdict": verdict([lo, hi]),
            "a_mean": sum(sa[k][1] for k in common) / len(common),
            "b_mean": sum(sb[k][1] for k in common) / len(common),
            "pairs": len(common), "clusters": len(clusters), "seeds": len(seeds)}


# ---------------------------------------------------------------- models on a Turn file


def turn_values(items: Sequence[dict[str, Any]]) -> Values:
    """`pivotrl.evaluate.turns` items (one per scored turn) as values: turn id → (trajectory, success)."""
    return {(0, str(it["id"])): (str(it["trajectory_id"]), float(it["success"])) for it in items}


def reading(pair: dict[str, Any]) -> str:
    """The verdict in the models' names: which one is better, or neither beyond noise."""
    return {"met": f"{pair['a']} better", "not met": f"{pair['b']} better"}.get(pair["verdict"], pair["verdict"])


def compare_items(named_items: Sequence[tuple[str, Sequence[dict[str, Any]]]],
                  replicates: int = BOOTSTRAP_REPLICATES) -> list[dict[str, Any]]:
    """Every two models (in the order given: a before b) paired on the turns both scored."""
    values = [(name, turn_values(items)) for name, items in named_items]
    pairs = []
    for i, (name_a, va) in enumerate(values):
        for name_b, vb in values[i + 1:]:
            pair = paired_values(va, vb, replicates)
            if pair is None:
                pair = {"diff": None, "ci95": None, "verdict": verdict(None), "pairs": 0}
            pair = {"a": name_a, "b": name_b, **pair}
            pairs.append({**pair, "reading": reading(pair)})
    return pairs


def model_result_path(out: str | Path, index: int) -> Path:
    """`R.json` → `R.model-<index>.json`: model `index`'s own evaluate result (with its items)."""
    out = Path(out)
    return out.with_name(f"{out.stem}.model-{index}{out.suffix or '.json'}")


def compare_models(turns_path: str | Path, models: Sequence[str], out: str | Path, verifier, cfg,
                   *, sampler_for: Callable[[str], tuple[Any, Any]] | None = None,
                   replicates: int = BOOTSTRAP_REPLICATES) -> dict[str, Any]:
    """Score each model on the turns (`cfg`: a pivotrl.evaluate.turns.TurnEvalConfig; `sampler_for(model)`
    → (sampler, tokenizer), default `cfg.build_sampler`), pair them, write OUT (JSON) next to
    each model's own result (`model_result_path`). Returns the comparison dict."""
    from pivotrl.evaluate.turns import evaluate_turns_file

    if len(models) < 2:
        raise ValueError("compare needs at least two --model")
    sampler_for = sampler_for or cfg.build_sampler
    paths = []
    for i, model in enumerate(models):
        sampler, tokenizer = sampler_for(model)
        try:
            paths.append(model_result_path(out, i))
            evaluate_turns_file(turns_path, paths[-1], sampler, verifier, tokenizer, cfg,
                                model_name=str(model))
        finally:
            close = getattr(sampler, "close", None)
            if callable(close):
                close()
            del sampler  # one model's weights at a time
    return compare_results(paths, out, replicates)


# Settings that change how a turn is scored; the others (engine, batching) change only speed.
SCORING_SETTINGS = ("verifier", "verifier_config", "samples", "temperature", "top_p", "max_new_tokens",
                    "seed", "chat_template_kwargs", "response_format", "success_threshold")


def compare_results(results: Sequence[str | Path], out: str | Path,
                    replicates: int = BOOTSTRAP_REPLICATES) -> dict[str, Any]:
    """Pair models already scored by `pivotrl evaluate --turns` (each RESULT.json with its
    RESULT.items.jsonl), e.g. on separate machines or engines; write OUT (JSON). Results scored
    on another Turn file or with other scoring settings are refused: their turns do not pair."""
    from pivotrl.evaluate.turns import items_path

    if len(results) < 2:
        raise ValueError("compare needs at least two results")
    docs = []
    for path in map(Path, results):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not an evaluate --turns result ({exc})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("settings"), dict):
            raise ValueError(f"{path}: not an evaluate --turns result (no settings)")
        docs.append((path, doc))
    first = docs[0][1]
    for path, doc in docs[1:]:
        differ = [f"--{k.replace('_', '-')} {doc['settings'].get(k)!r} vs {first['settings'].get(k)!r}"
                  for k in SCORING_SETTINGS if doc["settings"].get(k) != first["settings"].get(k)]
        if doc.get("turns_file") != first.get("turns_file"):
            differ.insert(0, f"turns file {doc.get('turns_file')} vs {first.get('turns_file')}")
        if differ:
            # A model scored "as trained" takes its run's budget and template settings: a baseline
            # whose run recorded none (SFT) needs them given, so the pair names each value.
            raise ValueError(f"{path} was scored differently from {docs[0][0]} ({'; '.join(differ)}): "
                             "score every model on the same turns with the same settings (rerun "
                             f"`pivotrl evaluate` on the other with `--config {docs[0][0]}`, which takes "
                             "its settings, or with those flags)")
    models, named_items = [], []
    for path, doc in docs:
        name = str(doc.get("model") or path.stem)
        models.append({"model": name, "result": str(path), "accuracy": doc.get("accuracy"),
                       "ci95": doc.get("ci95"), "turns": doc.get("turns"),
                       "too_long": len(doc.get("too_long") or {})})
        items = [json.loads(line) for line in items_path(path).read_text().splitlines() if line]
        named_items.append((name, items))
    out_doc = {"turns_file": first.get("turns_file"), "settings": first.get("settings"), "models": models,
               "pairs": compare_items(named_items, replicates),
               "rule": "diff = a − b of per-turn success on the turns both scored; 95% CI: paired "
                       f"bootstrap over trajectories, B = {replicates}; verdict 'met' = a better"}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(out_doc, indent=2))
    return out_doc
