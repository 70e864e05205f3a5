"""Do two runs of the same demo make the same choices? Each arm's dev-chosen lr, checkpoints
(per world and seed) and temperature, read from two demo folders' results.json, side by side.

The demo's choice rule is meant to be one float noise cannot move (`stats.choose`: the earliest
checkpoint within δ of the best). Rerunning the same config in another process at another thread
count (`threads`, `workers`) reorders the float sums, so the dev scores differ in their last
digits; this script says whether any choice followed them, and prints each arm's dev score in
both runs so a moved choice can be told from a moved score.

    python3 scripts/same_choices.py RUN_A RUN_B      # exit 1 when any choice differs
"""

import json
import sys
from pathlib import Path


def choices(run: Path) -> dict[str, dict]:
    results = json.loads((run / "results.json").read_text())
    best = (results.get("decoding") or {}).get("best") or {}
    return {m: {"lr": v["chosen"]["lr"], "steps": v["chosen"]["steps"],
                "temperature": best.get(m), "dev_score": v["chosen"].get("dev_score")}
            for m, v in sorted(results["methods"].items())}


def main() -> int:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    a, b = (choices(Path(p)) for p in sys.argv[1:])
    moved = 0
    for m in sorted(set(a) | set(b)):
        ca, cb = a.get(m), b.get(m)
        same = ca is not None and cb is not None and all(ca[k] == cb[k] for k in ("lr", "steps", "temperature"))
        moved += not same
        score = lambda c: "—" if c is None or c["dev_score"] is None else f"{c['dev_score']:.4f}"  # noqa: E731
        print(f"{m:18} {'same' if same else 'MOVED'}  A: {ca and {k: ca[k] for k in ('lr', 'steps', 'temperature')}}"
              f" dev {score(ca)}  B: {cb and {k: cb[k] for k in ('lr', 'steps', 'temperature')}} dev {score(cb)}")
    print(f"{moved} of {len(set(a) | set(b))} arms' choices differ")
    return 1 if moved else 0


if __name__ == "__main__":
    sys.exit(main())
