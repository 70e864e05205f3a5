"""What pivotrl does on a GPU, measured in a few minutes on a tiny model (scripts/gpu_check.sh).

Checks, each timed and recorded with a status (ok | failed | skipped) in gpu_check.json:
  environment     versions, device, bf16 support
  tiny_model      a random tiny Llama + BPE tokenizer, saved in HF format (no hub downloads)
  profile         `pivotrl profile` (hf backend) on synthetic tool-call turns
  sft             `pivotrl sft`'s train_sft through TRL SFTTrainer, bf16 on CUDA
  grpo_plain      `pivotrl train`'s GRPO through TRL GRPOTrainer, HF generation, bf16 on CUDA
  grpo_shared_prefix  the same with the shared-prefix loss switched on (when the config has it)
  shared_prefix_equivalence  log-probs and gradients of the shared-prefix loss vs the plain one
  gradient_checkpointing  the same comparison with gradient checkpointing on (fp32 and bf16),
                  then GRPO with it on: seconds per step and peak memory next to grpo_shared_prefix
  hybrid          a tiny Nemotron-H (Mamba-2 + attention + MoE, testbed.architectures): shared
                  prefill == per-sample generation (fp32), the shared-prefix loss vs the plain one
                  (fp32), and GRPO with the shared-prefix loss
  gpu_tests       the test suite's `gpu`-marked tests (collection only with --dry-run)

    python scripts/gpu_check.py --device cuda                 # on a GPU machine (gpu_check.sh)
    python scripts/gpu_check.py --device cpu --dry-run        # tiny sizes, seconds, any machine

A failing check does not stop the others; the exit status is 1 if any failed. The JSON is
rewritten after every check, so a run cut short still says what ran.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
TOOLS = [{"type": "function", "function": {"name": "get_order", "description": "Look up an order.",
          "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}}}}]


@dataclass(frozen=True)
class Sizes:
    """Model and run sizes: a GPU-sized tiny run, or a seconds-long CPU dry run."""

    hidden: int
    layers: int
    heads: int
    vocab: int
    turns: int  # synthetic turns (profiled; also the GRPO pivots and SFT trajectories)
    k: int  # profile samples per turn
    max_new_tokens: int
    generations: int  # GRPO G
    pivots_per_step: int
    grpo_steps: int
    sft_steps: int


GPU_SIZES = Sizes(hidden=256, layers=4, heads=4, vocab=1024, turns=64, k=8, max_new_tokens=48,
                  generations=8, pivots_per_step=4, grpo_steps=4, sft_steps=4)
DRY_SIZES = Sizes(hidden=32, layers=1, heads=2, vocab=400, turns=4, k=2, max_new_tokens=8,
                  generations=2, pivots_per_step=2, grpo_steps=1, sft_steps=1)


@dataclass
class Context:
    device: str
    dry_run: bool
    sizes: Sizes
    work: Path  # models, run folders (large; not under the output folder)
    out: Path  # gpu_check.json and gpu_check.log
    model_dir: Path | None = None
    results: dict[str, Any] = field(default_factory=dict)

    def log(self, msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        with (self.out / "gpu_check.log").open("a") as fh:
            fh.write(line + "\n")


# ---------------------------------------------------------------- synthetic data


def make_turn(i: int) -> dict[str, Any]:
    """A one-call pivot: the expert looks up the order the user names."""
    return {"id": f"t{i}/1", "trajectory_id": f"t{i}", "turn": 1, "tools": TOOLS,
            "context": [{"role": "user", "content": f"Where is order O-{i}?"}],
            "expected": {"role": "assistant", "tool_calls": [{"id": "c0", "type": "function",
                         "function": {"name": "get_order",
                                      "arguments": json.dumps({"order_id": f"O-{i}"})}}]}}


def make_trajectory(i: int) -> dict[str, Any]:
    turn = make_turn(i)
    return {"id": f"t{i}", "tools": TOOLS, "messages": [
        *turn["context"], turn["expected"],
        {"role": "tool", "tool_call_id": "c0", "content": '{"status": "shipped"}'},
        {"role": "assistant", "content": "It has shipped."}]}


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def corpus(n: int) -> list[str]:
    """Tokenizer training text shaped like the prompts and actions above."""
    return [f"Where is order O-{i}? <tool_call>\n" + json.dumps(
        {"name": "get_order", "arguments": {"order_id": f"O-{i}"}}) + "\n</tool_call> shipped"
        for i in range(n)]


# ---------------------------------------------------------------- helpers


def cuda_peak_bytes(reset: bool = False) -> int:
    import torch

    if not torch.cuda.is_available():
        return 0
    if reset:
        torch.cuda.reset_peak_memory_stats()
    return int(torch.cuda.max_memory_allocated())


def cuda_peak_mib(ctx: Context, what: str) -> float:
    """Peak CUDA memory since the last reset; on --device cuda, none means `what` ran on the CPU."""
    peak = cuda_peak_bytes()
    if ctx.device == "cuda" and peak == 0:
        raise RuntimeError(f"{what} allocated no CUDA memory: it ran on the CPU")
    return round(peak / 2**20, 1)


def metric_rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def step_seconds(rows: list[dict[str, Any]], wall: float, steps: int) -> dict[str, Any]:
    """Seconds per optimizer step: TRL's step_time when logged (the first step, which compiles
    and warms caches, reported apart), else wall time over steps (setup included)."""
    times = [r["step_time"] for r in rows if "step_time" in r]
    if times:
        rest = times[1:] or times
        return {"seconds_per_step": round(sum(rest) / len(rest), 4),
                "first_step_seconds": round(times[0], 4), "source": "trl step_time"}
    return {"seconds_per_step": round(wall / max(steps, 1), 4), "source": "wall / steps"}


def shared_prefix_switch() -> str | None:
    """The GRPORunConfig field that turns the shared-prefix loss on, if this checkout has one."""
    from pivotrl.train.config import GRPORunConfig

    for name in ("shared_prefix", "shared_prefix_loss", "share_prefix"):
        if name in GRPORunConfig.model_fields:
            return name
    return None


class Skip(Exception):
    """A check that cannot run here (its reason is recorded)."""


# ---------------------------------------------------------------- checks


def check_environment(ctx: Context) -> dict[str, Any]:
    import importlib.metadata as md

    import torch

    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "cuda_runtime": torch.version.cuda}
    for dist in ("transformers", "trl", "datasets", "pydantic", "accelerate", "peft", "tokenizers",
                 "numpy", "pyarrow", "pytest"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            versions[dist] = None
    out: dict[str, Any] = {"versions": versions, "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        out.update(gpu=torch.cuda.get_device_name(0), bf16=torch.cuda.is_bf16_supported(),
                   gpu_memory_gib=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1))
    if ctx.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda but torch.cuda.is_available() is False")
    missing = [d for d in ("trl", "datasets", "pydantic") if versions[d] is None]
    if missing:
        raise RuntimeError(f"not importable: {missing} (run scripts/prepare_wheelhouse.sh, carry "
                           ".wheelhouse, run scripts/gpu_check.sh)")
    out["shared_prefix_switch"] = shared_prefix_switch()
    return out


def check_tiny_model(ctx: Context) -> dict[str, Any]:
    from pivotrl_testbed.testbed.tiny import (
        TinyModelConfig,
        build_model,
        build_tokenizer,
        parameter_count,
        save_tiny,
    )

    s = ctx.sizes
    tokenizer = build_tokenizer(corpus(200), vocab_size=s.vocab)
    model = build_model(tokenizer, TinyModelConfig(hidden_size=s.hidden, num_layers=s.layers,
                                                   num_heads=s.heads, intermediate_size=3 * s.hidden,
                                                   max_positions=1024))
    ctx.model_dir = save_tiny(model, tokenizer, ctx.work / "tiny_model")
    return {"parameters": parameter_count(model), "vocab": len(tokenizer),
            "model_dir": str(ctx.model_dir)}


def check_profile(ctx: Context) -> dict[str, Any]:
    from typer.testing import CliRunner

    from pivotrl.cli import app

    s = ctx.sizes
    turns = write_jsonl(ctx.work / "turns.jsonl", [make_turn(i) for i in range(s.turns)])
    out = ctx.work / "profile.jsonl"
    cuda_peak_bytes(reset=True)
    t0 = time.perf_counter()
    result = CliRunner().invoke(app, ["profile", str(turns), "--model", str(ctx.model_dir),
                                      "--out", str(out), "--backend", "hf", "--k", str(s.k),
                                      "--max-new-tokens", str(s.max_new_tokens), "--no-progress"])
    wall = time.perf_counter() - t0
    if result.exit_code != 0:
        raise RuntimeError(f"pivotrl profile exited {result.exit_code}: {result.output[-2000:]}"
                           + ("".join(traceback.format_exception(result.exception))[-2000:]
                              if result.exception else ""))
    records = metric_rows(out)
    if len(records) != s.turns or any(len(r["samples"]) != s.k for r in records):
        raise RuntimeError(f"{out}: {len(records)} profiles, expected {s.turns} with {s.k} samples")
    stats = json.loads(out.with_name("profile.stats.json").read_text())
    peak = cuda_peak_mib(ctx, "profiling")
    return {"turns": len(records), "samples": stats["totals"]["rollout_turns"],
            "generated_tokens": stats["totals"]["generated_tokens"],
            "samples_per_second": stats["runs"][-1]["samples_per_second"],
            "outcomes": stats["outcomes"], "wall_seconds": round(wall, 3),
            "cuda_peak_mib": peak}


def check_sft(ctx: Context) -> dict[str, Any]:
    from pivotrl.train.config import SFTRunConfig
    from pivotrl.train.sft import train_sft

    s = ctx.sizes
    data = write_jsonl(ctx.work / "trajectories.jsonl", [make_trajectory(i) for i in range(s.turns)])
    cfg = SFTRunConfig(model=str(ctx.model_dir), data=data, output_dir=ctx.work / "sft",
                       max_steps=s.sft_steps, per_device_train_batch_size=min(8, s.turns),
                       learning_rate=1e-4, save_steps=10_000,
                       precision="bf16" if ctx.device == "cuda" else "fp32")
    cuda_peak_bytes(reset=True)
    t0 = time.perf_counter()
    summary = train_sft(cfg)
    wall = time.perf_counter() - t0
    rows = metric_rows(Path(summary["metrics"]))
    losses = [r["loss"] for r in rows if "loss" in r]
    if summary["steps"] != s.sft_steps or not losses or any(v != v for v in losses):
        raise RuntimeError(f"SFT: {summary['steps']} steps, losses {losses}")
    return {"steps": summary["steps"], "bf16": cfg.bf16(), "train_loss": summary["train_loss"],
            "wall_seconds": round(wall, 3), **step_seconds(rows, wall, summary["steps"]),
            "cuda_peak_mib": cuda_peak_mib(ctx, "SFT")}


def grpo_config(ctx: Context, name: str, precision: str | None = None, **extra: Any):
    from pivotrl.train.config import GRPORunConfig

    s = ctx.sizes
    pivots = ctx.work / "pivots.jsonl"
    if not pivots.exists():
        write_jsonl(pivots, [make_turn(i) for i in range(s.turns)])
    return GRPORunConfig(model=str(ctx.model_dir), pivots=pivots, output_dir=ctx.work / name,
                         num_generations=s.generations,
                         per_device_train_batch_size=s.generations * s.pivots_per_step,
                         max_completion_length=s.max_new_tokens, learning_rate=1e-4,
                         max_steps=s.grpo_steps, save_steps=10_000, seed=0,
                         precision=precision or ("bf16" if ctx.device == "cuda" else "fp32"),
                         **extra)


def char_variety(completions: list[str], **_: Any) -> list[float]:
    """A reward that differs between completions (distinct characters per character). The
    verifier's reward is 0 for everything a random model writes, which would make every advantage,
    loss and gradient of the step 0 and the step prove nothing."""
    return [len(set(c)) / (1 + len(c)) for c in completions]


def run_grpo(ctx: Context, name: str, shared: bool, **extra: Any) -> dict[str, Any]:
    from pivotrl.train.grpo import train
    from pivotrl.train.reward import PivotReward

    switch = shared_prefix_switch()
    if shared and switch is None:
        raise Skip("GRPORunConfig has no shared-prefix switch in this checkout")
    cfg = grpo_config(ctx, name, **({switch: shared} if switch else {}), **extra)
    cuda_peak_bytes(reset=True)
    t0 = time.perf_counter()
    summary = train(cfg, reward_funcs=[PivotReward(cfg.verifier), char_variety])
    wall = time.perf_counter() - t0
    rows = metric_rows(Path(summary["metrics"]))
    if summary["steps"] != ctx.sizes.grpo_steps or not rows:
        raise RuntimeError(f"GRPO: {summary['steps']} steps, {len(rows)} metric rows")
    first = rows[0]
    return {"steps": summary["steps"], "bf16": cfg.bf16(), "shared_prefix": shared,
            "rollout_turns": summary["rollout_turns"], "wall_seconds": round(wall, 3),
            **step_seconds(rows, wall, summary["steps"]),
            "first_step": {k: first.get(k) for k in ("reward_mean", "loss", "grad_norm",
                                                     "completion_length")},
            "cuda_peak_mib": cuda_peak_mib(ctx, "GRPO")}


def check_grpo_plain(ctx: Context) -> dict[str, Any]:
    return run_grpo(ctx, "grpo_plain", shared=False)


def check_grpo_shared_prefix(ctx: Context) -> dict[str, Any]:
    out = run_grpo(ctx, "grpo_shared_prefix", shared=True)
    plain = ctx.results.get("grpo_plain", {})
    if plain.get("status") == "ok":
        # Same seed, same weights: step 1 generates the same completions, so its reward must agree
        # exactly and its loss up to the dtype's rounding.
        out["first_step_vs_plain"] = {k: (plain["first_step"].get(k), out["first_step"].get(k))
                                      for k in ("reward_mean", "loss", "grad_norm")}
        if plain.get("seconds_per_step"):
            out["speed_vs_plain"] = round(plain["seconds_per_step"] / out["seconds_per_step"], 3)
    return out


# Tolerances: fp32 differs only by summation order; bf16 autocast rounds each matmul to ~3
# significant digits, differently for a [G x prompt] batch than for one prompt.
TOLERANCE = {"fp32": {"logp": 1e-3, "grad": 1e-2}, "bf16": {"logp": 0.1, "grad": 0.1}}


def check_shared_prefix_equivalence(ctx: Context) -> dict[str, Any]:
    """Log-probs, loss and gradients of the shared-prefix GRPO loss vs TRL's repeated-prompt path
    on one real micro-batch, in fp32 and (on CUDA) bf16."""
    if shared_prefix_switch() is None:
        raise Skip("GRPORunConfig has no shared-prefix switch in this checkout")
    out = equivalence(ctx, "equivalence", ("fp32", "bf16") if ctx.device == "cuda" else ("fp32",))
    return {**out, "tolerance": TOLERANCE}


def equivalence(ctx: Context, name: str, precisions: tuple[str, ...], **extra: Any) -> dict[str, Any]:
    """compare_shared_prefix on run config `name` (+ `extra`) per precision, against TOLERANCE."""
    from shared_prefix_probe import compare_shared_prefix  # scripts/, next to this file

    out, bad = {}, []
    for precision in precisions:
        cfg = grpo_config(ctx, f"{name}_{precision}", precision=precision,
                          **{shared_prefix_switch(): True}, **extra)
        res = out[precision] = compare_shared_prefix(cfg)
        tol = TOLERANCE[precision]
        if not res["same_parameters"] or res["logp_max_abs_diff"] > tol["logp"] \
                or res["grad_max_rel_diff"] > tol["grad"]:
            bad.append(f"{precision}: {res}")
    if bad:
        raise RuntimeError(f"{name}: shared-prefix path differs from TRL's beyond tolerance: " + "; ".join(bad))
    return out


def check_gradient_checkpointing(ctx: Context) -> dict[str, Any]:
    """The shared-prefix loss with gradient checkpointing on (each stage checkpointed whole): same
    log-probs and gradients as TRL's checkpointed path, then a GRPO run with it."""
    if shared_prefix_switch() is None:
        raise Skip("GRPORunConfig has no shared-prefix switch in this checkout")
    out = equivalence(ctx, "checkpointed", ("fp32", "bf16") if ctx.device == "cuda" else ("fp32",),
                      gradient_checkpointing=True)
    out["grpo"] = run_grpo(ctx, "grpo_checkpointed", shared=True, gradient_checkpointing=True)
    plain = ctx.results.get("grpo_shared_prefix", {})
    if plain.get("status") == "ok":
        out["vs_grpo_shared_prefix"] = {k: (plain.get(k), out["grpo"].get(k))
                                        for k in ("seconds_per_step", "cuda_peak_mib")}
    return out


def check_hybrid(ctx: Context) -> dict[str, Any]:
    """A tiny random Nemotron-H with the kit's tokenizer: generation's shared prefill, the
    shared-prefix loss and a GRPO run, on the device."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pivotrl_testbed.testbed.architectures import save_tiny_arch
    from pivotrl.sampling.generate import generate, sample_seeds

    if shared_prefix_switch() is None:
        raise Skip("GRPORunConfig has no shared-prefix switch in this checkout")
    s = ctx.sizes
    tokenizer = AutoTokenizer.from_pretrained(ctx.model_dir)
    hybrid = save_tiny_arch("nemotron_h", tokenizer, ctx.work / "hybrid", width=max(32, s.hidden))
    model = AutoModelForCausalLM.from_pretrained(hybrid, dtype=torch.float32).to(ctx.device)
    prompts = [tokenizer(f"Where is order O-{i}? " * (1 + i % 3), add_special_tokens=False)["input_ids"]
               for i in range(4)]
    kw = dict(max_new_tokens=s.max_new_tokens, stop_token_ids=[tokenizer.eos_token_id], temperature=1.0)
    t0 = time.perf_counter()
    shared = generate(model, prompts, sample_seeds(range(4), s.k), **kw)
    seconds = time.perf_counter() - t0
    per_sample = generate(model, prompts, sample_seeds(range(4), s.k), share_prefix=False, **kw)
    same = sum(a == b for x, y in zip(shared, per_sample) for a, b in zip(x, y))
    out: dict[str, Any] = {"parameters": sum(p.numel() for p in model.parameters()),
                           "generation_same_samples": [same, 4 * s.k],
                           "generation_seconds_shared": round(seconds, 3)}
    del model
    if same != 4 * s.k:
        raise RuntimeError(f"shared prefill differs from per-sample generation: {out}")
    saved, ctx.model_dir = ctx.model_dir, hybrid
    try:
        out["equivalence"] = equivalence(ctx, "hybrid_equivalence", ("fp32",))
        out["grpo"] = run_grpo(ctx, "grpo_hybrid", shared=True)
    finally:
        ctx.model_dir = saved
    return out


def gpu_test_files(tests: Path) -> list[Path]:
    """Test modules that use the `gpu` marker: collecting only them keeps the run short and
    away from modules whose imports (BFCL, ...) the GPU image does not carry."""
    return sorted(p for p in tests.glob("test_*.py")
                  if re.search(r"mark\.gpu\b", p.read_text(encoding="utf-8", errors="replace")))


def check_gpu_tests(ctx: Context) -> dict[str, Any]:
    from importlib.util import find_spec

    files = gpu_test_files(REPO / "tests")
    if not files:
        raise Skip("no test module uses the gpu marker")
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider",
           *map(str, files)]
    if find_spec("pytest_timeout") is not None:
        cmd += ["--timeout", "300"]
    if ctx.dry_run:
        cmd.append("--collect-only")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    text = proc.stdout + proc.stderr
    with (ctx.out / "gpu_tests.log").open("w") as fh:
        fh.write(text)
    counts = {word: int(n) for n, word in re.findall(
        r"(\d+) (passed|failed|skipped|deselected|errors?|tests? collected|xfailed)", text)}
    out = {"returncode": proc.returncode, "counts": counts, "files": [f.name for f in files],
           "command": " ".join(cmd[1:]),
           "summary": text.strip().splitlines()[-1] if text.strip() else ""}
    # pytest exits 5 when no test is selected: no gpu-marked test yet is not a failure of the kit.
    if proc.returncode not in (0, 5):
        raise RuntimeError(f"pytest exited {proc.returncode}: {out['summary']} (see gpu_tests.log)")
    # Skipped for want of CUDA on a CUDA machine: the tests never saw the GPU. (Other skips, e.g.
    # a test that needs vLLM, which cannot travel as a wheel, are reported in gpu_tests.log.)
    out["skipped_for_cuda"] = len(re.findall(r"SKIPPED \[\d+\].*needs CUDA", text))
    if ctx.device == "cuda" and not ctx.dry_run and out["skipped_for_cuda"]:
        raise RuntimeError(f"gpu tests were skipped for want of CUDA on a CUDA machine: {out['summary']}")
    return out


CHECKS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "environment": check_environment, "tiny_model": check_tiny_model, "profile": check_profile,
    "sft": check_sft, "grpo_plain": check_grpo_plain, "grpo_shared_prefix": check_grpo_shared_prefix,
    "shared_prefix_equivalence": check_shared_prefix_equivalence,
    "gradient_checkpointing": check_gradient_checkpointing, "hybrid": check_hybrid,
    "gpu_tests": check_gpu_tests,
}
NEEDS_MODEL = {"profile", "sft", "grpo_plain", "grpo_shared_prefix", "shared_prefix_equivalence",
               "gradient_checkpointing", "hybrid"}


# ---------------------------------------------------------------- the run


def run_check(ctx: Context, name: str, deadline: float) -> dict[str, Any]:
    if time.time() > deadline:
        return {"status": "skipped", "reason": "time budget spent"}
    env = ctx.results.get("environment", {})
    if name != "environment" and env.get("status") == "failed":
        return {"status": "skipped", "reason": "the environment check failed"}
    if name in NEEDS_MODEL and ctx.model_dir is None:
        return {"status": "skipped", "reason": "no tiny model (tiny_model check did not pass)"}
    ctx.log(f"{name} ...")
    t0 = time.perf_counter()
    try:
        res = {"status": "ok", **CHECKS[name](ctx)}
    except Skip as exc:
        res = {"status": "skipped", "reason": str(exc)}
    except Exception as exc:  # noqa: BLE001 - recorded; the other checks still run
        res = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"[:3000],
               "traceback": traceback.format_exc()[-4000:]}
    res["seconds"] = round(time.perf_counter() - t0, 3)
    ctx.log(f"{name}: {res['status']} in {res['seconds']} s"
            + (f" — {res.get('error') or res.get('reason')}" if res["status"] != "ok" else ""))
    return res


def write_report(ctx: Context, started: float, done: bool) -> Path:
    doc = {"device": ctx.device, "dry_run": ctx.dry_run, "host": platform.node(),
           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
           "finished": done, "total_seconds": round(time.time() - started, 3),
           "sizes": asdict(ctx.sizes), "checks": ctx.results,
           "ok": all(r.get("status") != "failed" for r in ctx.results.values())}
    path = ctx.out / "gpu_check.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str))
    tmp.replace(path)
    return path


def default_out() -> Path:
    """$OUT when set (the device tool brings back what is under it), else runs/gpu_check/."""
    return Path(os.environ["OUT"]) if os.environ.get("OUT") else REPO / "runs" / "gpu_check"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--dry-run", action="store_true", help="Tiny sizes; pytest collects only.")
    parser.add_argument("--out-dir", type=Path, default=None, help="Default: $OUT or runs/gpu_check.")
    parser.add_argument("--work-dir", type=Path, default=None, help="Default: a temporary folder.")
    parser.add_argument("--only", nargs="*", choices=list(CHECKS), help="Run only these checks.")
    parser.add_argument("--budget-s", type=float, default=480.0,
                        help="Checks not started by then are skipped (the device run has 600 s).")
    args = parser.parse_args(argv)
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch is imported: a GPU host runs CPU too
    out = args.out_dir or default_out()
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.log").write_text("")
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="gpu_check_"))
    work.mkdir(parents=True, exist_ok=True)
    ctx = Context(device=args.device, dry_run=args.dry_run, work=work, out=out,
                  sizes=DRY_SIZES if args.dry_run else GPU_SIZES)
    started = time.time()
    deadline = started + args.budget_s
    names = [n for n in CHECKS if not args.only or n in args.only or n in ("environment", "tiny_model")]
    ctx.log(f"gpu_check: device {args.device}, dry run {args.dry_run}, work {work}, out {out}")
    for name in names:
        ctx.results[name] = run_check(ctx, name, deadline)
        write_report(ctx, started, done=False)
    path = write_report(ctx, started, done=True)
    ok = all(r["status"] != "failed" for r in ctx.results.values())
    ctx.log(f"wrote {path}: {'all ran' if ok else 'FAILURES'}; "
            + ", ".join(f"{n}={r['status']}" for n, r in ctx.results.items()))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
