"""Turns files at scale, full vs compact rows side by side: disk growth from trajectories to
turns, and the memory of N shard processes reading the turns file with
`pivotrl.io.turn_files.read_turns(path, shard)` (other shards' turns dropped as they are read).

full: every row carries its whole context (`pivotrl extract --no-compact`), so the file is
O(turns × context); compact: a row continues the previous row's context (`pivotrl.io.compact_rows`),
so the file grows like the trajectories, and the turns one reader keeps share their messages.

    python3 bench/bench_scale.py [--trajectories 300] [--rounds 16] [--tool-chars 1500] [--shards 8]
    python3 bench/bench_scale.py --sizes 10000,100000     # memory flat in the data (below)

`--sizes`: for each number of trajectories (each with trajectory metadata and `--rounds` tool
rounds), the peak resident memory of a fresh process running each data step: extract
(trajectories -> turns), select (a synthetic profile of every turn, K=8 samples of 200
characters -> pivots; streamed, two passes) and the training loader (`pivotrl.io.turn_files.
iter_pivots`: every pivot read once, in shuffled order, as a sampler asks; next to it the eager
`list(iter_valid(...))` for contrast), side by side; then two edge cases that do not depend on
the size: one trajectory of 10,000 turns through extract, and a crafted 3 MB file of chained
compact rows through `read_turns` (what `evaluate --turns` calls).

Synthetic agent trajectories: a system prompt with tool instructions, a user request, then
`--rounds` rounds of (assistant tool call, tool output of `--tool-chars` characters), and a final
answer. `pivotrl extract` turns them into one Turn per assistant message, written both ways.
Every shard is read in its own fresh Python process (as `pivotrl profile --shard I/N`
runs), one after another, and reports its peak resident memory (ru_maxrss) and seconds; a process
that only imports the reader gives the baseline. Run N shards in parallel and the machine needs
about the sum of their peaks. `--rounds-sweep 8,32` repeats the disk measure (and one shard
reader) for other trajectory lengths: full rows grow with the square of the trajectory length,
compact rows linearly.
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
from pivotrl.io.turn_files import chunks, read_turns, scan_turns
path, mode, i, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
t0 = time.perf_counter()
turns, rejects = read_turns(path, (i, n)) if mode == "shard" else ([], [])
if mode == "stream":  # as `pivotrl profile --shard` reads: ids first, then one chunk at a time
    ids = [ln for ln, _ in scan_turns(path, (i, n))]
    turns = [t.id for chunk in chunks((t for _, t in scan_turns(path, (i, n))), 64) for t in chunk]
assert not rejects, rejects[:3]
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


def measure(readers: dict[str, tuple[Path, str]], shards: int) -> dict[str, dict]:
    """readers: name -> (turns file, child mode)."""
    baseline = read_in_child(next(iter(readers.values()))[0], "imports", 0, shards)
    rows = {"baseline": baseline}
    for name, (turns, mode) in readers.items():
        per_shard = [read_in_child(turns, mode, i, shards) for i in range(shards)]
        largest = max(per_shard, key=lambda r: r["rss_mib"])
        rows[name] = {"per_shard": per_shard,
                      "turns": sum(r["turns"] for r in per_shard),
                      "peak_rss_mib_max": largest["rss_mib"],
                      "above_baseline_mib_max": largest["rss_mib"] - baseline["rss_mib"],
                      "peak_rss_mib_sum": sum(r["rss_mib"] for r in per_shard),
                      "above_baseline_mib_sum": sum(r["rss_mib"] - baseline["rss_mib"] for r in per_shard),
                      "seconds_sum": sum(r["seconds"] for r in per_shard)}
    return rows


def extract_both(tmp: Path, n: int, rounds: int, tool_chars: int) -> tuple[dict, dict, int]:
    """Trajectories, then turns written full and compact: (paths, MiB, turns)."""
    from pivotrl.extract import ExtractOptions, extract_file

    paths = {"trajectories": tmp / f"trajectories.{rounds}.jsonl",
             "full": tmp / f"turns.full.{rounds}.jsonl", "compact": tmp / f"turns.compact.{rounds}.jsonl"}
    make_trajectories(paths["trajectories"], n, rounds, tool_chars)
    seconds = {}
    for name in ("full", "compact"):
        t0 = time.perf_counter()
        summary = extract_file(paths["trajectories"], paths[name], ExtractOptions(compact=name == "compact"))
        seconds[name] = time.perf_counter() - t0
    mib = {k: p.stat().st_size / 2**20 for k, p in paths.items()}
    return paths, {**mib, "extract_seconds": seconds}, summary.turns_train


# One data step in a fresh process; argv: step, then its paths. Prints peak RSS (KiB), seconds.
# A real tokenizer and chat template for the trainer's loading step (the testbed's shipped base).
SHIPPED_BASE = Path(__file__).resolve().parents[1] / "src/pivotrl_testbed/testbed/shipped_base/base"

STEP = r"""
import random, resource, sys, time
step, args = sys.argv[1], sys.argv[2:]
t0 = time.perf_counter()
if step == "imports":
    pass
elif step == "extract":
    from pivotrl.extract import extract_file
    extract_file(args[0], args[1])
elif step == "profile":  # synthetic profiles, not measured: K=8 samples of 200 characters
    from pivotrl.io.records import AtomicWriter, Profile, Sample, Turn, read_records
    rng = random.Random(0)
    with AtomicWriter(args[1]) as w:
        for _, t in read_records(args[0], Turn, strict=True):
            rewards = [float(rng.random() < 0.4) for _ in range(8)]
            mean = sum(rewards) / 8
            w.write(Profile(**dict(t), k=8, reward_mean=mean,
                            reward_std=(mean * (1 - mean)) ** 0.5,
                            samples=[Sample(completion=f"{j}" * 200, reward=r, valid=True)
                                     for j, r in enumerate(rewards)]))
elif step == "select":
    from pivotrl.select import SelectConfig, select_file
    select_file(args[0], args[1], SelectConfig(), plot_png=False)
elif step in ("loader", "eager"):
    if step == "loader":
        from pivotrl.io.turn_files import iter_pivots
        pivots = iter_pivots(args[0])
        order = list(range(len(pivots)))
        random.Random(0).shuffle(order)
        n = sum(len(pivots[i].context) > 0 for i in order)
    else:
        from pivotrl.io.records import Turn, iter_valid
        n = sum(len(t.context) > 0 for t in list(iter_valid(args[0], Turn)))
elif step == "trainer":
    # the GRPO trainer's own loading path: lazy pivots, each prompt rendered once into a JSONL
    # spill, read back as a memory-mapped Arrow dataset, every row touched in shuffled order
    import tempfile
    from pathlib import Path
    from pivotrl.formats.chat import load_tokenizer
    from pivotrl.train.config import GRPORunConfig
    from pivotrl.train.grpo import build_prompts, load_pivot_set, spill_path
    with tempfile.TemporaryDirectory() as tmp:
        cfg = GRPORunConfig(model=args[1], output_dir=tmp, pivots=args[0])
        prompts = build_prompts(load_pivot_set(cfg), load_tokenizer(cfg.model), spill=spill_path(cfg))
        data = prompts.dataset(Path(tmp) / ".prompt_cache")
        order = list(range(len(data)))
        random.Random(0).shuffle(order)
        n = sum(len(data[i]["prompt"]) > 0 for i in order)
        # peak RSS counts the pages of the memory-mapped Arrow file the loop touched (file-backed,
        # reclaimable); the process's own memory is its anonymous part, read while all is live
        print("ANON", next(int(line.split()[1]) for line in open("/proc/self/status")
                           if line.startswith("RssAnon:")))
elif step == "read_turns":
    from pivotrl.io.turn_files import read_turns
    turns, rejects = read_turns(args[0])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, round(time.perf_counter() - t0, 2))
"""


def run_step(step: str, *paths: Path, anon: dict | None = None) -> tuple[float, float]:
    """(peak RSS MiB, seconds) of one step in a fresh Python process; a step that reports its
    anonymous memory ("ANON kib") has it put in `anon["mib"]`."""
    out = subprocess.run([sys.executable, "-c", STEP, step, *map(str, paths)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{step} failed:\n{out.stderr[-3000:]}")
    words = out.stdout.split()
    if anon is not None and "ANON" in words:
        anon["mib"] = int(words[words.index("ANON") + 1]) / 1024
    kib, seconds = words[-2:]
    return int(kib) / 1024, float(seconds)


def write_with_metadata(path: Path, n: int, rounds: int, tool_chars: int) -> None:
    """`make_trajectories`, each trajectory also carrying metadata (~400 characters), as
    users' files do: turn rows must not repeat it."""
    make_trajectories(path, n, rounds, tool_chars)
    tmp = path.with_suffix(".meta")
    with path.open() as src, tmp.open("w") as dst:
        for i, line in enumerate(src):
            rec = json.loads(line)
            rec["metadata"] = {"source": "bench", "task_id": f"task-{i}", "rubric": "x" * 300,
                               "labels": ["sql", "analytics", "weekly"]}
            dst.write(json.dumps(rec) + "\n")
    tmp.replace(path)


def crafted_chain(path: Path, megabytes: float) -> int:
    """A hostile turns file: tiny rows each continuing the one before (a new trajectory when
    the reader's context limit would reject the next), `megabytes` in all."""
    from pivotrl.io.compact_rows import MAX_CONTEXT_MESSAGES

    written, rows, t = 0, 0, 0
    with path.open("w") as fh:
        while written < megabytes * 2**20:
            for i in range(MAX_CONTEXT_MESSAGES):
                if i == 0:
                    row = {"id": f"{t}/0", "trajectory_id": str(t), "turn": 0,
                           "context": [{"role": "user", "content": "u"}]}
                else:
                    row = {"id": f"{t}/{i}", "trajectory_id": str(t), "turn": i,
                           "context_from": f"{t}/{i - 1}"}
                row["expected"] = {"role": "assistant", "content": "a"}
                line = json.dumps(row, separators=(",", ":")) + "\n"
                fh.write(line)
                written, rows = written + len(line), rows + 1
                if written >= megabytes * 2**20:
                    break
            t += 1
    return rows


def sizes_table(sizes: list[int], rounds: int, tool_chars: int, out: Path | None) -> None:
    t_start = time.perf_counter()
    cols: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        base, _ = run_step("imports")
        for n in sizes:
            traj, turns, prof, piv = (d / f"{k}.{n}.jsonl" for k in ("traj", "turns", "prof", "piv"))
            write_with_metadata(traj, n, rounds, tool_chars)
            c = cols[n] = {"traj_mib": traj.stat().st_size / 2**20}
            c["extract_mib"], c["extract_s"] = run_step("extract", traj, turns)
            c["turns_mib"] = turns.stat().st_size / 2**20
            c["turns"] = sum(1 for _ in turns.open())
            run_step("profile", turns, prof)
            c["profile_mib"] = prof.stat().st_size / 2**20
            c["select_mib"], c["select_s"] = run_step("select", prof, piv)
            c["pivots"] = sum(1 for _ in piv.open())
            c["loader_mib"], c["loader_s"] = run_step("loader", piv)
            c["eager_mib"], c["eager_s"] = run_step("eager", piv)
            anon: dict = {}
            c["trainer_mib"], c["trainer_s"] = run_step("trainer", piv, SHIPPED_BASE, anon=anon)
            c["trainer_anon_mib"] = anon.get("mib", float("nan"))
            for f in (traj, turns, prof, piv):
                f.unlink()
        huge = d / "huge.jsonl"
        make_trajectories(huge, 1, 10_000, 40)
        huge_mib = huge.stat().st_size / 2**20
        huge_rss, huge_s = run_step("extract", huge, d / "huge.turns.jsonl")
        chain = d / "chain.jsonl"
        chain_rows = crafted_chain(chain, 3.0)
        chain_rss, chain_s = run_step("read_turns", chain)
    print(f"peak RSS of a fresh process per step (MiB; a bare Python process: {base:.0f} MiB); "
          f"{rounds} tool rounds a trajectory")
    print(f"{'':38s}" + "".join(f"{n:>14,d}" for n in sizes))
    rows = [("trajectories file, MiB", "traj_mib", ".1f"), ("turns", "turns", ",.0f"),
            ("turns file, MiB", "turns_mib", ".1f"), ("profile file, MiB", "profile_mib", ".1f"),
            ("pivots", "pivots", ",.0f"),
            ("extract, peak MiB", "extract_mib", ".0f"), ("  seconds", "extract_s", ".1f"),
            ("select (streamed), peak MiB", "select_mib", ".0f"), ("  seconds", "select_s", ".1f"),
            ("loader (iter_pivots), peak MiB", "loader_mib", ".0f"),
            ("  seconds (every pivot, shuffled)", "loader_s", ".1f"),
            ("eager list(iter_valid), peak MiB", "eager_mib", ".0f"),
            ("GRPO trainer's loading, peak MiB", "trainer_mib", ".0f"),
            ("  of it the process's own (anonymous), MiB", "trainer_anon_mib", ".0f"),
            ("  seconds (render, spill, Arrow)", "trainer_s", ".1f")]
    for label, key, fmt in rows:
        print(f"{label:38s}" + "".join(f"{format(cols[n][key], fmt):>14s}" for n in sizes))
    print(f"\nextract, one trajectory of 10,000 turns ({huge_mib:.1f} MiB): peak {huge_rss:.0f} MiB, "
          f"{huge_s:.1f} s")
    print(f"read_turns, crafted 3 MiB chain of {chain_rows:,d} compact rows: peak {chain_rss:.0f} "
          f"MiB, {chain_s:.1f} s")
    print(f"(bench wall time {time.perf_counter() - t_start:.0f} s)")
    if out:
        out.write_text(json.dumps({"sizes": cols, "huge": [huge_mib, huge_rss, huge_s],
                                   "chain": [chain_rows, chain_rss, chain_s], "baseline": base},
                                  indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=16, help="Tool calls per trajectory.")
    parser.add_argument("--tool-chars", type=int, default=1500, help="Characters per tool output.")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--rounds-sweep", default="", help="e.g. 8,32: disk growth and shard "
                        "0's reader memory for these trajectory lengths.")
    parser.add_argument("--out", type=Path, default=None, help="Also write the numbers as JSON.")
    parser.add_argument("--sizes", default="", help="e.g. 10000,100000: peak memory of extract, "
                        "select and the training loader per number of trajectories (default "
                        "--rounds 2 --tool-chars 200 there).")
    args = parser.parse_args()
    if args.sizes:
        rounds = args.rounds if "--rounds" in sys.argv else 2
        chars = args.tool_chars if "--tool-chars" in sys.argv else 200
        sizes_table([int(n) for n in args.sizes.split(",")], rounds, chars, args.out)
        return

    with tempfile.TemporaryDirectory() as tmp:
        paths, disk, n_written = extract_both(Path(tmp), args.trajectories, args.rounds, args.tool_chars)
        rows = measure({"full": (paths["full"], "shard"), "compact": (paths["compact"], "shard"),
                        "streamed": (paths["compact"], "stream")}, args.shards)
        sweep = {}
        for rounds in [int(r) for r in args.rounds_sweep.split(",") if r]:
            swept, sweep[rounds], _ = extract_both(Path(tmp), args.trajectories, rounds, args.tool_chars)
            for name, path, mode in (("full", swept["full"], "shard"),  # shard 0's reader:
                                     ("compact", swept["compact"], "shard"),  # MiB above baseline
                                     ("streamed", swept["compact"], "stream")):
                rss = read_in_child(path, mode, 0, args.shards)["rss_mib"]
                sweep[rounds][f"{name}_shard0_mib"] = rss - rows["baseline"]["rss_mib"]
            for p in swept.values():
                p.unlink()
    n_turns = rows["compact"]["turns"]
    print(f"{args.trajectories} trajectories x {args.rounds + 1} assistant turns -> {n_turns} turns "
          f"({n_written} written; extract {disk['extract_seconds']['full']:.1f} s full, "
          f"{disk['extract_seconds']['compact']:.1f} s compact)")
    traj = disk["trajectories"]
    print(f"\ndisk: trajectories {traj:.1f} MiB")
    print(f"{'':34s}{'full':>12s}{'compact':>12s}{'ratio':>8s}")
    print(f"{'turns file, MiB':34s}{disk['full']:12.1f}{disk['compact']:12.1f}"
          f"{disk['full'] / disk['compact']:8.2f}")
    print(f"{'turns / trajectories':34s}{disk['full'] / traj:12.2f}{disk['compact'] / traj:12.2f}")
    for rounds, d in sweep.items():
        print(f"{f'  rounds {rounds}: turns / traj.':34s}{d['full'] / d['trajectories']:12.2f}"
              f"{d['compact'] / d['trajectories']:12.2f}{d['full'] / d['compact']:8.2f}")
        print(f"{f'  rounds {rounds}: shard 0 MiB > base':34s}{d['full_shard0_mib']:12.1f}"
              f"{d['compact_shard0_mib']:12.1f}{d['full_shard0_mib'] / d['compact_shard0_mib']:8.2f}"
              f"   streamed: {d['streamed_shard0_mib']:.1f}")
    base = rows["baseline"]["rss_mib"]
    print(f"\n{args.shards} shard processes, each a fresh Python (import-only baseline {base:.0f} "
          "MiB).\nfull, compact: read_turns(path, shard) keeps the shard's turns; streamed: the "
          "compact file\nread as `pivotrl profile --shard` reads it (ids, then 64 turns at a time). "
          "Seconds: wall, shared machine.")
    print(f"{'':34s}{'full':>12s}{'compact':>12s}{'streamed':>12s}{'f/c':>7s}{'f/s':>7s}")
    for key, label in (("peak_rss_mib_max", "largest shard peak RSS, MiB"),
                       ("above_baseline_mib_max", "  of it above baseline, MiB"),
                       ("peak_rss_mib_sum", f"sum of {args.shards} peaks, MiB"),
                       ("above_baseline_mib_sum", "sum above baseline, MiB"),
                       ("seconds_sum", f"read seconds, {args.shards} shards")):
        b, a, st = rows["full"][key], rows["compact"][key], rows["streamed"][key]
        print(f"{label:34s}{b:12.1f}{a:12.1f}{st:12.1f}{b / a if a else float('inf'):7.2f}"
              f"{b / st if st else float('inf'):7.2f}")
    assert rows["full"]["turns"] == rows["streamed"]["turns"] == n_turns == n_written, \
        "shards must cover every turn"
    if args.out:
        args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "disk": disk,
                                        "rounds_sweep": sweep, **rows}, indent=2))


if __name__ == "__main__":
    main()
