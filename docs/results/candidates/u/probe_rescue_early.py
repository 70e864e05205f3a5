"""Early look at a candidate base mid-stage: the rescue test (testbed/rescue.py) on the first N dev
tasks per world, greedy, with the weights of the build's resumable stage-2 state (pretrain/state_stage2.pt).

    python3 docs/results/candidates/u/probe_rescue_early.py BUILD_DIR CONFIG.yaml N
"""
import sys
from pathlib import Path
import torch
torch.set_num_threads(1)
from pivotrl.io.records import Trajectory, iter_valid
from pivotrl.verifiers import get_verifier
from pivotrl_testbed.episodes import ModelPolicy
from pivotrl_testbed.testbed.build import load_testbed_config
from pivotrl_testbed.testbed.rescue import rescue_test
from pivotrl_testbed.testbed.tiny import load_pretrain_state
out, cfgp, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
cfg = load_testbed_config(cfgp)
model, tok, state = load_pretrain_state(out, cfg.model, "state_stage2.pt")
print("step", state["step"])
for w in cfg.worlds:
    tasks = list(iter_valid(out / w / "eval.jsonl", Trajectory))[:n]
    got = rescue_test(w, tasks, ModelPolicy(model, tok), get_verifier("state"))
    steps = {}
    for r in got["episodes"]:
        steps[r["step"]] = steps.get(r["step"], 0) + 1
    print(w, got["counts"], "deciding step positions:", steps)
    for r in got["episodes"][:4]:
        print("   ", r["step"], r.get("rescued"), r.get("action", "")[:150].replace("\n", " "), "| expert:", r.get("expert", "")[:120].replace("\n", " "))
