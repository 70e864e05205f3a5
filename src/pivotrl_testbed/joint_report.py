"""The report's joint-claim sections: frontier verdicts (frontier.py), the budget rule's stops
(budget.py) and where each arm gains (the mechanism), from the checkpoint and item rows.

Where an arm gains (`mechanism`): on the eval split, each side (the dev-chosen checkpoints of
every method and the frontier's matched checkpoints) against the base on turn accuracy, split by
world, by the turn's position in its trajectory (0, 1, 2, 3+) and by the expert action's kind
(tool call or message), for each decoding: stats.paired on the items of that group, with
`MECHANISM_REPLICATES` bootstrap replicates (descriptive: no verdict is read from a group).
"""

from __future__ import annotations

from typing import Any

from pivotrl_testbed import stats
from pivotrl_testbed.budget import RULE
from pivotrl_testbed.checkpoint_eval import DECODINGS, decoded
from pivotrl_testbed.frontier import MATCHES, FrontierConfig, joint, side_of

MECHANISM_REPLICATES = 500


def position_bucket(row: dict[str, Any]) -> str | None:
    """A turn's position in its trajectory (0-based), the late turns together as "3+"."""
    pos = row.get("position")
    return None if pos is None else "3+" if int(pos) >= 3 else str(int(pos))


GROUPS = {"world": lambda r: r["world"], "position": position_bucket, "kind": lambda r: r.get("kind")}


def budget_stops(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Where and why each run stopped (the last row of each run carries it)."""
    return [{k: r.get(k) for k in ("method", "world", "lr", "seed", "stop_step", "stop_reason")}
            for r in rows if r.get("stop_reason")]


def mechanism(items: list[dict[str, Any]], sides: dict[str, dict[str, Any]],
              measure: str = "turn") -> list[dict[str, Any]]:
    """Each side's gain over the base on eval `measure`, per group and decoding (module doc)."""
    out = []
    for decoding in DECODINGS:
        mine = [r for r in decoded(items, decoding) if r["split"] == "eval" and r["measure"] == measure]
        base = stats.base_side(mine)
        for by, key in GROUPS.items():
            groups = sorted({g for r in mine if (g := key(r)) is not None})
            for name, side in sides.items():
                for g in groups:
                    got = stats.paired([r for r in mine if key(r) == g], side, base, measure=measure,
                                       replicates=MECHANISM_REPLICATES)
                    if got:
                        out.append({"side": name, "decoding": decoding, "by": by, "group": g,
                                    "gain": got["diff"], "ci95": got["ci95"], "pairs": got["pairs"],
                                    "a_mean": got["a_mean"], "base_mean": got["b_mean"]})
    return out


def joint_results(rows: list[dict[str, Any]], items: list[dict[str, Any]], chosen: dict[str, Any],
                  cfg: FrontierConfig) -> dict[str, Any]:
    """results.json's "joint", "budget" and "mechanism" entries."""
    result = joint(items, rows, cfg)
    sides = {m: side_of(v) for m, v in chosen.items() if m != "base"}
    for name, v in result["verdicts"].items():
        if v["pair"]:
            sides.update({f"{name}: {k}": side_of(v["pair"][k]) for k in ("a", "b")})
    return {"joint": result, "budget": budget_stops(rows), "mechanism": mechanism(items, sides)}


def _f(x: Any, digits: int = 3) -> str:
    return "—" if x is None else f"{x:+.{digits}f}" if isinstance(x, float) else str(x)


def _ci(ci: list[float] | None) -> str:
    return "" if not ci else f" [{ci[0]:+.3f}, {ci[1]:+.3f}]"


def _point(p: dict[str, Any]) -> str:
    kl = "—" if p.get("kl_to_base") is None else f"{p['kl_to_base']:.3f}"
    return (f"{p['method']} lr {p['lr']:g} step {p['step']}: gain {_f(p['gain'])}, "
            f"retention {_f(p['retention'])}, KL {kl}")


def joint_markdown(results: dict[str, Any]) -> list[str]:
    j = results.get("joint")
    if not j:
        return []
    c = j["config"]
    L = ["## The joint claim on the frontier (matched on dev, measured on eval)", "",
         frontier_rule(c), "",
         "| claim | matched pair (dev) | decoding | a vs b (eval) | Δ [95% CI] | verdict |",
         "|---|---|---|---|---|---|"]
    for v in j["verdicts"].values():
        pair = v["pair"]
        where = (f"{_point(pair['a'])} ↔ {_point(pair['b'])} (|Δ {v['matched_on']}| "
                 f"{pair['distance']:.3f})" if pair else f"no pair within ±{v['tolerance']:g}")
        for d, got in v["by_decoding"].items():
            if got.get("diff") is None:
                L.append(f"| {v['claim']} | {where} | {d} | — | — | **{got['verdict']}** |")
                continue
            L.append(f"| {v['claim']} | {where} | {d} | {got['a_mean']:.3f} vs {got['b_mean']:.3f} "
                     f"({got['pairs']} pairs) | {_f(got['diff'])}{_ci(got['ci95'])} | **{got['verdict']}** |")
    L += ["", "![frontiers](joint_frontier.png)", "", "Frontier points (dev; gain and retention vs "
          "the base, KL to the base on OOD text):", ""]
    for arm, pts in j["frontier"].items():
        L += [f"- {arm}: " + ("; ".join(_point(p) for p in pts) or "none")]
    L += [""] + dispersion_markdown(results) + budget_markdown(results) + mechanism_markdown(results)
    return L


def dispersion_markdown(results: dict[str, Any]) -> list[str]:
    prefs = (results.get("theory") or {}).get("matched_preferences") or {}
    if not prefs:
        return []
    L = ["Theorem 3.3 at the matched checkpoints (first seed): dispersion of log π_θ/π_0 over the "
         "sampled actions the verifier rejects at pivot states (0 = the base's preferences among "
         "them kept):", "", "| world | checkpoint | states | dispersion | rank corr. |", "|---|---|---|---|---|"]
    for world, p in prefs.items():
        for name, v in p["models"].items():
            L.append(f"| {world} | {name} | {p['states']} | {_f(v['dispersion'])} | {_f(v['rank_corr'])} |")
    return L + [""]


def frontier_rule(c: dict[str, Any]) -> str:
    a, b = c["arms"]
    return (f"Rule (experiment/frontier.py, fixed before results): every training step at each lr (each "
            f"world's and seed's run at its checkpoint there, a run stopped earlier at its last) is a "
            f"dev point: gain and retention are its paired differences against the "
            f"base on {c['measure']} and non-agentic OOD ({c['decoding']} decoding). For each point on {a}'s "
            f"frontier with gain > 0, the {b} checkpoint nearest on the matched coordinate within "
            f"±{c['tolerance']:g} (ties in {b}'s favour); of those pairs, the one at {a}'s largest "
            "gain. " + "; ".join(f"`{n}`: matched on {on}, judged on {m}" for n, (on, m, _) in MATCHES.items())
            + f". KL to the base is matched within ±{c.get('kl_tolerance', 0.25):g} of {a}'s KL "
            "(a share: KL has no absolute scale).")


def budget_markdown(results: dict[str, Any]) -> list[str]:
    stops = results.get("budget") or []
    if not stops:
        return []
    b = (results.get("config") or {}).get("budget") or {}
    L = ["## The budget rule, applied to every run", "",
         f"{RULE} (patience {b.get('patience', '—')}, min improvement {b.get('min_improvement', '—')}, "
         f"cap {(results.get('config') or {}).get('steps', '—')} steps)", "",
         "| method | world | lr | seed | stopped at | why |", "|---|---|---|---|---|---|"]
    L += [f"| {s['method']} | {s['world']} | {s['lr']:g} | {s['seed']} | {s['stop_step']} | "
          f"{s['stop_reason']} |" for s in stops]
    return L + [""]


def mechanism_markdown(results: dict[str, Any]) -> list[str]:
    rows = results.get("mechanism") or []
    if not rows:
        return []
    L = ["## Where each arm gains (eval turn accuracy vs the base; descriptive)", "",
         "| side | decoding | by | group | side vs base | gain [95% CI] |", "|---|---|---|---|---|---|"]
    L += [f"| {r['side']} | {r['decoding']} | {r['by']} | {r['group']} | {r['a_mean']:.3f} vs "
          f"{r['base_mean']:.3f} ({r['pairs']}) | {_f(r['gain'])}{_ci(r['ci95'])} |" for r in rows]
    return L + [""]
