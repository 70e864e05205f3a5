"""Can the tiny model learn to call the tool it is offered (copy its name from the tool list)?
A fresh model per depth trained on the first turns of a variants build's pretraining data (the
call's name the target), then scored greedily on 200 held-out variant first turns and on the
worlds' own first turns (names it never saw); prints one JSON line per depth.

    python3 docs/results/candidates/probe_name_copy.py BUILD_DIR STEPS LAYERS [CONFIG]   # e.g. runs/b 600 2,4

With CONFIG, a BUILD_DIR without pretraining data gets it first (the build's data and tokenizer
steps only, no base), so a candidate's names can be probed before its build.
"""
import json, sys, time
from pathlib import Path
import torch
torch.set_num_threads(1)
from pivotrl.formats.actions import parse_completion
from pivotrl.io.records import Trajectory, iter_valid
from pivotrl_testbed.episodes import ModelPolicy
from pivotrl_testbed.testbed.pretrain import PretrainConfig, pretrain
from pivotrl_testbed.testbed.tiny import TinyModelConfig, build_model
from transformers import AutoTokenizer

build, steps, layers = Path(sys.argv[1]), int(sys.argv[2]), [int(x) for x in sys.argv[3].split(",")]
if len(sys.argv) > 4 and not (build / "base" / "tokenizer.json").exists():
    from pivotrl_testbed.testbed.build import load_testbed_config, train_tokenizer, write_data
    cfg = load_testbed_config(sys.argv[4])
    expert, weak, _, ood_train = write_data(build, cfg, lambda m: print(m, file=sys.stderr))
    train_tokenizer(cfg, expert, weak, ood_train).save_pretrained(build / "base")
tok = AutoTokenizer.from_pretrained(str(build / "base"))

def first_turn(t):
    i = next(i for i, m in enumerate(t.messages) if m.role == "assistant")
    m = t.messages[i]
    return (t.messages[:i], t.tools, m.tool_calls[0].function.name) if m.tool_calls else None

pre = []
for w in ("toolshop", "terminal"):
    pre += [x for t in iter_valid(build / "pretrain" / f"{w}.jsonl", Trajectory) if (x := first_turn(t))]
train, held = pre[:-200], pre[-200:]
own = {w: [x for i, t in enumerate(iter_valid(build / w / "train.jsonl", Trajectory)) if i < 100
           and (x := first_turn(t))] for w in ("toolshop", "terminal")}
examples = [{"messages": [*ctx, {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_0", "type": "function", "function": {"name": name, "arguments": "{}"}}]}], "tools": tools}
    for ctx, tools, name in train]

def score(model, rows):
    texts = ModelPolicy(model, tok, max_new_tokens=40, temperature=0.0).act_batch(
        [c for c, _, _ in rows], [t for _, t, _ in rows])
    same = offered = 0
    for (c, tools, name), x in zip(rows, texts):
        p = parse_completion(x)
        got = p.message.tool_calls[0].function.name if p.valid and p.message and p.message.tool_calls else None
        same += got == name
        offered += got in {d["function"]["name"] for d in tools}
    return {"n": len(rows), "same_name": same / len(rows), "offered_name": offered / len(rows), "example": texts[0][:100]}

for L in layers:
    t0 = time.time()
    model = build_model(tok, TinyModelConfig(num_layers=L))
    st = pretrain(model, tok, examples, PretrainConfig(steps=steps, warmup=50, lr=1e-3))
    res = {"layers": L, "steps": steps, "loss": st["final_loss"], "train_examples": len(examples),
           "held_out_variants": score(model, held), **{w: score(model, rows) for w, rows in own.items()},
           "seconds": round(time.time() - t0)}
    print(json.dumps(res), flush=True)
