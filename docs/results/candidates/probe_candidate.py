"""Probe a candidate base while it pretrains: does it call the tools it is offered, and what is
its per-sample success by turn position on the demo's data? Reads the build's pretraining
checkpoint (`BUILD/pretrain/state.pt`, written every 200 steps), so a build that will take hours
can be judged early; prints JSON.

    python3 docs/results/candidates/probe_candidate.py BUILD_DIR CONFIG.yaml N_TRAJECTORIES

For each world: the greedy action on every tool-call turn of the first N train trajectories,
counted by whether its tool name is among those offered, and `build.position_success` (K = 8 at
T = 1, the state verifier) on the same trajectories.
"""
import json, sys, time
from collections import Counter
from pathlib import Path
import torch
torch.set_num_threads(1)
from pivotrl.formats.actions import parse_completion
from pivotrl.io.records import Trajectory, iter_valid
from pivotrl_testbed.testbed.build import load_testbed_config, position_success
from pivotrl_testbed.testbed.tiny import load_pretrain_state
from pivotrl_testbed.episodes import ModelPolicy, expert_turns

out, cfgp, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
cfg = load_testbed_config(cfgp)
model, tok, state = load_pretrain_state(out, cfg.model)
res = {"step": state["step"], "loss_ema": state["loss_ema"]}
t0 = time.time()
for w in cfg.worlds:
    trajs = [t for i, t in enumerate(iter_valid(out / w / "train.jsonl", Trajectory)) if i < n]
    turns = [t for t in expert_turns(trajs) if t.expected.tool_calls]
    texts = ModelPolicy(model, tok, max_new_tokens=64, temperature=0.0).act_batch(
        [t.context for t in turns], [t.tools for t in turns])
    names = Counter()
    same = 0
    for t, x in zip(turns, texts):
        p = parse_completion(x)
        calls = (p.message.tool_calls or []) if p.valid and p.message else []
        offered = {d["function"]["name"] for d in t.tools}
        if not calls:
            names["no call" if p.valid else "invalid"] += 1
        else:
            nm = calls[0].function.name
            names["offered" if nm in offered else "not offered"] += 1
            same += nm == t.expected.tool_calls[0].function.name
    res[w] = {"call_turns": len(turns), "greedy_tool_name": dict(names), "greedy_same_name": same,
              "example": texts[:3]}
    res[w]["by_position"] = position_success(model, tok, out / w / "train.jsonl", n, 8)
res["seconds"] = round(time.time() - t0, 1)
print(json.dumps(res, indent=1))
