"""Does a variants base learn what it lacks with more pretraining? Continue a finished build's
base for STEPS more steps on its own mixture (a warm restart of the build's schedule, another
shuffle seed) and write a copy of the build with the continued base into OUT_DIR (the data
linked, not copied), to probe it as any build.

    python3 docs/results/candidates/i/continue_pretraining.py BUILD_DIR STEPS OUT_DIR
"""
import json, shutil, sys
from pathlib import Path
import torch
from pivotrl.io.records import Trajectory, iter_valid
from pivotrl_testbed.testbed.build import TestbedConfig
from pivotrl_testbed.testbed.mixture import pretrain_examples
from pivotrl_testbed.testbed.ood import load_ood
from pivotrl_testbed.testbed.pretrain import pretrain
from pivotrl_testbed.testbed.tiny import load_tiny, save_tiny

build, steps, out = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
cfg = TestbedConfig.model_validate(json.loads((build / "build.json").read_text())["config"])
torch.set_num_threads(cfg.pretrain.threads)
model, tok = load_tiny(build / "base")
model.train()
weak = {w: list(iter_valid(build / "pretrain" / f"{w}.jsonl", Trajectory)) for w in cfg.worlds}
examples = pretrain_examples(weak, load_ood(build / "ood" / "train.jsonl"), cfg.ood_repeat,
                             cfg.ood_fraction)
last = [0]
def on_step(step, loss):
    if step - last[0] >= 200 or step == steps:
        last[0] = step
        print(f"step {step}/{steps} loss {loss:.3f}", flush=True)
stats = pretrain(model, tok, examples, cfg.pretrain.model_copy(update={"steps": steps, "seed": 1}), on_step)
out.mkdir(parents=True, exist_ok=True)
for name in ("toolshop", "terminal", "ood", "pretrain", "build.json"):
    if not (out / name).exists():
        (out / name).symlink_to((build / name).resolve())
save_tiny(model.eval(), tok, out / "base")
print(json.dumps({"steps": steps, "final_loss": stats["final_loss"]}))
