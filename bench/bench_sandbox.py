"""Shell verifications per second, and what the bubblewrap sandbox alone costs.

    python3 bench/bench_sandbox.py [--n 200]

Prints, side by side: a plain `subprocess.run(["true"])`, `run_in_sandbox("true")` (bwrap +
prlimit + uid switch + chown of the workspace), and `shell` verifications (candidate copied
workspace + sandboxed run + file snapshot; the expert's run is cached per turn, as in
profiling), sequential and with score_batch's thread pool, and with workspaces on a tmpfs
(PIVOTRL_WORKSPACE_DIR=/dev/shm). Also the CPU time per operation (this process + the sandbox's
processes), which does not depend on how busy the machine is. Target (issue 3): >= 30 shell
verifications per second.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

from pivotrl.records import FunctionCall, Message, ToolCall, Turn  # noqa: E402
from pivotrl.sandbox import run_in_sandbox, workspace_copy  # noqa: E402
from pivotrl.verifiers import get_verifier  # noqa: E402

CANDIDATES = ["grep -c apple notes.txt", "grep apple notes.txt | wc -l", "ls -la",
              "sort notes.txt | uniq | head -3", "mkdir -p out && cp notes.txt out/",
              "sed -i 's/apple/pear/' notes.txt", "cat nothere.txt", "wc -l < notes.txt"]


def run_msg(cmd: str) -> Message:
    return Message(role="assistant", tool_calls=[ToolCall(function=FunctionCall(
        name="run", arguments=json.dumps({"command": cmd})))])


CPU: dict[str, float] = {}


def _cpu() -> float:
    # this process + every reaped descendant (bwrap and the command inside it)
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def rate(fn, n: int, name: str = "") -> float:
    """Operations per wall-clock second; CPU seconds per operation go to CPU[name]."""
    c0, t0 = _cpu(), time.perf_counter()
    fn(n)
    wall = time.perf_counter() - t0
    CPU[name] = (_cpu() - c0) / n
    return n / wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200, help="operations per measurement")
    n = ap.parse_args().n

    plain = rate(lambda k: [subprocess.run(["true"], check=True) for _ in range(k)], n, "plain")
    with workspace_copy(None) as wd:
        boxed = rate(lambda k: [run_in_sandbox("true", wd) for _ in range(k)], n, "boxed")

    files = {f"data/f{i}.txt": f"line {i}\n" for i in range(20)}
    files["notes.txt"] = "apple\nbanana\napple pie\ncherry\n" * 5
    turns = [Turn(id=f"bench/{i}", trajectory_id="bench", turn=i, context=[],
                  expected=run_msg("grep -c apple notes.txt"), metadata={"workspace": files})
             for i in range(4)]
    cands = [run_msg(CANDIDATES[i % len(CANDIDATES)]) for i in range(n)]
    seq_v = get_verifier("shell", workers=1)
    par_v = get_verifier("shell")  # default workers
    for v in (seq_v, par_v):  # prepare the turns (expert runs) outside the timing
        v.score_batch(turns, [run_msg("true")] * len(turns))
    ts = [turns[i % len(turns)] for i in range(n)]
    seq = rate(lambda k: seq_v.score_batch(ts[:k], cands[:k]), n, "seq")
    par = rate(lambda k: par_v.score_batch(ts[:k], cands[:k]), n, "par")
    rewards = [s.reward for s in par_v.score_batch(ts[:len(CANDIDATES)],
                                                   cands[:len(CANDIDATES)])]
    seq_v.close()
    par_v.close()

    shm = float("nan")
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        os.environ["PIVOTRL_WORKSPACE_DIR"] = "/dev/shm"
        shm_v = get_verifier("shell")
        shm_v.score_batch(turns, [run_msg("true")] * len(turns))
        shm = rate(lambda k: shm_v.score_batch(ts[:k], cands[:k]), n, "shm")
        shm_v.close()
        del os.environ["PIVOTRL_WORKSPACE_DIR"]

    print(f"{'measure':44s} {'per second':>11s} {'ms each':>9s} {'CPU ms each':>12s}")
    for key, name, r in [("plain", "subprocess.run(['true'])", plain),
                         ("boxed", "run_in_sandbox('true')  (bwrap)", boxed),
                         ("seq", "shell verify, sequential", seq),
                         ("par", f"shell verify, score_batch ({par_v.config.workers} threads)",
                          par),
                         ("shm", "  same, workspaces on /dev/shm", shm)]:
        if r != r:  # nan: no /dev/shm here
            continue
        print(f"{name:44s} {r:11.1f} {1000 / r:9.2f} {1000 * CPU[key]:12.2f}")
    print(f"sandbox overhead: {plain / boxed:.1f}x a plain subprocess in wall time "
          f"(+{1000 / boxed - 1000 / plain:.1f} ms per command), "
          f"{CPU['boxed'] / max(CPU['plain'], 1e-9):.1f}x in CPU")
    best = max(seq, par, shm if shm == shm else 0)
    print(f"shell verifications/s: {best:.1f} measured (target >= 30: "
          f"{'met' if best >= 30 else 'NOT met'}); CPU-bound ceiling "
          f"{1 / CPU['par']:.0f}/s per idle core; cores here: {os.cpu_count()}, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"rewards of the candidate mix (expert: grep -c apple notes.txt): {rewards}")


if __name__ == "__main__":
    main()
