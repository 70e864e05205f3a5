"""The base's greedy first action beside the expert's, on the first N train trajectories of
each world of a finished build: what a base gets wrong where its q is 0.

    python3 docs/results/candidates/e/probe_first_turns.py BUILD_DIR [N]   # default N = 4
"""
import sys
from pathlib import Path
from pivotrl.io.records import Trajectory, iter_valid
from pivotrl_testbed.episodes import ModelPolicy, expert_turns
from pivotrl_testbed.testbed.tiny import load_tiny
b, n = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 4
model, tok = load_tiny(b / "base")
for w in ("terminal", "toolshop"):
    trajs = [t for i, t in enumerate(iter_valid(b / w / "train.jsonl", Trajectory)) if i < n]
    turns = [t for t in expert_turns(trajs) if t.turn == 0]
    outs = ModelPolicy(model, tok, max_new_tokens=64, temperature=0.0).act_batch([t.context for t in turns], [t.tools for t in turns])
    for t, o in zip(turns, outs):
        exp = t.expected.tool_calls[0].function if t.expected.tool_calls else t.expected.content
        print(w, "| expert:", exp.name if hasattr(exp, "name") else "", getattr(exp, "arguments", exp)[:80], "| base:", o[:120].replace("\n", " "))
