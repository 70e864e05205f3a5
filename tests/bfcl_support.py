"""BFCL single-turn cases, mutated expert calls, and BFCL's own `ast_checker` as the judge.

Shared by tests/test_bfcl_agreement.py and `python3 tests/bfcl_support.py` (prints the
per-mutation agreement table used in the report).
"""

from __future__ import annotations

import copy
import json
import os
import random
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # fake_judge, run as a script too

from pivotrl_testbed.bfcl import install_model_config_stub, to_openai_tool  # noqa: F401
from pivotrl.io.records import Message, Turn

# Python-language categories with possible answers (Java/JS pass every value as a string).
CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "live_simple",
              "live_multiple", "live_parallel", "live_parallel_multiple")
MODEL = "pivotrl-agreement"
_DROP = object()


def ast_module():
    install_model_config_stub()
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval import ast_checker

    return ast_checker, Language


def load(category: str) -> list[tuple[dict, list]]:
    import bfcl_eval

    root = Path(os.path.dirname(bfcl_eval.__file__)) / "data"
    answers = {}
    with (root / "possible_answer" / f"BFCL_v4_{category}.json").open() as fh:
        for line in fh:
            a = json.loads(line)
            answers[a["id"]] = a["ground_truth"]
    out = []
    with (root / f"BFCL_v4_{category}.json").open() as fh:
        for line in fh:
            e = json.loads(line)
            out.append((e, answers[e["id"]]))
    return out


def _first(options: list, index: int = 0) -> Any:
    """One concrete value from a list of acceptable ones ("" = may be omitted)."""
    if not isinstance(options, list) or not options:
        return _DROP
    value = options[min(index, len(options) - 1)]
    if value == "":
        return _DROP
    if isinstance(value, dict):
        return _concrete(value)
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [_concrete(v) for v in value]
    return copy.deepcopy(value)


def _concrete(options_by_key: dict) -> dict:
    out = {}
    for key, options in options_by_key.items():
        v = _first(options)
        if v is not _DROP:
            out[key] = v
    return out


def expert_calls(ground_truth: list) -> list[tuple[str, dict]]:
    return [(name, _concrete(params)) for call in ground_truth for name, params in call.items()]


def as_message(calls: list[tuple[str, dict]]) -> Message:
    return Message(role="assistant", tool_calls=[
        {"id": f"call_{i}", "type": "function",
         "function": {"name": n, "arguments": json.dumps(a)}} for i, (n, a) in enumerate(calls)])


def _docs_by_name(entry: dict) -> dict[str, dict]:
    return {f["name"]: f for f in entry["function"]}


def mutations(entry: dict, gt: list, rng: random.Random) -> list[tuple[str, list[tuple[str, dict]]]]:
    """(mutation name, candidate calls) for one BFCL entry."""
    calls = expert_calls(gt)
    docs = _docs_by_name(entry)
    out: list[tuple[str, list]] = [("identity", calls)]

    def edit(fn):  # apply fn(name, args, doc) to the first call that it changes
        for i, (name, args) in enumerate(calls):
            res = fn(name, copy.deepcopy(args), docs.get(name, {}), gt[i][name])
            if res is not None:
                new = copy.deepcopy(calls)
                new[i] = res
                return new
        return None

    def props(doc):
        return (doc.get("parameters") or {}).get("properties") or {}

    def required(doc):
        return set((doc.get("parameters") or {}).get("required") or [])

    out.append(("reordered_keys", [(n, dict(reversed(list(a.items())))) for n, a in calls]))

    def int_to_float(name, args, doc, pa):
        for k, v in args.items():
            if type(v) is int:
                args[k] = float(v)
                return name, args
    def float_to_int(name, args, doc, pa):
        for k, v in args.items():
            if type(v) is float and v.is_integer():
                args[k] = int(v)
                return name, args
    def drop_optional(name, args, doc, pa):
        for k in args:
            if k not in required(doc):
                del args[k]
                return name, args
    def add_default(name, args, doc, pa):
        for k, p in props(doc).items():
            if k not in args and "default" in p and k in pa:
                args[k] = p["default"]
                return name, args
    def wrong_number(name, args, doc, pa):
        for k, v in args.items():
            if type(v) in (int, float):
                args[k] = v + 1
                return name, args
    def wrong_string(name, args, doc, pa):
        for k, v in args.items():
            if isinstance(v, str) and v:
                args[k] = v + " extra"
                return name, args
    def flip_bool(name, args, doc, pa):
        for k, v in args.items():
            if isinstance(v, bool):
                args[k] = not v
                return name, args
    def upper_case(name, args, doc, pa):
        for k, v in args.items():
            if isinstance(v, str) and v.upper() != v:
                args[k] = v.upper()
                return name, args
    def respace(name, args, doc, pa):
        for k, v in args.items():
            if isinstance(v, str) and ", " in v:
                args[k] = v.replace(", ", " ")
                return name, args
    def alternative(name, args, doc, pa):
        for k, options in pa.items():
            if len(options) > 1 and options[1] != "" and k in args:
                alt = _first(options, 1)
                if alt != args[k]:
                    args[k] = alt
                    return name, args
    def drop_required(name, args, doc, pa):
        for k in args:
            if k in required(doc):
                del args[k]
                return name, args
    def extra_arg(name, args, doc, pa):
        args["extra_flag"] = True
        return name, args
    def stringify_number(name, args, doc, pa):
        for k, v in args.items():
            if type(v) in (int, float) and not isinstance(v, bool):
                args[k] = str(v)
                return name, args
    def wrong_function(name, args, doc, pa):
        others = [n for n in docs if n != name]
        return (rng.choice(others) if others else name + "_v2"), args
    def reverse_list(name, args, doc, pa):
        for k, v in args.items():
            if isinstance(v, list) and len(v) > 1 and v != v[::-1]:
                args[k] = v[::-1]
                return name, args

    for label, fn in [("int_to_float", int_to_float), ("float_to_int", float_to_int),
                      ("drop_optional", drop_optional), ("add_default", add_default),
                      ("wrong_number", wrong_number), ("wrong_string", wrong_string),
                      ("flip_bool", flip_bool), ("upper_case", upper_case), ("respace", respace),
                      ("alternative_answer", alternative), ("drop_required", drop_required),
                      ("extra_arg", extra_arg), ("stringify_number", stringify_number),
                      ("wrong_function", wrong_function), ("reverse_list", reverse_list)]:
        new = edit(fn)
        if new is not None:
            out.append((label, new))
    if len(calls) > 1:
        out.append(("reordered_calls", list(reversed(calls))))
        out.append(("dropped_call", calls[:-1]))
    out.append(("duplicated_call", calls + [calls[0]]))
    return out


def cases(categories=CATEGORIES, per_category: int | None = None, seed: int = 0):
    """Yield (category, mutation, turn, candidate message, ast verdict)."""
    ast_checker, Language = ast_module()
    rng = random.Random(seed)
    for category in categories:
        entries = load(category)
        if per_category is not None and len(entries) > per_category:
            entries = rng.sample(entries, per_category)
        for entry, gt in entries:
            tools = [to_openai_tool(f) for f in entry["function"]]
            expected = expert_calls(gt)
            turn = Turn(id=entry["id"], trajectory_id=entry["id"], turn=0, tools=tools,
                        context=[Message(role="user", content=entry["question"][0][-1]["content"])],
                        expected=as_message(expected))
            for label, calls in mutations(entry, gt, rng):
                verdict = ast_checker.ast_checker(
                    entry["function"], [{n: a} for n, a in calls], gt, Language.PYTHON,
                    category, MODEL)["valid"]
                if label == "identity" and not verdict:
                    break  # our concrete expert is not a valid answer: skip the entry
                yield category, label, turn, as_message(calls), verdict


def agreement(verifier, rows) -> dict[str, Any]:
    tp = fp = tn = fn = 0
    by_label: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    disagreements = []
    for category, label, turn, cand, truth in rows:
        pred = verifier.score(turn, cand).reward == 1.0
        tp += pred and truth
        fp += pred and not truth
        fn += (not pred) and truth
        tn += (not pred) and not truth
        by_label[label][0] += pred == truth
        by_label[label][1] += 1
        if pred != truth:
            disagreements.append((category, label, turn.id, pred, truth))
    n = tp + fp + tn + fn
    return {"n": n, "accuracy": (tp + tn) / n, "precision": tp / max(tp + fp, 1),
            "recall": tp / max(tp + fn, 1), "fp": fp, "fn": fn,
            "by_label": {k: (v[0] / v[1], v[1]) for k, v in sorted(by_label.items())},
            "disagreements": disagreements}


def oracle_rule(rows):
    """A judge stand-in that answers with BFCL's own verdict for (expert, candidate): the upper
    bound of what any judge adds to `unproven_rule: judge` (it is asked only about actions whose
    every difference is unproven). A pair seen with both verdicts gets NO."""
    from pivotrl.verifiers.judge import action_json

    truth: dict[tuple[str, str], bool] = {}
    for _, _, turn, cand, verdict in rows:
        exp, got = action_json(turn.expected), action_json(cand)
        for key in ((exp, got), (got, exp)):
            truth[key] = truth.get(key, verdict) and verdict
    return lambda a, b: "YES" if truth.get((a, b)) else "NO"


def judged_agreement(rows, rule) -> dict[str, Any]:
    """Agreement of `toolcall` with `unproven_rule: judge`, the judge being a FakeJudge endpoint
    answering by `rule(A, B)`; also how many actions were sent to it."""
    from fake_judge import FakeJudge
    from pivotrl.verifiers import get_verifier

    srv = FakeJudge(rule)
    try:
        verifier = get_verifier("toolcall", unproven_rule="judge",
                                judge={"base_url": srv.url, "retries": 0})
        out = agreement(verifier, rows)
        out["judge_requests"] = srv.requests
        return out
    finally:
        srv.close()


def main() -> None:
    from pivotrl.verifiers import get_verifier

    rows = list(cases())
    results = {name: agreement(get_verifier(name), rows) for name in ("toolcall", "exact")}
    results["toolcall bfcl"] = agreement(get_verifier("toolcall", normalize=["bfcl"]), rows)
    results["toolcall+oracle judge"] = judged_agreement(rows, oracle_rule(rows))
    print(f"{len(rows)} cases from {', '.join(CATEGORIES)}; judge: BFCL ast_checker")
    print(f"{'':22s}" + "".join(f"{n:>22s}" for n in results))
    for metric in ("accuracy", "precision", "recall", "fp", "fn"):
        print(f"{metric:22s}" + "".join(f"{r[metric]:22.3f}" if isinstance(r[metric], float)
                                       else f"{r[metric]:22d}" for r in results.values()))
    print(f"judge requests (both orders): {results['toolcall+oracle judge']['judge_requests']}")
    print("agreement by mutation (n):")
    for label, (acc, n) in results["toolcall"]["by_label"].items():
        print(f"  {label:20s} n={n:5d}  toolcall {acc:.3f}  exact "
              f"{results['exact']['by_label'][label][0]:.3f}  toolcall+oracle judge "
              f"{results['toolcall+oracle judge']['by_label'][label][0]:.3f}")
    if "-v" in sys.argv:
        for d in results["toolcall"]["disagreements"][:60]:
            print("  disagree", d)


if __name__ == "__main__":
    main()
