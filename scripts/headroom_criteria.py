"""Check a built testbed against the acceptance criteria for a base with headroom
(docs/RESULTS.md; `pivotrl_testbed.testbed.criteria`): the demo with the SFT arm only, under its
own budget rule and selection, the dev split scored greedily too; then every criterion from the
build record and the items.

    python3 scripts/headroom_criteria.py BUILD_DIR --config CONFIG.yaml --out RUN_DIR

BUILD_DIR must be a finished build of CONFIG (the script never builds): it writes RUN_DIR
(the demo's folder) and RUN_DIR/criteria.json.
"""

import argparse
import json
import sys
from pathlib import Path

from pivotrl_testbed.demo import DemoConfig, run_demo
from pivotrl_testbed.evaluate import SampledConfig
from pivotrl_testbed.testbed.build import is_built, load_testbed_config
from pivotrl_testbed.testbed.common import WORLDS
from pivotrl_testbed.testbed.criteria import check


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build", type=Path)
    ap.add_argument("--config", type=Path, help="the build's TestbedConfig YAML (default: the default)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    cfg = load_testbed_config(args.config)
    if not is_built(args.build, cfg):
        sys.exit(f"{args.build}: not a finished build of {args.config or 'the default config'}")
    # Both worlds and k = 4 sampled dev scoring: the demo's settings when the criteria were
    # committed and the shipped base was measured (docs/RESULTS.md), so candidates stay comparable.
    demo = DemoConfig(methods=["sft"], dev_greedy=True, worlds=list(WORLDS),
                      sampled=SampledConfig(k=4))
    results = run_demo(args.out, demo, testbed=args.build, testbed_config=cfg)
    items = [json.loads(line) for line in (args.out / "items.jsonl").read_text().splitlines()]
    sft = results["methods"].get("sft", {}).get("chosen")
    build = json.loads((args.build / "build.json").read_text())
    got = check(build, items, sft)
    (args.out / "criteria.json").write_text(json.dumps(got, indent=2) + "\n")
    for name, v in got.items():
        print(f"{name}: {v['verdict']}")


if __name__ == "__main__":
    main()
