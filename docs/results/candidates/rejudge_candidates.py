"""Apply the task criteria as amended (`pivots` judged at the positions that hold a planted step,
`testbed/task_criteria.py`) to the committed records of candidates U–Z, in registration order, and
name the first that meets every criterion.

    python3 docs/results/candidates/rejudge_candidates.py --out docs/results/candidates/amended_criteria.json

Reads each candidate's `docs/results/candidates/<c>/build.json` and `criteria.json` (every
criterion but `pivots` is taken from the record as judged; nothing is re-measured) and its config
(`docs/results/candidates/<c>/config.yaml`), from which the planted-steps table is computed
(`testbed/planted.py`: the demo's expert data depends only on the config).
"""

import argparse
import json
from pathlib import Path

from pivotrl_testbed.testbed.build import load_testbed_config
from pivotrl_testbed.testbed.planted import planted_table
from pivotrl_testbed.testbed.task_criteria import pivots_criterion

REGISTRATION_ORDER = ("u", "v", "w", "x", "y", "z")  # the registration commits' order (RESULTS)
RECORDS = Path("docs/results/candidates")


def rejudge(candidate: str) -> dict:
    cfg = load_testbed_config(f"docs/results/candidates/{candidate}/config.yaml")
    build = json.loads((RECORDS / candidate / "build.json").read_text())
    if build["config_hash"] != cfg.digest():
        raise SystemExit(f"{candidate}: build.json's config hash {build['config_hash']} is not its "
                         f"config's {cfg.digest()}")
    criteria = json.loads((RECORDS / candidate / "criteria.json").read_text())
    planted = planted_table(None, cfg)
    amended = {**criteria, "pivots": pivots_criterion(build, planted, cfg.worlds)}
    verdicts = {name: v["verdict"] for name, v in amended.items()}
    return {"config_hash": cfg.digest(), "planted": planted, "pivots": amended["pivots"],
            "pivots_as_first_judged": criteria["pivots"]["verdict"], "verdicts": verdicts,
            "met": sum(v == "met" for v in verdicts.values()), "of": len(verdicts)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    judged = {}
    for c in REGISTRATION_ORDER:
        judged[c] = rejudge(c)
        j = judged[c]
        print(f"{c}: {j['met']} of {j['of']} met (pivots {j['pivots_as_first_judged']} -> "
              f"{j['pivots']['verdict']}); planted positions {j['pivots']['planted_positions']}")
    chosen = next((c for c in REGISTRATION_ORDER if judged[c]["met"] == judged[c]["of"]), None)
    print(f"the first candidate that meets every criterion: {chosen or 'none'}")
    args.out.write_text(json.dumps({"order": list(REGISTRATION_ORDER), "chosen": chosen,
                                    "candidates": judged}, indent=1) + "\n")


if __name__ == "__main__":
    main()
