"""Profiling throughput: shared prefill vs per-sample prefill, and the pipeline vs the bare sampler.

    python3 bench/bench_profile.py [--model DIR] [--turns 32] [--k 8] [--max-new-tokens 48]
                                   [--repeats 3] [--prompt-tokens N]

Turns are the toolshop expert's states (the testbed's tool schemas and system prompt: ~400-token
prompts). The model is `--model`, else runs/testbed/base when it exists, else a random tiny Llama
of the testbed's shape (hidden 128, 2 layers, 4 heads) with a tokenizer trained on the testbed's
text, built in a temp dir (nothing downloaded). Each repeat runs, in alternating order:
(a) `profile_file` with the hf sampler sharing each prompt's prefill among its K samples;
(b) the same with `share_prefix=False` (every sample prefills its own copy of the prompt);
(c) the bare sampler on the same prompts and seeds, chunked as profiling chunks them.
Targets: (a)/(b) ≥ 3× in samples/s (the prompt is paid for once, not K times) and (a)/(c) ≥ 90%
(the verifier and bookkeeping are nearly free). Prints the rates per repeat and the medians, and
each arm's peak memory (bench/peak_memory.py: the most held above the arm's start).
`--prompt-tokens N` lengthens every turn's context with earlier tool calls and results
(bench/long_context.py) until its prompt has N tokens; the random model then has room for them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
from long_context import lengthen  # noqa: E402  (bench/, the script's folder)
from peak_memory import PeakMemory  # noqa: E402

DEFAULT_BASE = Path(__file__).resolve().parent.parent / "runs" / "testbed" / "base"


def testbed_model(tmp: Path, max_positions: int = 2048) -> Path:
    """A random Llama of the testbed base's shape, its tokenizer trained on toolshop text."""
    from pivotrl_testbed.testbed.experts import generate_trajectories
    from pivotrl_testbed.testbed.tiny import TinyModelConfig, build_model, build_tokenizer, save_tiny
    from pivotrl.formats.chat import template_messages

    seed_tok = build_tokenizer([], vocab_size=300)  # renders texts only, as the testbed build does
    texts = [seed_tok.apply_chat_template(template_messages(t.messages), tools=t.tools,
                                          tokenize=False)
             for t in generate_trajectories("toolshop", "train", 200, seed=0)]
    tokenizer = build_tokenizer(texts)
    tokenizer.model_max_length = max_positions  # the context pivotrl reads off both
    return save_tiny(build_model(tokenizer, TinyModelConfig(max_positions=max_positions)), tokenizer, tmp / "model")


def write_turns(path: Path, n: int, tokenizer=None, prompt_tokens: int = 0) -> None:
    """`n` toolshop expert turns; with `prompt_tokens`, each context lengthened to that many
    prompt tokens of `tokenizer` (earlier tool calls and results)."""
    from pivotrl_testbed.testbed.experts import generate_trajectories
    from pivotrl.extract import ExtractOptions, extract_turns
    from pivotrl.formats.chat import prompt_text
    from pivotrl.io.records import Message, write_atomic

    turns, i = [], 0
    while len(turns) < n:
        traj = generate_trajectories("toolshop", "eval", 1, seed=i)[0]
        turns += extract_turns(traj.model_copy(update={"id": f"bench{i}"}), ExtractOptions())[0]
        i += 1
    if prompt_tokens:
        def count(context, tools) -> int:
            text = prompt_text(tokenizer, [Message.model_validate(m) for m in context], tools)
            return len(tokenizer(text, add_special_tokens=False)["input_ids"])

        turns = [t.model_copy(update={"context": [Message.model_validate(m) for m in lengthen(
            [m.model_dump(exclude_none=True) for m in t.context], t.tools, prompt_tokens, count, seed=j)]})
                 for j, t in enumerate(turns[:n])]
    write_atomic(path, turns[:n])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="HF model dir (default: runs/testbed/base if built)")
    ap.add_argument("--turns", type=int, default=32)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=0, help="lengthen every turn's prompt to at least N "
                    "tokens with earlier tool calls and results (0: the toolshop turns as they are)")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    from pivotrl.formats.chat import prompt_text
    from pivotrl.io.records import Turn, iter_valid
    from pivotrl.profile.loop import ProfileConfig, turn_seed
    from pivotrl.profile.runs import profile_file
    from pivotrl.sampling.hf import HFSampler
    from pivotrl.verifiers import get_verifier

    tmp = Path(tempfile.mkdtemp(prefix="bench_profile_"))
    model_dir = args.model or (DEFAULT_BASE if (DEFAULT_BASE / "config.json").exists() else None)
    source = str(model_dir) if model_dir else "random tiny Llama of the testbed's shape"
    model_dir = model_dir or testbed_model(tmp, max(2048, args.prompt_tokens + args.max_new_tokens + 4096))
    turns_path = tmp / "turns.jsonl"
    sampler = HFSampler(str(model_dir), batch_size=args.batch_size, device="cpu")
    write_turns(turns_path, args.turns, sampler.tokenizer, args.prompt_tokens)
    verifier = get_verifier("toolcall")
    cfg = ProfileConfig(k=args.k, verifier="toolcall", max_new_tokens=args.max_new_tokens, seed=0)
    turns = list(iter_valid(turns_path, Turn))
    params = cfg.sampling()
    prompts = [prompt_text(sampler.tokenizer, t.context, t.tools) for t in turns]
    lengths = [len(sampler.tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]

    def bare() -> float:
        t0, n = time.perf_counter(), 0
        for s in range(0, len(turns), cfg.chunk_turns):
            chunk = turns[s:s + cfg.chunk_turns]
            out = sampler.sample(prompts[s:s + cfg.chunk_turns], cfg.k, params,
                                 seeds=[turn_seed(cfg.seed, t.id) for t in chunk])
            n += sum(len(c) for c in out)
        return n / (time.perf_counter() - t0)

    def profiled(tag: str, share: bool) -> float:
        sampler.share_prefix = share
        t0 = time.perf_counter()
        try:
            doc = profile_file(turns_path, tmp / f"{tag}.jsonl", sampler, verifier,
                               sampler.tokenizer, cfg, progress=False)
        finally:
            sampler.share_prefix = True
        return doc["runs"][-1]["rollout_turns"] / (time.perf_counter() - t0)

    # Warm-up: allocator, and first-call costs of the pipeline (imports of parsers, verifiers).
    warm = tmp / "warm.jsonl"
    warm.write_text("".join(turns_path.read_text().splitlines(keepends=True)[:2]))
    profile_file(warm, tmp / "warm_profile.jsonl", sampler, verifier, sampler.tokenizer, cfg,
                 progress=False)
    print(f"{source}; {len(turns)} toolshop turns (prompts {min(lengths)}-{max(lengths)} tokens, "
          f"mean {statistics.mean(lengths):.0f}) × k={args.k}, ≤{args.max_new_tokens} new tokens, "
          f"batch {args.batch_size} rows, {os.environ['OMP_NUM_THREADS']} thread(s)")
    print(f"{'repeat':>6} {'shared/s':>9} {'per-sample/s':>13} {'bare/s':>8} "
          f"{'shared÷per-sample':>18} {'shared÷bare':>12}   peak MiB shared / per-sample / bare")
    speedup, overhead = [], []
    peak = {"shared": 0.0, "per_sample": 0.0, "bare": 0.0}

    def measured(name: str, fn) -> tuple[float, float]:
        with PeakMemory() as mem:
            rate = fn()
        peak[name] = max(peak[name], mem.peak_mib)
        return rate, mem.peak_mib

    for r in range(args.repeats):
        # Alternate the order so that a busy neighbour does not always slow the same side.
        runs = [("shared", lambda r=r: profiled(f"shared{r}", True)),
                ("per_sample", lambda r=r: profiled(f"per_sample{r}", False)), ("bare", bare)]
        got = {name: measured(name, fn) for name, fn in (runs if r % 2 == 0 else runs[::-1])}
        rate = {name: g[0] for name, g in got.items()}
        speedup.append(rate["shared"] / rate["per_sample"])
        overhead.append(rate["shared"] / rate["bare"])
        print(f"{r:>6} {rate['shared']:>9.1f} {rate['per_sample']:>13.1f} {rate['bare']:>8.1f} "
              f"{speedup[-1]:>17.2f}× {overhead[-1]:>11.1%}   "
              f"{got['shared'][1]:.0f} / {got['per_sample'][1]:.0f} / {got['bare'][1]:.0f}")
    same = ((tmp / "shared0.jsonl").read_text() == (tmp / "per_sample0.jsonl").read_text())
    print(f"median shared÷per-sample {statistics.median(speedup):.2f}× (goal ≥ 3×); "
          f"median profile÷bare sampler {statistics.median(overhead):.1%} (target ≥ 90%); "
          f"peak MiB shared {peak['shared']:.0f}, per-sample {peak['per_sample']:.0f}, bare {peak['bare']:.0f}; "
          f"profiles identical with and without shared prefill: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
