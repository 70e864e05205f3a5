"""Shell verifications per second, and what the bubblewrap sandbox alone costs.

    python3 bench/bench_sandbox.py [--n 200] [--compare REF]

Prints, side by side: a plain `subprocess.run(["true"])`, `run_in_sandbox("true")` (bwrap +
prlimit + uid switch + chown of the workspace + the whole-sandbox limits in force here), the same
without the cgroup, a workspace copy + removal with and without its own size-limited tmpfs, and
`shell` verifications (candidate copied workspace + sandboxed run + file snapshot; the expert's
run and the search for its probes are cached per turn, as in profiling; a candidate that
matches is run again on the probes of `pivotrl.verifiers.probes` it is compared on), sequential
and with score_batch's thread pool, with and without the whole-sandbox limits. Every run
includes what the sandbox records (HOME side directory, the attempt supervisor, the network
namespace's counters where recorded, the fixed clock). Also the CPU time per operation (this
process + the sandbox's processes), which does not depend on how busy the machine is. Target:
>= 30 shell verifications per second per candidate (the search for the probes that move the
expert runs once per turn, before the timing, as in profiling).

`--compare REF` also measures the shell verifications of the code at git revision REF (its
`src/`, extracted to a temp dir and run in a subprocess), on the same turns and candidates, and
prints both side by side.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from pivotrl.sandbox import bwrap as sandbox
from pivotrl.sandbox import workspace  # noqa: E402
from pivotrl.io.records import FunctionCall, Message, ToolCall, Turn  # noqa: E402
from pivotrl.sandbox.bwrap import run_in_sandbox, sandbox_limits_in_force, workspace_copy  # noqa: E402
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


@contextlib.contextmanager
def limits_off(cgroup: bool, tmpfs: bool):
    """Switch the whole-sandbox cgroup and/or the workspace tmpfs off, to measure their cost."""
    create, quota = sandbox.SandboxCgroup.create, workspace._quota_supported
    if cgroup:
        sandbox.SandboxCgroup.create = classmethod(lambda cls, *a: None)
    if tmpfs:
        workspace._quota_supported = False
    try:
        yield
    finally:
        sandbox.SandboxCgroup.create, workspace._quota_supported = create, quota


def bench_turns() -> list[Turn]:
    files = {f"data/f{i}.txt": f"line {i}\n" for i in range(20)}
    files["notes.txt"] = "apple\nbanana\napple pie\ncherry\n" * 5
    return [Turn(id=f"bench/{i}", trajectory_id="bench", turn=i, context=[],
                 expected=run_msg("grep -c apple notes.txt"), metadata={"workspace": files})
            for i in range(4)]


def measure_verify(n: int) -> dict:
    """Shell verifications per second with score_batch's threads (the turns prepared first)."""
    turns = bench_turns()
    cands = [run_msg(CANDIDATES[i % len(CANDIDATES)]) for i in range(n)]
    v = get_verifier("shell")
    v.score_batch(turns, [run_msg("true")] * len(turns))
    ts = [turns[i % len(turns)] for i in range(n)]
    par = rate(lambda k: v.score_batch(ts[:k], cands[:k]), n, "par")
    rewards = [s.reward for s in v.score_batch(ts[:len(CANDIDATES)], cands[:len(CANDIDATES)])]
    v.close()
    return {"per_second": par, "cpu_ms": 1000 * CPU["par"], "rewards": rewards}


def compare(ref: str, n: int) -> None:
    """This code's and revision `ref`'s shell verifications, measured one after the other."""
    repo = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(f"git -C {repo} archive {ref} src | tar -x -C {tmp}", shell=True,
                       check=True)
        env = {**os.environ, "PYTHONPATH": f"{tmp}/src"}
        old = json.loads(subprocess.run([sys.executable, __file__, "--verify-only", "--n", str(n)],
                                        env=env, check=True, capture_output=True,
                                        text=True).stdout.splitlines()[-1])
    new = measure_verify(n)
    print(f"{'shell verify, score_batch':32s} {'per second':>11s} {'CPU ms each':>12s}  rewards")
    for name, r in ((f"at {ref}", old), ("this code", new)):
        print(f"{name:32s} {r['per_second']:11.1f} {r['cpu_ms']:12.2f}  {r['rewards']}")
    print(f"cores here: {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200, help="operations per measurement")
    ap.add_argument("--compare", metavar="REF", help="also measure the code at git revision REF")
    ap.add_argument("--verify-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    n = args.n
    if args.verify_only:  # the subprocess of --compare
        print(json.dumps(measure_verify(n)))
        return
    if args.compare:
        compare(args.compare, n)
        return

    limits = sandbox_limits_in_force()
    plain = rate(lambda k: [subprocess.run(["true"], check=True) for _ in range(k)], n, "plain")
    src = workspace.materialize_workspace({f"f{i}.txt": "x\n" for i in range(20)},
                                          workspace.copy_workspace(None))
    with workspace_copy(None) as wd:
        boxed = rate(lambda k: [run_in_sandbox("true", wd) for _ in range(k)], n, "boxed")
        with limits_off(cgroup=True, tmpfs=False):
            nocg = rate(lambda k: [run_in_sandbox("true", wd) for _ in range(k)], n, "nocg")
    copy_q = rate(lambda k: [workspace.remove_workspace(workspace.copy_workspace(src))
                             for _ in range(k)], n, "copy_q")
    with limits_off(cgroup=False, tmpfs=True):
        copy_d = rate(lambda k: [workspace.remove_workspace(workspace.copy_workspace(src))
                                 for _ in range(k)], n, "copy_d")
    workspace.remove_workspace(src)

    turns = bench_turns()
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

    with limits_off(cgroup=True, tmpfs=True):
        off_v = get_verifier("shell")
        off_v.score_batch(turns, [run_msg("true")] * len(turns))
        off = rate(lambda k: off_v.score_batch(ts[:k], cands[:k]), n, "off")
        off_v.close()

    print(f"whole-sandbox limits here: {limits}")
    print(f"{'measure':52s} {'per second':>11s} {'ms each':>9s} {'CPU ms each':>12s}")
    for key, name, r in [("plain", "subprocess.run(['true'])", plain),
                         ("boxed", "run_in_sandbox('true')  (bwrap, limits in force)", boxed),
                         ("nocg", "  same, without the cgroup", nocg),
                         ("copy_q", "copy_workspace + remove (20 files, own tmpfs)", copy_q),
                         ("copy_d", "  same, plain directory", copy_d),
                         ("seq", "shell verify, sequential", seq),
                         ("par", f"shell verify, score_batch ({par_v.config.workers} threads)",
                          par),
                         ("off", "  same, without cgroup and tmpfs quota", off)]:
        print(f"{name:52s} {r:11.1f} {1000 / r:9.2f} {1000 * CPU[key]:12.2f}")
    print(f"sandbox overhead: {plain / boxed:.1f}x a plain subprocess in wall time "
          f"(+{1000 / boxed - 1000 / plain:.1f} ms per command), "
          f"{CPU['boxed'] / max(CPU['plain'], 1e-9):.1f}x in CPU")
    best = max(seq, par)
    print(f"shell verifications/s: {best:.1f} measured (target >= 30: "
          f"{'met' if best >= 30 else 'NOT met'}); CPU-bound ceiling "
          f"{1 / CPU['par']:.0f}/s per idle core; cores here: {os.cpu_count()}, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"rewards of the candidate mix (expert: grep -c apple notes.txt): {rewards}")


if __name__ == "__main__":
    main()
