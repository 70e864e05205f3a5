"""report.md from results.json's content (report.py builds the content)."""

from __future__ import annotations

import math
from typing import Any

from pivotrl_testbed.stats import side_runs
from pivotrl_testbed.testbed.agentic_ood import AGENTIC_FAMILIES

PAPER = {  # Published figures (Qwen3-30B-A3B), as docs/DESIGN.md reports them.
    "in_domain": {"base": 17.84, "sft": 27.77, "pivotrl": 31.95},
    "ood_change": {"sft": -9.83, "pivotrl": 0.21},
    "tau2_ablation": {"pivotrl": 63.81, "pivotrl_no_filter": 59.68, "pivotrl_exact": 57.34,
                      "sft": 58.44},
    "rollout_ratio": 4.0,
}
MEASURE_NAMES = {"turn": "turn accuracy", "episode": "episode success",
                 "ood": "non-agentic OOD accuracy", "agentic_ood": "agentic-format OOD accuracy"}
RULE = ("Each verdict compares two methods' dev-chosen checkpoints on the SAME eval items under "
        "the same seeds: diff = mean over every (seed, item) pair of outcome_a − outcome_b; 95% "
        "interval = percentile bootstrap (2000 replicates, numpy default_rng(0)) that redraws the "
        "seeds and, shared across seeds, the clusters (the task of an episode or OOD problem, the "
        "trajectory of a turn; one OOD problem is one cluster across worlds) with replacement. "
        "**met** / **not met** only when the interval excludes 0, otherwise **within noise**; "
        "**not measurable** when an arm is missing. "
        "items.jsonl holds every outcome (pivotrl_testbed.stats has the rule as code).")


def _f(x: float | None, digits: int = 3) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def mean_turn_accuracy(in_domain: dict[str, Any]) -> float | None:
    """An arm's turn accuracy, the mean over its worlds (None when a world has none)."""
    ta = [x.get("turn_accuracy") for x in in_domain.values()]
    return sum(ta) / len(ta) if ta and None not in ta else None


def _ci(ci: list[float] | None) -> str:
    return "" if not ci else f"[{ci[0]:.4f}, {ci[1]:.4f}]"


def chosen_steps(side: dict[str, Any]) -> str:
    """A side's steps, each world's apart (seeds in order, split by "/"): "toolshop 10, terminal 30"."""
    by_world: dict[str, list[str]] = {}
    for world, _, step in side_runs(side):
        by_world.setdefault(world, []).append(str(step))
    return ", ".join(f"{w} {'/'.join(steps)}" for w, steps in by_world.items())


def _side(s: dict[str, Any]) -> str:
    return f"{s['method']} (lr {s['lr']:g}, steps {chosen_steps(s)})"


def wall_time_line(results: dict[str, Any]) -> str:
    """This invocation's time, and (when stages came from the cache) the time of every
    invocation that built this folder, so a cached rerun does not pass for a 10-second demo."""
    now = results["wall_seconds"] / 60
    runs = results.get("invocations") or []
    total = sum(r["wall_seconds"] for r in runs) / 60
    code = "; code: " + ", ".join(code_line(r) for r in runs) if runs else ""
    if len(runs) <= 1:
        return f"Wall time {now:.1f} min (nothing reused from an earlier run){code}."
    return (f"Wall time {now:.1f} min for this invocation; {total:.1f} min over the "
            f"{len(runs)} invocations that built this folder (stages done before were "
            f"reused){code}.")


def code_line(run: dict[str, Any]) -> str:
    """The commit an invocation ran (`demo.code_version`), marked when its tree had changes."""
    if not run.get("commit"):
        return "not a git checkout"
    return f"commit {run['commit'][:10]}" + ("" if run.get("clean_tree") else " (uncommitted changes)")


def data_section(results: dict[str, Any]) -> list[str]:
    L = ["## The data each arm saw", "",
         "Per world, every arm trains on the same expert trajectories: SFT on the trajectories "
         "themselves, E2E RL on their tasks, PivotRL on the pivots among all their turns (no "
         "filter: all the turns; random: as many random turns as pivots; exact: the pivots with "
         "the strict string-match reward).", "",
         "Unverifiable: turns on which no probe changes the expert's outcome (a memorised answer "
         "would be paid there); never pivots.", "",
         "| world | trajectories | turns profiled | unverifiable | all-fail | all-pass | mixed | "
         "pivots kept |",
         "|---|---|---|---|---|---|---|---|"]
    for w, s in results.get("pivots", {}).items():
        L.append(f"| {w} | {s.get('trajectories', '—')} | {s.get('turns')} | "
                 f"{s.get('unverifiable', '—')} | {s.get('all_fail')} | "
                 f"{s.get('all_pass')} | {s.get('mixed')} | {s.get('kept')} |")
    return L + [""]


def power_section(results: dict[str, Any]) -> list[str]:
    if not results.get("power"):
        return []
    L = ["## Power (computed from the base before any training)", "",
         "95% half-width of a paired difference if two arms' item outcomes were independent at the "
         "base's rate, whatever the seeds (they are scored on the same items); arms that agree on "
         "many items get narrower intervals, arms whose seeds differ wider ones "
         "(stats.paired_halfwidth):", "",
         "| measure | eval items | clusters | seeds | base rate | half-width | MDE (80% power) | "
         "half-width at rate 0.5 |", "|---|---|---|---|---|---|---|---|"]
    for p in results["power"]:
        L.append(f"| {MEASURE_NAMES[p['measure']]} | {p['items']} | {p['clusters']} | {p['seeds']} | "
                 f"{_f(p['rate'])} | ±{_f(p['half_width'])} | {_f(p['mde_80'])} | "
                 f"±{_f(p.get('worst_half_width'))} |")
    return L + [""]


def _ood_mean(ood: dict[str, Any], agentic: bool) -> float | None:
    """Mean accuracy over one kind of OOD family (agentic-format or not); None when none."""
    accs = [x["accuracy"] for f, x in ood.items() if (f in AGENTIC_FAMILIES) == agentic]
    return sum(accs) / len(accs) if accs else None


def results_section(results: dict[str, Any]) -> list[str]:
    fams = sorted({f for v in results["methods"].values() for f in v.get("ood", {})})
    plain = [f for f in fams if f not in AGENTIC_FAMILIES]
    agentic = [f for f in fams if f in AGENTIC_FAMILIES]
    L = ["## Dev-chosen checkpoints, measured on eval", "",
         f"Each world's run chose its own step, and each method its lr, on the dev split by "
         f"{MEASURE_NAMES.get(results.get('select_on', 'turn'))} "
         f"({results.get('select_decoding', 'greedy')}, the dev score); the numbers are on the "
         "disjoint eval split, greedy (means over worlds and seeds; [95% interval over seeds] "
         "with ≥ 2 seeds; the sampled ones are in the verdicts).", "",
         "| method | lr | step per world (per seed: /) | dev score | turn accuracy | episode success | "
         "non-agentic OOD | " + ("agentic-format OOD | " if agentic else "")
         + "KL to base (OOD) | rollout turns |", "|---|---|---|---|---|---|---|---|---|"
         + ("---|" if agentic else "")]
    for m, v in results["methods"].items():
        ind = v.get("in_domain", {})
        ta = mean_turn_accuracy(ind)
        ep = sum(x["success"] for x in ind.values()) / len(ind) if ind else None
        ood = v.get("ood", {})
        oa = _f(_ood_mean(ood, False)) + (f" | {_f(_ood_mean(ood, True))}" if agentic else "")
        c = v["chosen"]
        L.append(f"| {m} | {c['lr']:g} | {chosen_steps(c)} | "
                 f"{_f(c.get('dev_score'))} | {_f(ta)} | {_f(ep)} | {oa} | "
                 f"{_f(v.get('kl_to_base'))} | {v.get('rollout_turns', '—')} |")
    worlds = sorted({w for v in results["methods"].values() for w in v.get("in_domain", {})})
    fams = plain + agentic
    heads = [f"OOD {f}" for f in plain] + [f"agentic-format OOD {f}" for f in agentic]
    kinds = (", per non-agentic OOD family and per agentic-format OOD family (the worlds' system "
             "prompt and tools offered; the right answer is plain text)" if agentic
             else " and per OOD family")
    L += ["", f"Per world (episode success / turn accuracy){kinds}, same checkpoints:", "",
          "| method | " + " | ".join(worlds + heads) + " |",
          "|---|" + "---|" * (len(worlds) + len(fams))]
    for m, v in results["methods"].items():
        cells = [f"{_f(v.get('in_domain', {}).get(w, {}).get('success'))} / "
                 f"{_f(v.get('in_domain', {}).get(w, {}).get('turn_accuracy'))}" for w in worlds]
        cells += [_f(v.get("ood", {}).get(f, {}).get("accuracy")) for f in fams]
        L.append(f"| {m} | " + " | ".join(cells) + " |")
    return L + [""]


def health_section(results: dict[str, Any]) -> list[str]:
    """Every collapsed measure and world failure (`pivotrl_testbed.health`) and every arm chosen
    at its cap (`budget.capped_flags`), before any number."""
    flagged = results.get("health") or []
    if not flagged:
        return ["No measure collapsed, no world failed and no arm was chosen at its cap "
                "(pivotrl_testbed/health.py, budget.py).", ""]
    return (["## Warnings: measures to distrust", "",
             f"{len(flagged)} measure(s) collapsed, met a failing world or were chosen at the "
             "cap; their numbers below are kept, not repaired:", ""]
            + [f"- **{f['kind']}**: {f['why']}" for f in flagged] + [""])


def decoding_section(results: dict[str, Any]) -> list[str]:
    """Each arm's dev turn accuracy over the temperature grid, the temperature it is judged at,
    and pass@k / pass^k on eval at the training temperature."""
    dec = results.get("decoding") or {}
    if not dec.get("dev"):
        return []
    temps = [f"{t:g}" for t in dec["temperatures"]]
    ks = sorted({key for p in dec.get("pass", {}).values() for key in p if "@" in key or "^" in key},
                key=lambda key: (key[4], int(key[5:])))
    L = ["## Decoding: each arm at its dev-best temperature", "", dec["rule"], "",
         "| method | " + " | ".join(f"dev T={t}" for t in temps) + " | judged at T | "
         + " | ".join(f"{key} (eval, T={dec['train_temperature']:g})" for key in ks) + " |",
         "|---|" + "---|" * (len(temps) + 1 + len(ks))]
    for m, scores in dec["dev"].items():
        p = dec.get("pass", {}).get(m, {})
        L.append(f"| {m} | " + " | ".join(_f(scores.get(t)) for t in temps)
                 + f" | {dec['best'][m]:g} | " + " | ".join(_f(p.get(key)) for key in ks) + " |")
    return L + ["", "The verdicts marked dev-best are the headline: each arm at its own "
                "temperature above; the greedy and sampled ones are beside them.", ""]


def verdict_measure(v: dict[str, Any]) -> str:
    """A verdict's measure and, when it was scored both ways, its decoding."""
    return MEASURE_NAMES[v["measure"]] + (f" ({v['decoding']})" if v.get("decoding") else "")


def _verdict(verdict: str, note: str | None) -> str:
    return f"**{verdict}**" + (f" ({note})" if note else "")


def ratio_text(r: dict[str, Any]) -> str:
    """A rollout ratio with its interval, or, when an end of the interval is the estimate
    itself (`stats.rollout_ratio`'s `bound`), the bound it is."""
    if not r or r.get("ratio") is None:
        return "—"
    lo, hi = (r.get("ci95") or [None, None])[:2]
    if r.get("bound") == "upper":
        return f"ratio ≤ {r['ratio']:.1f}× (a bound: the interval's upper end is the estimate; [{_f(lo, 1)}, {_f(hi, 1)}])"
    if r.get("bound") == "lower":
        return f"ratio ≥ {r['ratio']:.1f}× (a bound: the interval's lower end is the estimate; [{_f(lo, 1)}, {_f(hi, 1)}])"
    return f"ratio {r['ratio']:.1f}× [{_f(lo, 1)}, {_f(hi, 1)}]"


def compute_section(results: dict[str, Any]) -> list[str]:
    """Each arm's compute at its chosen checkpoints (`compute.py`) beside its eval turn accuracy;
    tokens a run did not record read "not recorded", never 0."""
    block = results.get("compute") or {}
    if not block.get("arms"):
        return []

    def tokens(x: float | None) -> str:
        return "not recorded" if x is None else f"{x:,.0f}"

    L = ["## What each arm spent (at its chosen checkpoints; means over seeds, sums over worlds)", "",
         "| arm | turn accuracy (eval) | training tokens (forward + backward) | rollout tokens | "
         "rollout turns | profiling samples | training s (to the chosen step) | training s (whole run) |",
         "|---|---|---|---|---|---|---|---|"]
    for m, c in block["arms"].items():
        acc = _f(mean_turn_accuracy((results.get("methods") or {}).get(m, {}).get("in_domain", {})))
        L.append(f"| {m} | {acc} | {tokens(c.get('training_tokens'))} | {tokens(c.get('rollout_tokens'))} | "
                 f"{_f(c['rollout_turns'], 0)} | {c['profiling_samples']} | "
                 f"{_f(c['train_seconds'], 0)} | {_f(c['train_seconds_run'], 0)} |")
    r = block.get("pivotrl_over_e2e")
    if r:
        L += ["", f"PivotRL's cost as a fraction of E2E RL's: rollout turns {_f(r['rollout_turns'], 2)} "
              f"(profiling included), training seconds {_f(r['train_seconds'], 2)}, training tokens "
              f"{_f(r.get('training_tokens'), 2)}, rollout tokens {_f(r.get('rollout_tokens'), 2)} "
              "(profiling not included)."]
    return L + ["", *([f"Not in the table: {block['note']}.", ""] if block.get("note") else [])]


ONE_SEED_SIDE = "1 seed: indicative"


def one_seed(verdict: dict[str, Any]) -> bool:
    """Whether either side of a verdict was trained on one seed (the ablations in --full)."""
    return any(len({str(s) for by_seed in (side.get("steps") or {}).values() for s in by_seed}) == 1
               for side in (verdict.get("a"), verdict.get("b")) if isinstance(side, dict) and side.get("method") != "base")


def verdict_section(results: dict[str, Any]) -> list[str]:
    L = ["## The paper's claims against ours (paired, eval split)", "", RULE, "",
         "| claim | measure | a | b | a vs b | Δ [95% CI] | verdict |", "|---|---|---|---|---|---|---|"]
    note = results.get("note")
    if note:  # a one-seed run: every verdict below is indicative
        L[4:4] = [f"**{note}**: every verdict below comes from one training seed.", ""]
    for v in results.get("verdicts", []):
        label = note or (ONE_SEED_SIDE if one_seed(v) else None)
        if v["diff"] is None:
            L.append(f"| {v['claim']} | {verdict_measure(v)} | {_side(v['a'])} | "
                     f"{_side(v['b'])} | — | — | {_verdict(v['verdict'], label)} |")
            continue
        L.append(f"| {v['claim']} | {verdict_measure(v)} | {_side(v['a'])} | {_side(v['b'])} | "
                 f"{v['a_mean']:.3f} vs {v['b_mean']:.3f} ({v['pairs']} pairs, {v['clusters']} clusters"
                 f"{'; ' + ', '.join(v['worlds']) if v.get('worlds') else ''}) | "
                 f"{v['diff']:+.3f} [{v['ci95'][0]:+.3f}, {v['ci95'][1]:+.3f}] | {_verdict(v['verdict'], label)} |")
    tm = (results.get("turns_to_match_e2e") or {}).get("by_measure", {})
    for measure, r in tm.items():
        wo = r.get("without_profiling") or {}
        L.append(f"| PivotRL reaches E2E RL's accuracy with ≥ {PAPER['rollout_ratio']:g}× fewer rollout "
                 f"turns (dev split: E2E's target is its dev-best score, read only when ≥ the base's "
                 f"+ 0.05; PivotRL's curve every checkpoint's) | {MEASURE_NAMES[measure]} | pivotrl "
                 f"| e2e_rl | target {r['target']:.3f} (base {_f(r.get('base'))}): PivotRL "
                 f"{_f(r['pivotrl'], 0) if r['pivotrl'] else 'never'} turns vs E2E "
                 f"{r['e2e_rl']:.0f} (without the {r['profiling_turns']} profiling turns: "
                 f"{ratio_text(wo)}) | {ratio_text(r)} | {_verdict(r['verdict'], note)} |")
    if tm:
        method = next((r.get("interval_method") for r in tm.values() if r.get("interval_method")), None)
        if method:
            L += ["", f"The rollout ratio's interval: {method}."]
    bound = (results.get("turns_to_match_e2e") or {}).get("schedule_bound")
    if bound:
        L += ["", f"The schedule could show at most {bound['with_profiling']:.2f}× with profiling "
              f"and {bound['without_profiling']:.2f}× without (printed before training: PivotRL "
              "reaching E2E RL's target at its first checkpoint, E2E RL at its cap); a bound below "
              f"{PAPER['rollout_ratio']:g}× decides the rollout claim by the schedule, not the runs."]
    return L + [""]


def theory_section(results: dict[str, Any], plots: list[str]) -> list[str]:
    th = results["theory"]
    L = ["## Theory checks, each beside its null control", ""]
    if "grad_norm_vs_std_corr" in th:
        L += [f"Theorem 3.2 on {th.get('mixed_states')} mixed states of the base ({th.get('zero_std_states')} "
              "zero-std states left out: their gradient is 0 by construction). Sampled token ids are "
              "scored as generated; half the samples drive the update, the other half are held out.", "",
              "| statistic | verifier rewards | null: rewards shuffled within the state |", "|---|---|---|",
              f"| Pearson r, plain gradient norm vs reward std | {_f(th['grad_norm_vs_std_corr'])} | "
              f"{_f(th.get('null_grad_norm_vs_std_corr'))} |",
              f"| mean held-out progress per unit step [95% CI over states] | "
              f"{_f(th.get('progress_mean'), 4)} {_ci(th.get('progress_ci95'))} | "
              f"{_f(th.get('null_progress_mean'), 4)} {_ci(th.get('null_progress_ci95'))} |",
              f"| mean g_A·g_B, unbiased ‖true gradient‖² [95% CI] | {_f(th.get('signal_mean'), 4)} "
              f"{_ci(th.get('signal_ci95'))} | {_f(th.get('null_signal_mean'), 4)} "
              f"{_ci(th.get('null_signal_ci95'))} |",
              f"| share of states with held-out progress > 0 | {_f(th.get('progress_positive'), 2)} | "
              f"{_f(th.get('null_progress_positive'), 2)} |",
              f"| Pearson r, held-out progress vs reward std | {_f(th.get('progress_vs_std_corr'))} | "
              f"{_f(th.get('null_progress_vs_std_corr'))} |", "",
              "The gradient-norm correlation holds under the null as well (the coefficients r − r̄ scale "
              "with the std for any rewards): it is not evidence. Held-out progress and g_A·g_B are: "
              "their expectation is 0 under the null and positive only if what the verifier rewards "
              "in one half generalises to the other. GRPO-normalised "
              f"gradient norm (÷ sample std): pivots {_f(th.get('grad_norm_grpo_pivots'))}, other mixed "
              f"states {_f(th.get('grad_norm_grpo_other_mixed'))}."]
        if "theory_grad_vs_std.png" in plots:
            L += ["", "![theorem 3.2](theory_grad_vs_std.png)"]
    prefs = th.get("preferences") or {}
    if prefs:
        L += ["", "Theorem 3.3 at pivot states: log π_θ/π_0 over the sampled actions the verifier rejects "
              "(dispersion 0 and rank corr. 1 = the base's preferences among them kept exactly):", "",
              "| world | model (dev-chosen, first seed) | states | dispersion of log-ratio | rank corr. |",
              "|---|---|---|---|---|"]
        for world, p in prefs.items():
            for name, v in p["models"].items():
                L.append(f"| {world} | {name} | {p['states']} | {_f(v['dispersion'])} | {_f(v['rank_corr'])} |")
    L += ["", "Drift on OOD text (all positions, template tokens included; descriptive):", "",
          "| method | KL to base | rank corr. of top tokens |", "|---|---|---|"]
    for m in results["methods"]:
        L.append(f"| {m} | {_f(th['ood_kl_to_base'].get(m))} | {_f(th['ood_rank_corr'].get(m))} |")
    if "theory_drift.png" in plots:
        L += ["", "![drift along training](theory_drift.png)"]
    return L + [""]


def choice_section(results: dict[str, Any]) -> list[str]:
    """The rules that chose every checkpoint, lr and temperature below, named before any number."""
    rules = results.get("choice_rules")
    if not rules:  # a results.json written before the rules were recorded
        return []
    L = ["## How the arms were chosen", ""]
    L += [f"- {name}: {text}" for name, text in rules.items()]
    L += ["- decoding: each arm at its dev-best temperature (the decoding section below gives the rule).",
          "- ablations: trained on fewer seeds and worlds than the headline arms where the config says "
          "so (`ablation_seeds`, `ablation_worlds`); a verdict on a one-seed side is marked indicative.", ""]
    return L


def render_markdown(results: dict[str, Any], plots: list[str]) -> str:
    L = ["# pivotrl demo report", "",
         f"{wall_time_line(results)} Seeds {results['seeds']}; every number below was measured by the "
         "runs that built this folder. Checkpoints and learning rates are chosen on the dev split; "
         "results and verdicts are on the disjoint eval split.", ""]
    L += health_section(results) + choice_section(results)
    L += data_section(results) + power_section(results) + results_section(results)
    L += decoding_section(results) + verdict_section(results) + compute_section(results)
    L += ["## Every checkpoint (descriptive)", "", "Dev split, every lr and step (the eval split is "
          "scored at the dev-chosen checkpoints only): the frontier and compute plots show the whole "
          "grid; no verdict is drawn from them.", "",
          "![frontier](frontier.png)", "", "![compute](compute.png)", ""]
    L += theory_section(results, plots)
    L += ["Paper (Qwen3-30B-A3B): in-domain base 17.84 / SFT 27.77 / PivotRL 31.95; OOD change vs base "
          "SFT −9.83 / PivotRL +0.21; E2E accuracy with 4× fewer rollout turns; τ² ablation full 63.81 / "
          "no filter 59.68 / exact-match 57.34 / SFT 58.44. Our testbed is a CPU toy; where a claim is "
          "not met above, the report says so and adjusts nothing after seeing the numbers.", ""]
    return "\n".join(L)
