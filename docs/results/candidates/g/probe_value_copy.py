"""Can the tiny model copy the user's value (an e-mail) into its first call, and does spelling
values letter by letter help? A fresh model per tokenizer, trained on the first turns of a
variants build's toolshop pretraining data (the whole call the target), scored greedily on 200
held-out variant first turns and on toolshop's own first turns: the call's name, keys and
values each right; prints one JSON line per tokenizer.

    python3 docs/results/candidates/g/probe_value_copy.py BUILD_DIR STEPS LAYERS   # e.g. runs/g 800 2

Tokenizers: the build's own, and one trained on the same pretraining text with
`spell_values=True` (and the build's `isolate_names`).
"""
import json, sys, time
from pathlib import Path
import torch
torch.set_num_threads(1)
from pivotrl.formats.actions import parse_completion
from pivotrl.formats.chat import template_messages
from pivotrl.io.records import Trajectory, iter_valid
from pivotrl_testbed.episodes import ModelPolicy
from pivotrl_testbed.testbed.pretrain import PretrainConfig, pretrain
from pivotrl_testbed.testbed.tiny import TinyModelConfig, build_model, build_tokenizer
from transformers import AutoTokenizer

build, steps, layers = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
cfg = json.loads((build / "build.json").read_text())["config"]

def first_turn(t):
    i = next(i for i, m in enumerate(t.messages) if m.role == "assistant")
    return (t.messages[:i], t.tools, t.messages[i]) if t.messages[i].tool_calls else None

pre = [x for t in iter_valid(build / "pretrain" / "toolshop.jsonl", Trajectory) if (x := first_turn(t))]
train, held = pre[:-200], pre[-200:]
own = [x for i, t in enumerate(iter_valid(build / "toolshop" / "train.jsonl", Trajectory)) if i < 100 and (x := first_turn(t))]
examples = [{"messages": [*ctx, m], "tools": tools} for ctx, tools, m in train]

def score(model, tok, rows):
    texts = ModelPolicy(model, tok, max_new_tokens=48, temperature=0.0).act_batch(
        [c for c, _, _ in rows], [t for _, t, _ in rows])
    hits = {"name": 0, "keys": 0, "values": 0}
    for (_, _, m), x in zip(rows, texts):
        p = parse_completion(x)
        got = p.message.tool_calls[0] if p.valid and p.message and p.message.tool_calls else None
        if got is None:
            continue
        want, args = m.tool_calls[0], got.args()
        hits["name"] += got.function.name == want.function.name
        hits["keys"] += set(args) == set(want.args())
        hits["values"] += sorted(map(str, args.values())) == sorted(map(str, want.args().values()))
    return {k: v / len(rows) for k, v in hits.items()} | {"example": texts[0][:90]}

own_tok = AutoTokenizer.from_pretrained(str(build / "base"))
render = lambda t: own_tok.apply_chat_template(template_messages(t.messages), tools=t.tools or None, tokenize=False)
texts = [render(t) for w in ("toolshop", "terminal") for t in iter_valid(build / "pretrain" / f"{w}.jsonl", Trajectory)]
spelled = build_tokenizer(texts, vocab_size=cfg["vocab_size"], spell_values=True,
                          isolate_names=cfg.get("tokenizer_isolate_names", False))
for name, tok in (("build", own_tok), ("spell_values", spelled)):
    t0 = time.time()
    torch.manual_seed(0)
    model = build_model(tok, TinyModelConfig(num_layers=layers))
    st = pretrain(model, tok, examples, PretrainConfig(steps=steps, warmup=50, lr=1e-3))
    print(json.dumps({"tokenizer": name, "layers": layers, "steps": steps, "loss": round(st["final_loss"], 3),
                      "held_out_variants": score(model, tok, held), "toolshop_own": score(model, tok, own),
                      "seconds": round(time.time() - t0)}), flush=True)
