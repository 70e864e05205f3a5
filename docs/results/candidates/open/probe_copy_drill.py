"""Copy drill: can the tiny model learn to call the listed tool whose description the user gives,
when every name comes from the open space (testbed/variants.py)? A fresh model per depth trained
on N short drills (1–10 open-named tools of toolshop or terminal, the user's message a tool's
description, the call's name the target), then scored greedily on 200 held-out drills, on the
same drills over the worlds' own tool lists, and on the worlds' own first turns.

    python3 docs/results/candidates/open/probe_copy_drill.py BUILD_DIR STEPS LAYERS N   # e.g. runs/c 800 2 20000

BUILD_DIR: a build (or `probe_name_copy.py`'s data) with its tokenizer and train files.
"""
import json, random, sys, time
from pathlib import Path
import torch
torch.set_num_threads(1)
from pivotrl.formats.actions import parse_completion
from pivotrl.io.records import Trajectory, iter_valid
from pivotrl_testbed.episodes import ModelPolicy
from pivotrl_testbed.testbed.pretrain import PretrainConfig, pretrain
from pivotrl_testbed.testbed.tiny import TinyModelConfig, build_model
from pivotrl_testbed.testbed import toolshop, terminal
from pivotrl_testbed.testbed.variants import make_variant, translate_tools, OPEN_WORDS
from transformers import AutoTokenizer

build, steps, layers, n = Path(sys.argv[1]), int(sys.argv[2]), [int(x) for x in sys.argv[3].split(",")], int(sys.argv[4])
tok = AutoTokenizer.from_pretrained(str(build / "base"))
rng = random.Random(0)

def drill(i):
    world = "toolshop" if rng.random() < 0.8 else "terminal"
    v = make_variant(world, 100000 + i, 0, "open")
    tools = translate_tools((toolshop if world == "toolshop" else terminal).TOOLS, v)
    k = rng.randint(1, len(tools))
    offered = rng.sample(tools, k)
    target = rng.choice(offered)
    return ([{"role": "system", "content": v.system}, {"role": "user", "content": target["function"]["description"]}],
            offered, target["function"]["name"])

def own(world, mod):
    out = []
    for t in mod.TOOLS:
        out.append(([{"role": "system", "content": mod.SYSTEM_PROMPT}, {"role": "user", "content": t["function"]["description"]}], mod.TOOLS, t["function"]["name"]))
    return out * 10 if world == "toolshop" else out * 100

rows = [drill(i) for i in range(n + 200)]
train, held = rows[:n], rows[n:]
def first_turn(t):
    i = next(i for i, m in enumerate(t.messages) if m.role == "assistant")
    m = t.messages[i]
    return (t.messages[:i], t.tools, m.tool_calls[0].function.name) if m.tool_calls else None
own_first = {w: [x for i, t in enumerate(iter_valid(build / w / "train.jsonl", Trajectory)) if i < 100 and (x := first_turn(t))] for w in ("toolshop", "terminal")}
own_desc = {"toolshop_desc": own("toolshop", toolshop), "terminal_desc": own("terminal", terminal)[:20]}
examples = [{"messages": [*ctx, {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_0", "type": "function", "function": {"name": name, "arguments": "{}"}}]}], "tools": tools}
    for ctx, tools, name in train]

def score(model, rows):
    texts = ModelPolicy(model, tok, max_new_tokens=30, temperature=0.0).act_batch([c for c, _, _ in rows], [t for _, t, _ in rows])
    same = offered = 0
    for (c, tools, name), x in zip(rows, texts):
        p = parse_completion(x)
        got = p.message.tool_calls[0].function.name if p.valid and p.message and p.message.tool_calls else None
        same += got == name
        offered += got in {d["function"]["name"] for d in tools}
    return {"n": len(rows), "same": round(same / len(rows), 3), "offered": round(offered / len(rows), 3), "ex": texts[0][:80]}

for L in layers:
    t0 = time.time()
    model = build_model(tok, TinyModelConfig(num_layers=L))
    st = pretrain(model, tok, examples, PretrainConfig(steps=steps, warmup=50, lr=1e-3))
    res = {"layers": L, "steps": steps, "loss": round(st["final_loss"], 3), "n": n, "held": score(model, held),
           **{k: score(model, r) for k, r in own_desc.items()}, **{w: score(model, r) for w, r in own_first.items()},
           "seconds": round(time.time() - t0)}
    print(json.dumps(res), flush=True)
