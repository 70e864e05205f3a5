"""A variants build's base, greedy, on the first turns of the first N train trajectories of each
world, as the world itself and translated into held-out `shared` variants (indices 9000+, never
in pretraining): is the call's name, its set of keys, its values each the expert's?

    python3 docs/results/candidates/probe_copy_in_variants.py BUILD_DIR N [OWN_SHARE]   # e.g. runs/g 60 0.3
"""
import json, sys
from pathlib import Path
from pivotrl.io.records import Trajectory, iter_valid
from pivotrl.formats.actions import parse_completion
from pivotrl_testbed.episodes import ModelPolicy
from pivotrl_testbed.testbed.tiny import load_tiny
from pivotrl_testbed.testbed.variants import make_variant, translate
b = Path(sys.argv[1]); n = int(sys.argv[2]); share = float(sys.argv[3]) if len(sys.argv) > 3 else None
model, tok = load_tiny(b / "base")
pol = ModelPolicy(model, tok, max_new_tokens=48, temperature=0.0)
for w in ("toolshop", "terminal"):
    trajs = [t for i, t in enumerate(iter_valid(b / w / "train.jsonl", Trajectory)) if i < n]
    for label, ts in (("own", trajs), ("variant", [translate(t, make_variant(w, 9000 + i, 0, "shared", share)) for i, t in enumerate(trajs)])):
        ctxs, tools, gold = [], [], []
        for t in ts:
            i = next(i for i, m in enumerate(t.messages) if m.role == "assistant")
            ctxs.append(t.messages[:i]); tools.append(t.tools); gold.append(t.messages[i].tool_calls[0].function)
        outs = pol.act_batch(ctxs, tools)
        name = key = val = allr = 0
        for g, x in zip(gold, outs):
            p = parse_completion(x)
            c = p.message.tool_calls[0].function if p.valid and p.message and p.message.tool_calls else None
            if c is None: continue
            ga, ca = json.loads(g.arguments), json.loads(c.arguments)
            name += c.name == g.name
            key += set(ca) == set(ga)
            val += sorted(map(str, ca.values())) == sorted(map(str, ga.values()))
            allr += c.name == g.name and ca == ga
        print(w, label, f"n={len(ts)} name={name/len(ts):.2f} keys={key/len(ts):.2f} values={val/len(ts):.2f} all={allr/len(ts):.2f}", flush=True)
