"""Turns files at scale: disk growth from trajectories to turns, and the memory of N shard
processes reading a turns file, before (read every turn, then keep the shard's) and after
(`profiling.read_turns(path, shard)`: other shards' turns dropped as they are read), side by side.

    python3 bench/bench_scale.py [--trajectories 300] [--rounds 16] [--tool-chars 1500] [--shards 8]

Synthetic agent trajectories: a system prompt with tool instructions, a user request, then
`--rounds` rounds of (assistant tool call, tool output of `--tool-chars` characters), and a final
answer. `pivotrl extract` turns them into one Turn per assistant message, each with its whole
context. Every shard is read in its own fresh Python process (as `pivotrl profile --shard I/N`
runs), one after another, and reports its peak resident memory (ru_maxrss) and seconds; a process
that only imports the reader gives the baseline. Run N shards in parallel and the machine needs
about the sum of their peaks: that sum is the headline, before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

TOOLS = [{"type": "function", "function": {
    "name": "run_query", "description": "Run a read-only SQL query against the warehouse.",
    "parameters": {"type": "object", "properties": {"sql": {"type": "string"}},
                   "required": ["sql"]}}}]
SYSTEM = ("You are a data analyst with read-only access to the warehouse. Use run_query for every "
          "fact; never guess numbers. Answer with a short summary and the query you trusted.\n") * 8

# The reader in a child process; argv: turns path, mode, shard index, shard count.
CHILD = r"""
import resource, sys, time
from pivotrl.profiling import read_turns, shard_of
path, mode, i, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
t0 = time.perf_counter()
if mode == "before":
    turns, _ = read_turns(path)
    turns = [(ln, t) for ln, t in turns if shard_of(t.id, n) == i]
elif mode == "after":
    turns, _ = read_turns(path, (i, n))
else:
    turns = []
seconds = time.perf_counter() - t0
print(len(turns), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, round(seconds, 3))
"""


def make_trajectories(path: Path, n: int, rounds: int, tool_chars: int) -> None:
    filler = "order_id,region,amount,status\n" + "".join(
        f"O-{k:06d},eu-west,{k * 7 % 1000}.{k % 100:02d},shipped\n" for k in range(tool_chars // 30 + 1))
    with path.open("w") as fh:
        for t in range(n):
            messages = [{"role": "system", "content": SYSTEM},
                        {"role": "user", "content": f"Which regions had falling revenue in week {t}?"}]
            for r in range(rounds):
                call_id = f"c{r}"
                sql = f"SELECT region, SUM(amount) FROM orders WHERE week = {t} AND batch = {r} GROUP BY 1"
                messages.append({"role": "assistant", "content": None, "tool_calls": [
                    {"id": call_id, "type": "function",
                     "function": {"name": "run_query", "arguments": json.dumps({"sql": sql})}}]})
                messages.append({"role": "tool", "tool_call_id": call_id,
                                 "content": filler[: tool_chars]})
            messages.append({"role": "assistant", "content": f"Revenue fell in eu-west in week {t}."})
            fh.write(json.dumps({"id": f"traj-{t}", "tools": TOOLS, "messages": messages}) + "\n")


def read_in_child(turns: Path, mode: str, i: int, n: int) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(turns), mode, str(i), str(n)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"shard reader {mode} {i}/{n} failed:\n{out.stderr[-3000:]}")
    kept, rss_kib, seconds = out.stdout.split()
    return {"turns": int(kept), "rss_mib": int(rss_kib) / 1024, "seconds": float(seconds)}


def measure(turns: Path, shards: int) -> dict[str, dict]:
    baseline = read_in_child(turns, "imports", 0, shards)
    rows = {"baseline": baseline}
    for mode in ("before", "after"):
        per_shard = [read_in_child(turns, mode, i, shards) for i in range(shards)]
        rows[mode] = {"per_shard": per_shard,
                      "turns": sum(r["turns"] for r in per_shard),
                      "peak_rss_mib_max": max(r["rss_mib"] for r in per_shard),
                      "peak_rss_mib_sum": sum(r["rss_mib"] for r in per_shard),
                      "above_baseline_mib_sum": sum(r["rss_mib"] - baseline["rss_mib"] for r in per_shard),
                      "seconds_sum": sum(r["seconds"] for r in per_shard)}
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=16, help="Tool calls per trajectory.")
    parser.add_argument("--tool-chars", type=int, default=1500, help="Characters per tool output.")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None, help="Also write the numbers as JSON.")
    args = parser.parse_args()

    from pivotrl.extract import ExtractOptions, extract_file

    with tempfile.TemporaryDirectory() as tmp:
        trajectories, turns = Path(tmp) / "trajectories.jsonl", Path(tmp) / "turns.jsonl"
        make_trajectories(trajectories, args.trajectories, args.rounds, args.tool_chars)
        t0 = time.perf_counter()
        summary = extract_file(trajectories, turns, ExtractOptions())
        extract_seconds = time.perf_counter() - t0
        disk = {"trajectories_mib": trajectories.stat().st_size / 2**20,
                "turns_mib": turns.stat().st_size / 2**20}
        disk["growth"] = disk["turns_mib"] / disk["trajectories_mib"]
        rows = measure(turns, args.shards)
    n_turns = rows["after"]["turns"]
    print(f"{args.trajectories} trajectories x {args.rounds + 1} assistant turns -> {n_turns} turns "
          f"(extract {extract_seconds:.1f} s, {summary.turns_train} written)")
    print(f"disk: trajectories {disk['trajectories_mib']:.1f} MiB, turns {disk['turns_mib']:.1f} MiB "
          f"({disk['growth']:.1f}x); the same before and after (turns still store whole contexts)")
    base = rows["baseline"]["rss_mib"]
    print(f"\n{args.shards} shard processes, each a fresh Python (import-only baseline "
          f"{base:.0f} MiB):")
    print(f"{'':34s}{'before':>12s}{'after':>12s}{'ratio':>8s}   (seconds: wall, on a shared machine)")
    for key, label in (("peak_rss_mib_max", "largest shard peak RSS, MiB"),
                       ("peak_rss_mib_sum", f"sum of {args.shards} peaks, MiB"),
                       ("above_baseline_mib_sum", "sum above baseline, MiB"),
                       ("seconds_sum", f"read seconds, {args.shards} shards")):
        b, a = rows["before"][key], rows["after"][key]
        print(f"{label:34s}{b:12.1f}{a:12.1f}{b / a if a else float('inf'):8.2f}")
    assert rows["before"]["turns"] == rows["after"]["turns"] == n_turns, "shards must cover the same turns"
    if args.out:
        args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "disk": disk,
                                        "extract_seconds": extract_seconds, **rows}, indent=2))


if __name__ == "__main__":
    main()
