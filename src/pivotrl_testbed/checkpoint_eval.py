"""Scoring training runs' checkpoints for the demo: the dev split at every checkpoint, the eval
split only at the checkpoints the dev split chooses.

Why eval is scored so rarely: every verdict compares dev-chosen checkpoints on eval
(`pivotrl_testbed.stats`), and the learning curves and the rollout-ratio curve are drawn on
dev, so eval outcomes of other checkpoints would never be read; scoring them cost 60% of each
checkpoint's evaluation (60 eval vs 40 dev tasks per world and OOD family). The choice is the
report's own (`report.chosen_sides`: each method's lr, and a step for each world's run of each
seed, by that run's own dev score), made once every run has its dev scores, so the eval split
is scored exactly where the report reads it (`eval_targets`).

Per-item rows (`item_rows`) hold every outcome, so anyone can recompute every number."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pivotrl.io.records import write_text_atomic
from pivotrl_testbed.stats import step_of

SPLITS = ("dev", "eval")


def split_tasks(tasks: list[Any], dev: int, n_eval: int, what: str) -> dict[str, list[Any]]:
    """The first `dev` tasks are the dev split, the next `n_eval` (0 = the rest) the eval split;
    fewer than asked is an error (a verdict on fewer items than the config says is not the one
    planned)."""
    if len(tasks) <= dev:
        raise ValueError(f"{what}: {len(tasks)} tasks, but dev_tasks={dev} leaves none for eval")
    if len(tasks) < dev + n_eval:
        raise ValueError(f"{what}: {len(tasks)} tasks, but {dev} dev and {n_eval} eval tasks were "
                         f"asked for (build the testbed with more eval tasks: n_eval)")
    return {"dev": tasks[:dev], "eval": tasks[dev:dev + n_eval] if n_eval else tasks[dev:]}


class Evaluator:
    """Loads the testbed's dev and eval sets and the base once per process. `cfg` is the demo's
    config (dev_tasks, dev_ood_per_family, kl_prompts, worlds, eval)."""

    def __init__(self, testbed: Path, cfg: Any):
        from pivotrl_testbed.drift import ood_texts
        from pivotrl_testbed.evaluate import load_ood_eval, load_trajectories
        from pivotrl_testbed.testbed.agentic_ood import AGENTIC_FAMILIES
        from pivotrl_testbed.testbed.tiny import load_tiny

        self.cfg, self.testbed = cfg, testbed
        self.dev_greedy = self.wants_dev_greedy(cfg)
        self.dev_sampled = self.wants_dev_sampled(cfg)
        self.base, self.tokenizer = load_tiny(testbed / "base")
        by_family: dict[str, list[Any]] = {}
        for t in load_ood_eval(testbed, 0):
            by_family.setdefault(t.family, []).append(t)
        self.ood: dict[str, list[Any]] = {"dev": [], "eval": []}
        for family, tasks in by_family.items():
            for split, got in split_tasks(tasks, cfg.dev_ood_per_family, cfg.eval.ood_per_family,
                                          f"OOD family {family}").items():
                self.ood[split] += got
        # Drift is measured on the non-agentic OOD text, the "OOD" every verdict reads.
        ood_eval = [t for t in self.ood["eval"] if t.family not in AGENTIC_FAMILIES]
        self.kl_texts = ood_texts(self.tokenizer, ood_eval[:: max(1, len(ood_eval) // cfg.kl_prompts)])
        n_eval = max(cfg.eval.episodes, cfg.eval.turn_trajectories)
        self.trajs = {w: split_tasks(load_trajectories(testbed / w / "eval.jsonl"), cfg.dev_tasks,
                                     n_eval, f"{w}/eval.jsonl") for w in cfg.worlds}

    @staticmethod
    def wants_dev_greedy(cfg: Any) -> bool:
        """Greedy scoring of the dev split, beside the sampled one (DemoConfig.dev_greedy); always
        when there is no sampled scoring, or when greedy is what the dev split decides by."""
        sampled = getattr(cfg, "sampled", None)
        return (getattr(cfg, "dev_greedy", True) or sampled is None or sampled.k == 0
                or getattr(cfg, "select_decoding", "greedy") == "greedy")

    @staticmethod
    def wants_dev_sampled(cfg: Any) -> bool:
        """Sampled scoring of the dev split, beside greedy (DemoConfig.dev_sampled): only with
        sampled scoring configured, always when sampled is what the dev split decides by, and for
        a config without the field (the criteria scripts) as before it existed."""
        sampled = getattr(cfg, "sampled", None)
        return (sampled is not None and sampled.k > 0
                and (getattr(cfg, "dev_sampled", True)
                     or getattr(cfg, "select_decoding", "greedy") == "sampled"))

    def __call__(self, model_dir: Path | None, world: str, splits: tuple[str, ...] = SPLITS
                 ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """(checkpoint row, per-item rows). The row holds the eval split's rates in evaluate's
        shape (`in_domain`, `ood`) when eval is scored, the dev split's under `dev`, and the KL to
        the base on OOD text (None = the base itself)."""
        from pivotrl_testbed.drift import ood_logprob_stats
        from pivotrl_testbed.evaluate import evaluate_ood, evaluate_world
        from pivotrl_testbed.testbed.tiny import load_tiny

        model, tok = (self.base, self.tokenizer) if model_dir is None else load_tiny(model_dir)
        sampled = getattr(self.cfg, "sampled", None)
        row: dict[str, Any] = {}
        items: list[dict[str, Any]] = []
        for split in splits:
            rates: dict[str, Any] = {}
            if split == "eval" or self.dev_greedy:
                got: list[dict[str, Any]] = []
                ind = evaluate_world(model, tok, world, self.trajs[world][split], self.cfg.eval, got)
                ood = evaluate_ood(model, tok, self.ood[split], self.cfg.eval.batch_size, got)
                items += [{"split": split, "decoding": "greedy", **r} for r in got]
                rates = {"in_domain": ind, "ood": ood}
            if sampled is not None and sampled.k > 0 and (split == "eval" or self.dev_sampled):
                got = []
                s_ind = (evaluate_world(model, tok, world, self.trajs[world][split], self.cfg.eval,
                                        got, sampled) if {"turn", "episode"} & set(sampled.measures)
                         else {})
                s_ood = (evaluate_ood(model, tok, self.ood[split], self.cfg.eval.batch_size, got,
                                      sampled) if "ood" in sampled.measures else {})
                items += [{"split": split, "decoding": "sampled", **r} for r in got]
                rates["sampled"] = {"in_domain": s_ind, "ood": s_ood}
            row.update(rates if split == "eval" else {"dev": rates})
        kl = (ood_logprob_stats(model, self.base, tok, self.kl_texts) if model_dir is not None
              else {"kl": 0.0, "rank_corr": 1.0})
        return {**row, "kl_to_base": kl["kl"], "rank_corr": kl["rank_corr"]}, items

    def grid(self, model_dir: Path | None, world: str, rule: Any,
             with_pass: bool = True) -> list[dict[str, Any]]:
        """Item rows of the decoding rule's dev side (`pivotrl_testbed.decoding`) at one chosen
        checkpoint: dev turn accuracy at every grid temperature `__call__` does not already score
        there (what an arm's temperature is chosen by), and, `with_pass`, n samples per eval turn
        at the training temperature (decoding "pass", with `samples` and `successes` per item).
        The eval split at an arm's dev-best temperature is `at_temperature`'s, once it is known."""
        from pivotrl_testbed.decoding import PASS, label
        from pivotrl.formats.options import FormatOptions
        from pivotrl_testbed.episodes import expert_turns, turn_accuracy
        from pivotrl_testbed.evaluate import shared_verifier
        from pivotrl_testbed.health import reason_failure
        from pivotrl.select import SUCCESS_THRESHOLD

        model, tok = self._model(model_dir)
        items = [r for t in rule.temperatures
                 for r in self._scored(model, tok, world, "dev", t, rule,
                                       unscored(self.cfg, t, "dev", GRID_MEASURES, self.dev_greedy,
                                                self.dev_sampled))]
        if not (with_pass and "turn" in rule.measures):
            return items
        n, verifier = rule.pass_samples, self.cfg.eval.verifiers.get(world, "toolcall")
        scored = self.cfg.eval.turn_trajectories
        first = min(rule.pass_trajectories or scored, scored)
        turns = expert_turns(list(self.trajs[world]["eval"][:first]))
        if turns:
            acc = turn_accuracy(self._policy(model, tok, self._train_t(), rule.seed),
                                [t for t in turns for _ in range(n)],
                                shared_verifier(verifier), parse=FormatOptions().parser(tok))
            for i, t in enumerate(turns):
                c = sum(r >= SUCCESS_THRESHOLD for r in acc.rewards[i * n:(i + 1) * n])
                failed = next(filter(None, map(reason_failure, acc.reasons[i * n:(i + 1) * n])), None)
                items.append({"split": "eval", "decoding": PASS, "measure": "turn", "item": t.id,
                              "cluster": t.trajectory_id, "outcome": c / n, "samples": n,
                              "successes": c, "position": t.turn,
                              **({"failure": failed} if failed else {})})
        return items

    def at_temperature(self, model_dir: Path | None, world: str, temperature: float,
                       rule: Any) -> list[dict[str, Any]]:
        """Item rows of the eval split at one grid temperature that `__call__` does not score
        there (neither greedy nor the training temperature): an arm's dev-best one, the only
        place the rule reads eval at it. The rule's measures (turns, OOD)."""
        measures = unscored(self.cfg, temperature, "eval", tuple(rule.measures))
        if not measures:
            raise ValueError(f"the eval split is already scored at T = {temperature:g}")
        model, tok = self._model(model_dir)
        return self._scored(model, tok, world, "eval", temperature, rule, measures)

    def _scored(self, model, tok, world: str, split: str, t: float, rule: Any,
                measures: tuple[str, ...]) -> list[dict[str, Any]]:
        """`split`'s turns (and OOD) at temperature t: k seeded samples per item, one at 0."""
        from pivotrl_testbed.decoding import label
        from pivotrl_testbed.evaluate import SampledConfig, evaluate_ood, evaluate_turns, evaluate_world

        ev, k = self.cfg.eval, rule.k if t > 0 else 1
        got: list[dict[str, Any]] = []
        if "episode" in measures:  # k seeded episodes per task at t (greedy: one)
            evaluate_world(model, tok, world, self.trajs[world][split], ev, got,
                           SampledConfig(k=k, temperature=t, seed=rule.seed, measures=["episode"])
                           if t > 0 else None)
            got = [r for r in got if r["measure"] == "episode"]  # greedy scoring adds turns too
        if "turn" in measures:
            evaluate_turns(self._policy(model, tok, t, rule.seed),
                           self.trajs[world][split][:ev.turn_trajectories],
                           ev.verifiers.get(world, "toolcall"), got, k)
        if "ood" in measures:
            evaluate_ood(model, tok, self.ood[split], ev.batch_size, got,
                         SampledConfig(k=k, temperature=t, seed=rule.seed) if t > 0 else None)
        return [{"split": split, "decoding": label(t, self._train_t()), **r} for r in got]

    def _model(self, model_dir: Path | None):
        from pivotrl_testbed.testbed.tiny import load_tiny

        return (self.base, self.tokenizer) if model_dir is None else load_tiny(model_dir)

    def _policy(self, model, tok, t: float, seed: int):
        from pivotrl_testbed.episodes import ModelPolicy

        return ModelPolicy(model, tok, max_new_tokens=self.cfg.eval.max_new_tokens, temperature=t,
                           seed=seed, batch_size=self.cfg.eval.batch_size)

    def _train_t(self) -> float:
        sampled = getattr(self.cfg, "sampled", None)
        return sampled.temperature if sampled is not None else 1.0


DECODINGS = ("greedy", "sampled")
# What the decoding grid scores on dev at each temperature: episode success, on which an arm's
# temperature is chosen (the demo's selection measure), and turn accuracy, reported beside it.
GRID_MEASURES = ("turn", "episode")


def unscored(cfg: Any, t: float, split: str, wanted: tuple[str, ...],
             dev_greedy: bool | None = None, dev_sampled: bool | None = None) -> tuple[str, ...]:
    """The measures of `wanted` that a checkpoint's own scoring (`Evaluator.__call__`) leaves
    unscored on `split` at temperature t: every one at a grid temperature, those outside
    `cfg.sampled.measures` at the training temperature, none greedily (dev: when it is scored
    greedily, `dev_greedy`, default `Evaluator.wants_dev_greedy`; sampled likewise,
    `dev_sampled`, default `Evaluator.wants_dev_sampled`)."""
    from pivotrl_testbed.decoding import label

    sampled = getattr(cfg, "sampled", None)
    train_t = sampled.temperature if sampled is not None else 1.0
    got = label(t, train_t)
    greedy_dev = Evaluator.wants_dev_greedy(cfg) if dev_greedy is None else dev_greedy
    if got == "greedy" and (split == "eval" or greedy_dev):
        return ()
    sampled_dev = Evaluator.wants_dev_sampled(cfg) if dev_sampled is None else dev_sampled
    if got == "sampled" and sampled is not None and sampled.k > 0 and (split == "eval" or sampled_dev):
        return tuple(m for m in wanted if m not in sampled.measures)
    return tuple(wanted)
EVAL_KEYS = ("in_domain", "ood", "sampled")  # a checkpoint row's eval-split rates


def item_rows(items: list[dict[str, Any]], *, method: str, world: str, seed: int, lr: float,
              step: int) -> list[dict[str, Any]]:
    """Per-item outcomes in the contract's row shape (docs/DESIGN.md), with the `decoding` that
    scored them ("greedy", or "sampled": the mean over k samples) and, for turns, the turn's
    `position` and `kind` (tool call or message)."""
    return [{"method": method, "world": world, "seed": seed, "lr": lr, "step": step,
             "split": r["split"], "measure": r["measure"], "item": r["item"],
             "cluster": r["cluster"], "outcome": r["outcome"],
             "decoding": r.get("decoding", "greedy"),
             **{k: r[k] for k in ("position", "kind", "samples", "successes", "failure") if k in r}}
            for r in items]


def decoded(items: Iterable[dict[str, Any]], decoding: str) -> list[dict[str, Any]]:
    """The rows scored with one decoding. Every paired rule (stats.py) keys an outcome by (seed,
    world, item), so it must see one decoding at a time. Rows without the field were written
    before sampled scoring existed and are greedy."""
    return [r for r in items if r.get("decoding", "greedy") == decoding]


def score_dev(key: dict[str, Any], checkpoints: dict[int, Path], evaluator: Evaluator,
              extra: Callable[[int], dict[str, Any]] = lambda step: {}
              ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every checkpoint of one run on dev. key: method, world, seed, lr of the run; checkpoints:
    {step: model dir}; extra(step): more fields for that step's row (rollout turns). Returns
    (one row per step, item rows)."""
    rows, items = [], []
    for step, ckpt in sorted(checkpoints.items()):
        row, got = evaluator(ckpt, key["world"], ("dev",))
        rows.append({**key, "step": step, **extra(step), **row})
        items += item_rows(got, **key, step=step)
    return rows, items


def eval_targets(chosen: dict[str, dict[str, Any]], runs: Iterable[Any],
                 extra: Iterable[dict[str, Any]] = ()) -> list[tuple[Any, int]]:
    """(run, step) pairs the eval split must be scored at: for each method's chosen lr, every
    world's run of each seed at that run's chosen step (`stats.step_of`), and likewise for each
    side in `extra` (the frontier's matched checkpoints, `frontier.matched_sides`), each pair
    once. `runs` have method, world, lr, seed; `chosen` is `report.chosen_sides`'s."""
    sides = [*chosen.values(), *extra]
    out: list[tuple[Any, int]] = []
    for run in runs:
        for side in sides:
            if side["method"] != run.method or not math.isclose(run.lr, side["lr"]):
                continue
            step = step_of(side, run.world, run.seed)
            if step is not None and (run, step) not in out:
                out.append((run, step))
    return out


def merge_eval(rows: list[dict[str, Any]], key: dict[str, Any], step: int,
               eval_row: dict[str, Any]) -> None:
    """Put a checkpoint's eval rates (`in_domain`, `ood`) into its dev row, in place."""
    for r in rows:
        if all(r[k] == v for k, v in key.items()) and r["step"] == step:
            r.update({k: eval_row[k] for k in EVAL_KEYS if k in eval_row})
            return
    raise KeyError(f"no dev row for {key} at step {step}")


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))

