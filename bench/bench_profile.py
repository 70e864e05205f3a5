"""Profiling throughput vs the bare sampler's, on the same prompts, in the same run.

    python3 bench/bench_profile.py [--turns 48] [--k 8] [--max-new-tokens 48] [--repeats 3]

Builds the testbed's tiny model (random init, nothing downloaded) in a temp dir, makes Turn records
with tool schemas, then alternates: (a) the bare `hf` sampler on the prompts, chunked as profiling
chunks them, with the same seeds; (b) `profile_file` (prompt templating, sampling, parsing, the
toolcall verifier, records, append + flush, stats). Target: (b) ≥ 90% of (a) in samples/s —
the verifier and bookkeeping must be nearly free. Prints both rates and their ratio per repeat
and the median ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")


def make_turns(path: Path, n: int) -> None:
    tools = [{"type": "function", "function": {
        "name": "get_order", "description": "Look up an order by id.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}},
                       "required": ["order_id"]}}}]
    with path.open("w") as fh:
        for i in range(n):
            # Contexts of different lengths, so batching has padding to manage.
            ctx = [{"role": "user", "content": f"Where is my order O-{i}? " + "Please hurry. " * (i % 5)}]
            fh.write(json.dumps({
                "id": f"b{i}/1", "trajectory_id": f"b{i}", "turn": 1, "domain": "shop",
                "tools": tools, "context": ctx,
                "expected": {"role": "assistant", "tool_calls": [{"id": "c0", "type": "function",
                             "function": {"name": "get_order",
                                          "arguments": json.dumps({"order_id": f"O-{i}"})}}]},
            }) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=48)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    from pivotrl.chat import prompt_text
    from pivotrl.profiling import ProfileConfig, profile_file, turn_seed
    from pivotrl.records import Turn, iter_valid
    from pivotrl.sampling.hf import HFSampler
    from pivotrl.experiment.testbed.tiny import build_model, build_tokenizer, save_tiny
    from pivotrl.verifiers import get_verifier

    tmp = Path(tempfile.mkdtemp(prefix="bench_profile_"))
    tokenizer = build_tokenizer([])
    model_dir = save_tiny(build_model(tokenizer), tokenizer, tmp / "model")
    turns_path = tmp / "turns.jsonl"
    make_turns(turns_path, args.turns)
    sampler = HFSampler(str(model_dir), batch_size=args.batch_size)
    verifier = get_verifier("toolcall")
    cfg = ProfileConfig(k=args.k, verifier="toolcall", max_new_tokens=args.max_new_tokens, seed=0)
    turns = list(iter_valid(turns_path, Turn))
    params = cfg.sampling()

    def bare() -> tuple[float, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        n = 0
        for s in range(0, len(turns), cfg.chunk_turns):
            chunk = turns[s:s + cfg.chunk_turns]
            prompts = [prompt_text(sampler.tokenizer, t.context, t.tools) for t in chunk]
            out = sampler.sample(prompts, cfg.k, params, seeds=[turn_seed(cfg.seed, t.id) for t in chunk])
            n += sum(len(c) for c in out)
        return n / (time.perf_counter() - t0), n / (time.process_time() - c0)

    def profiled(i: int) -> tuple[float, float]:
        out = tmp / f"profile{i}.jsonl"
        t0, c0 = time.perf_counter(), time.process_time()
        doc = profile_file(turns_path, out, sampler, verifier, sampler.tokenizer, cfg, progress=False)
        n = doc["runs"][-1]["rollout_turns"]
        return n / (time.perf_counter() - t0), n / (time.process_time() - c0)

    bare()  # warm-up (allocator, first-call overheads)
    print(f"tiny Llama, {args.turns} turns × k={args.k}, {args.max_new_tokens} new tokens, "
          f"batch {args.batch_size}, {os.environ['OMP_NUM_THREADS']} thread(s)")
    # Wall-clock rates, and rates per CPU-second of this process (steadier on a shared machine:
    # both paths are single-process; torch threads count in process_time too). The order
    # alternates so that a slow neighbour does not always hit the same side.
    print(f"{'repeat':>6} {'bare/s wall':>12} {'profile/s wall':>15} {'ratio':>7}   "
          f"{'bare/s cpu':>11} {'profile/s cpu':>14} {'ratio':>7}")
    wall, cpu = [], []
    for r in range(args.repeats):
        if r % 2 == 0:
            b, p = bare(), profiled(r)
        else:
            p, b = profiled(r), bare()
        wall.append(p[0] / b[0])
        cpu.append(p[1] / b[1])
        print(f"{r:>6} {b[0]:>12.1f} {p[0]:>15.1f} {wall[-1]:>7.1%}   "
              f"{b[1]:>11.1f} {p[1]:>14.1f} {cpu[-1]:>7.1%}")
    print(f"median profile/bare: wall {statistics.median(wall):.1%}, "
          f"cpu {statistics.median(cpu):.1%} (target ≥ 90%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
