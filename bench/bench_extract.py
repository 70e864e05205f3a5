"""Extraction speed and memory: turns/s on BFCL multi-turn and on synthetic files, and peak RSS
for 10k vs 100k synthetic trajectories (streaming means the two peaks are about equal).

    python3 bench/bench_extract.py [--bfcl FILE]   # FILE from `pivotrl data bfcl --out FILE`

Each measurement runs in a fresh subprocess so peak RSS is that run's own.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
from pivotrl.extract import extract_file
src, out = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
s = extract_file(src, out)
dt = time.perf_counter() - t0
rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"trajectories": s.trajectories, "turns": s.turns_train + s.turns_eval,
                  "seconds": dt, "peak_rss_mb": rss_mb}))
"""


def synthetic(path: Path, n: int) -> None:
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": "x" * 40,
              "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}
             for i in range(6)]
    with path.open("w") as fh:
        for i in range(n):
            msgs = [{"role": "system", "content": "You are an agent."},
                    {"role": "user", "content": f"task {i}: do the thing"}]
            for j in range(3):
                msgs.append({"role": "assistant", "tool_calls": [{"id": f"c{j}", "type": "function",
                             "function": {"name": f"tool_{j}", "arguments": json.dumps({"q": f"v{i}"})}}]})
                msgs.append({"role": "tool", "tool_call_id": f"c{j}", "content": '{"ok": true}'})
            msgs.append({"role": "assistant", "content": "done"})
            fh.write(json.dumps({"id": f"s{i}", "messages": msgs, "tools": tools}) + "\n")


def run(src: Path, out: Path) -> dict:
    res = subprocess.run([sys.executable, "-c", CHILD, str(src), str(out)], capture_output=True,
                         text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bfcl", type=Path, help="BFCL trajectories (pivotrl data bfcl --out FILE)")
    ap.add_argument("--big", type=int, default=100_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        rows = []
        if args.bfcl:
            rows.append(("BFCL multi-turn", run(args.bfcl, tmp / "bfcl_turns.jsonl")))
        for n in (args.big // 10, args.big):
            src = tmp / f"syn{n}.jsonl"
            synthetic(src, n)
            rows.append((f"synthetic {n}", run(src, tmp / f"turns{n}.jsonl")))
        print(f"{'input':<18}{'trajectories':>13}{'turns':>9}{'turns/s':>10}{'peak RSS MB':>13}")
        for name, r in rows:
            print(f"{name:<18}{r['trajectories']:>13}{r['turns']:>9}{r['turns'] / r['seconds']:>10.0f}"
                  f"{r['peak_rss_mb']:>13.0f}")
        small, big = rows[-2][1], rows[-1][1]
        print(f"peak RSS ratio {args.big} / {args.big // 10} trajectories: "
              f"{big['peak_rss_mb'] / small['peak_rss_mb']:.2f} (1.0 = fully streaming)")


if __name__ == "__main__":
    main()
