"""Re-render a demo folder's report.md from its results.json with today's report code, adding
the choice rules (`results.json`'s `choice_rules`) to a results.json written before they were
recorded. Nothing is re-measured or re-chosen: every number comes from results.json as the run
wrote it, and the rules added are the ones that run's code applied (its config's learning rates
name their source).

    python3 docs/results/z_default/rerender_report.py RUN
"""

import argparse
import json
from pathlib import Path

from pivotrl_testbed.joint_report import joint_markdown
from pivotrl_testbed.report import choice_rules
from pivotrl_testbed.report_md import render_markdown


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    run = ap.parse_args().run
    results = json.loads((run / "results.json").read_text())
    if "choice_rules" not in results:
        results["choice_rules"] = choice_rules(results["config"])
        (run / "results.json").write_text(json.dumps(results, indent=2))
    plots = sorted(p.name for p in run.glob("*.png"))
    (run / "report.md").write_text(render_markdown(results, plots) + "\n".join(joint_markdown(results)))
    print(f"{run}/report.md re-rendered; choice rules: {json.dumps(results['choice_rules'], indent=1)}")


if __name__ == "__main__":
    main()
