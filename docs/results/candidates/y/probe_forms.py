"""Which command forms a policy writes at terminal's second turn, and how often with the right
file: T = 1 samples on the contexts of the demo's expert trajectories (8 per context), grouped
by task kind and form (file names written F, values V); a completion the project's parser
(`parse_completion`) reads no `run` command from counts as "(no command)".

    python3 docs/results/candidates/y/probe_forms.py TRAJECTORIES.jsonl MODEL_DIR [MODEL_DIR ...]
"""
import collections
import re
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pivotrl.formats.actions import call_arguments, parse_completion
from pivotrl.io.records import Trajectory, iter_valid
from pivotrl_testbed.episodes import ModelPolicy
from pivotrl_testbed.testbed.terminal import KIND_EXT, file_in

torch.set_num_threads(2)
trajs = list(iter_valid(Path(sys.argv[1]), Trajectory))
contexts, rights = [], []
for t in trajs:
    kind = t.metadata.get("task", {}).get("kind")
    turns = [i for i, m in enumerate(t.messages) if m.role == "assistant"]
    if kind not in KIND_EXT or len(turns) < 2:
        continue
    context = t.messages[:turns[1]]
    contexts += [context] * 8
    rights += [(kind, file_in(context[-1].content, KIND_EXT[kind]))] * 8
for path in sys.argv[2:]:
    policy = ModelPolicy(AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path),
                         temperature=1.0, seed=1)
    counts = collections.defaultdict(lambda: [0, 0])
    for (kind, right), text in zip(rights, policy.act_batch(contexts, [trajs[0].tools] * len(contexts))):
        parsed = parse_completion(text)
        calls = (parsed.message.tool_calls or []) if parsed.valid and parsed.message else []
        command = str(call_arguments(calls[0].function.arguments).get("command", "")) if calls else ""
        form = re.sub(r"\b[\w-]+\.(csv|ini|log|txt)\b", "F", command)
        form = re.sub(r"\b(ERROR|WARN|INFO|port|host|user|mode|\d)\b", "V", form) or "(no command)"
        counts[(kind, form)][0] += 1
        counts[(kind, form)][1] += right in command
    print("=====", path)
    for (kind, form), (n, ok) in sorted(counts.items(), key=lambda x: (x[0][0], -x[1][0])):
        if n >= 3:
            print(f"  {kind:7s} {form[:40]:40s} n={n:3d} right file {ok / n:.2f}")
