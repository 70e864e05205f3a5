"""The GPU proof kit (scripts/gpu_check.py, scripts/wheelhouse.py): a CPU dry run of every check,
the wheelhouse's dependency closure and size check offline, and the `gpu`-marked tests it runs on
a CUDA machine (skipped here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import gpu_check  # noqa: E402
import wheelhouse  # noqa: E402

# ---------------------------------------------------------------- the CPU dry run


def test_dry_run_records_every_check_with_a_status(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, OMP_NUM_THREADS="1", OUT=str(out))
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--device", "cpu",
                           "--dry-run", "--work-dir", str(tmp_path / "work")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    doc = json.loads((out / "gpu_check.json").read_text())  # $OUT is where the report goes
    failed = {n: c.get("error") for n, c in doc["checks"].items() if c["status"] == "failed"}
    assert proc.returncode == 0 and not failed, (failed, proc.stdout[-3000:], proc.stderr[-3000:])
    assert list(doc["checks"]) == list(gpu_check.CHECKS)
    assert doc["finished"] and doc["ok"] and doc["device"] == "cpu" and doc["dry_run"]
    checks = doc["checks"]
    for name in ("environment", "tiny_model", "profile", "sft", "grpo_plain"):
        assert checks[name]["status"] == "ok", (name, checks[name])
    assert checks["environment"]["versions"]["trl"]
    assert checks["profile"]["turns"] == gpu_check.DRY_SIZES.turns
    assert checks["profile"]["samples"] == gpu_check.DRY_SIZES.turns * gpu_check.DRY_SIZES.k
    for name in ("sft", "grpo_plain"):
        assert checks[name]["seconds_per_step"] > 0 and checks[name]["bf16"] is False
    if gpu_check.shared_prefix_switch() is not None:
        assert checks["grpo_plain"]["shared_prefix"] is False
        assert checks["grpo_shared_prefix"]["status"] == "ok"
        # Same seed and weights: the first step's rollouts and so its reward are the same.
        reward = checks["grpo_shared_prefix"]["first_step_vs_plain"]["reward_mean"]
        assert reward[0] == reward[1]
        eq = checks["shared_prefix_equivalence"]["fp32"]
        assert eq["same_parameters"] and eq["parameters_compared"] > 0
        assert eq["logp_max_abs_diff"] <= 1e-3 and eq["grad_max_rel_diff"] <= 1e-2
    assert checks["gpu_tests"]["status"] in ("ok", "skipped")
    assert "gpu_check" in (out / "gpu_check.log").read_text()


def test_a_failing_check_is_recorded_and_the_others_still_run(tmp_path, monkeypatch):
    def broken(ctx):
        raise ValueError("boom")

    monkeypatch.setitem(gpu_check.CHECKS, "tiny_model", broken)
    ctx = gpu_check.Context(device="cpu", dry_run=True, sizes=gpu_check.DRY_SIZES,
                            work=tmp_path, out=tmp_path)
    res = gpu_check.run_check(ctx, "tiny_model", deadline=float("inf"))
    assert res["status"] == "failed" and "boom" in res["error"]
    # Checks that need the model are skipped with the reason, not failed or crashed.
    assert gpu_check.run_check(ctx, "profile", deadline=float("inf"))["status"] == "skipped"
    assert gpu_check.run_check(ctx, "environment", deadline=0.0)["reason"] == "time budget spent"


def test_step_seconds_prefers_trl_step_time_without_the_warmup_step():
    rows = [{"step": 1, "step_time": 3.0}, {"step": 2, "step_time": 1.0}, {"step": 3, "step_time": 2.0}]
    assert gpu_check.step_seconds(rows, wall=100.0, steps=3) == {
        "seconds_per_step": 1.5, "first_step_seconds": 3.0, "source": "trl step_time"}
    assert gpu_check.step_seconds([], wall=10.0, steps=4)["seconds_per_step"] == 2.5


# ---------------------------------------------------------------- the wheelhouse, offline

GRAPH = {  # a fake installed world: name -> requirement strings
    "torch": ["filelock", "sympy"], "typer": ["pydantic>=2", "rich"], "rich": ["pygments"],
    "trl": ["accelerate>=1", "datasets>=4", "pyyaml"], "accelerate": ["torch", "pyyaml"],
    "datasets": ["pandas", "fsspec[http]<=2026.9", "filelock",
                 'tomli; python_version < "3.12"', 'pywin32; sys_platform == "win32"'],
    "fsspec": ["aiohttp; extra == 'http'", "dask; extra == 'dask'"], "aiohttp": ["yarl"],
    "pandas": ["numpy", "python-dateutil"], "python-dateutil": ["six"],
    "pydantic": ["pydantic-core==2.1"], "pydantic_core": [],
}
VERSIONS = {"trl": "1.16.0", "datasets": "5.2.0", "pandas": "3.1.1", "fsspec": "2026.9.0",
            "pydantic": "2.13.4", "six": "1.17.0"}


def fake_plan(**kw):
    return wheelhouse.plan(lambda name: GRAPH.get(name) if name in GRAPH else
                           GRAPH.get(name.replace("-", "_")), VERSIONS.get,
                           image_roots=("torch", "typer", "accelerate"), not_on_image=("pydantic",),
                           needed_roots=("trl", "pydantic"), ship_always=(), **kw)


def test_plan_is_the_needed_closure_minus_the_images():
    assert fake_plan() == [
        "aiohttp",  # through fsspec's `http` extra; not installed here: no pin
        "datasets==5.2.0", "fsspec==2026.9.0", "numpy", "pandas==3.1.1",
        "pydantic==2.13.4",  # the image's typer does not bring pydantic: the image stops there
        "pydantic-core==2.1", "python-dateutil", "six==1.17.0", "trl==1.16.0", "yarl"]
    # accelerate, torch, pyyaml, filelock: the image has them. tomli (python < 3.12), pywin32
    # (Windows) and dask (an extra nobody asked for) do not apply to the target.


def test_plan_ships_a_pinned_copy_of_what_the_image_has_when_asked():
    plan = wheelhouse.plan(lambda n: GRAPH.get(n), VERSIONS.get, image_roots=("torch",),
                           not_on_image=(), needed_roots=("trl",), ship_always=("filelock",))
    assert "filelock" in plan and "sympy" not in plan and "torch" not in plan


def test_real_plan_has_trl_datasets_pydantic_and_nothing_the_image_has():
    names = {wheelhouse.normalise(r.split("=")[0].split("<")[0].split(">")[0])
             for r in wheelhouse.plan()}
    assert {"trl", "datasets", "pydantic", "pydantic-core"} <= names
    # never shadow the image's compiled stack (pandas against its numpy, torch, ...)
    assert not names & {"torch", "transformers", "numpy", "pandas", "accelerate", "tokenizers"}
    assert set(wheelhouse.project_roots()) >= {"trl", "datasets", "pydantic", "torch"}


def test_tree_bytes_counts_what_git_would_send(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("/big/\n")
    (tmp_path / "a.txt").write_bytes(b"x" * 1000)
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "b.bin").write_bytes(b"y" * 5000)
    assert wheelhouse.tree_bytes(tmp_path) == 1000 + len("/big/\n")


def write_sized(path: Path, size: int) -> None:
    with path.open("wb") as fh:
        fh.truncate(size)  # sparse: size without writing the bytes


def test_check_flags_oversize_missing_wheels_and_sdists(tmp_path):
    write_sized(tmp_path / "trl-1.16.0-py3-none-any.whl", 3 * wheelhouse.MIB)
    write_sized(tmp_path / "pydantic_core-2.46.4-cp312-cp312-manylinux2014_x86_64.whl", 2 * wheelhouse.MIB)
    wanted = ["trl==1.16.0", "pydantic-core==2.46.4"]
    assert wheelhouse.check(tmp_path, wanted, limit=5 * wheelhouse.MIB) == []
    problems = wheelhouse.check(tmp_path, wanted + ["datasets==5.2.0"], limit=4 * wheelhouse.MIB)
    assert any("5.0 MiB + working tree 0.0 MiB > limit 4 MiB" in p for p in problems)
    # The working tree travels in the same 64 MiB: it counts against the limit too.
    assert wheelhouse.check(tmp_path, wanted, limit=6 * wheelhouse.MIB, tree_bytes=wheelhouse.MIB) == []
    assert wheelhouse.check(tmp_path, wanted, limit=6 * wheelhouse.MIB, tree_bytes=2 * wheelhouse.MIB)
    assert any("no wheel for datasets==5.2.0" in p for p in problems)
    (tmp_path / "xxhash-4.1.0.tar.gz").write_bytes(b"sdist")
    assert any("xxhash-4.1.0.tar.gz: not a wheel" in p for p in wheelhouse.check(tmp_path, wanted))


def test_check_cli_fails_over_the_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(wheelhouse, "plan", lambda: ["trl==1.16.0"])
    monkeypatch.setattr(wheelhouse, "tree_bytes", lambda: 0)
    write_sized(tmp_path / "trl-1.16.0-py3-none-any.whl", 2 * wheelhouse.MIB)
    assert wheelhouse.main(["check", "--dest", str(tmp_path), "--limit-mib", "3"]) == 0
    assert wheelhouse.main(["check", "--dest", str(tmp_path), "--limit-mib", "1"]) == 1


# ---------------------------------------------------------------- on a CUDA machine only


@pytest.mark.gpu
def test_hf_sampler_repeats_itself_on_cuda(tiny_model_dir):
    """Seeded samples are a function of (model, prompt, seed, j): a rerun on the GPU gives the
    same completions (bf16, the sampler's GPU default)."""
    from pivotrl.sampling import SamplingParams, get_sampler

    sampler = get_sampler("hf", tiny_model_dir, device="cuda")
    assert next(sampler.model.parameters()).dtype == torch.bfloat16
    prompts = ["<|im_start|>user\nWhere is O-1?<|im_end|>\n<|im_start|>assistant\n",
               "<|im_start|>user\nPlease help with order O-22 now<|im_end|>\n<|im_start|>assistant\n"]
    params = SamplingParams(max_new_tokens=16, temperature=1.0, seed=3)
    first = sampler.sample(prompts, 4, params, seeds=[11, 12])
    again = sampler.sample(prompts, 4, params, seeds=[11, 12])
    assert [[c.text for c in row] for row in first] == [[c.text for c in row] for row in again]
    assert len({c.text for c in first[0]}) > 1  # really sampled, not greedy


@pytest.mark.gpu
def test_grpo_step_runs_in_bf16_on_cuda(tiny_model_dir, tmp_path):
    from pivotrl.train.grpo import train
    from tests.test_train_grpo import small_config

    cfg = small_config(tmp_path, tiny_model_dir, precision="bf16", max_steps=2)
    summary = train(cfg)
    rows = [json.loads(line) for line in Path(summary["metrics"]).read_text().splitlines()]
    assert summary["steps"] == 2 and cfg.bf16()
    assert all(r["loss"] == r["loss"] for r in rows if "loss" in r)  # no NaN
