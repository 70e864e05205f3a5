"""The scale-out path: the same `pivotrl train` under `accelerate launch`, two real processes
(gloo on CPU), and the shipped accelerate configs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from test_train_grpo import write_pivots

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs" / "accelerate"


@pytest.mark.slow
def test_train_and_resume_under_accelerate_two_processes(tmp_path, tiny_model_dir):
    """One step under two processes, then `--resume` to step 2: the optimizer state loads on
    every rank (accelerate names a CPU process's device `cpu:<rank>`, which torch.load refused)."""
    run_yaml = tmp_path / "run.yaml"
    run_yaml.write_text(yaml.safe_dump({
        "model": str(tiny_model_dir), "pivots": str(write_pivots(tmp_path / "pivots.jsonl", 8)),
        "output_dir": str(tmp_path / "run"), "num_generations": 4, "per_device_train_batch_size": 4,
        "max_completion_length": 8, "learning_rate": 1e-4, "max_steps": 1, "save_steps": 1}))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(CONFIGS / "cpu_2proc.yaml"), "--main_process_port", "29517",
           "-m", "pivotrl.cli", "train", "--config", str(run_yaml)]
    for flags in ([], ["--resume", "--max-steps", "2"]):
        proc = subprocess.run(cmd + flags, env=env, capture_output=True, text=True, timeout=600)
        # Exit 0 from the launcher: every rank left cleanly after saving (cli.leave_process_group),
        # and the summary, printed just before a rank leaves without finalization, was flushed.
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "rollout_turns" in proc.stdout + proc.stderr
    out = tmp_path / "run"
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # Two processes × 4 completions each per step: 8 rollout turns a step. One process would give 4.
    assert [r["rollout_turns"] for r in rows] == [8, 16]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out / "checkpoint-2")
    tok = AutoTokenizer.from_pretrained(out)
    assert model.config.vocab_size == len(tok)


@pytest.mark.parametrize("name", ["cpu_2proc", "deepspeed_zero2", "deepspeed_zero3", "fsdp"])
def test_accelerate_configs_load(name):
    from accelerate.commands.config.config_args import load_config_from_file

    cfg = load_config_from_file(str(CONFIGS / f"{name}.yaml"))
    assert cfg.num_processes >= 2
    if name.startswith("deepspeed"):
        assert cfg.deepspeed_config["zero_stage"] == int(name[-1])
    if name == "fsdp":
        assert cfg.fsdp_config["fsdp_version"] == 2


def lora_reference(model_dir):
    from dist_scaleout_worker import lora_model

    return lora_model(str(model_dir)).merge_and_unload()


def same_weights(a, b) -> bool:
    import torch

    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.slow
def test_fsdp_two_ranks_reprofile_once_agree_and_save_full_models(tmp_path, tiny_model_dir):
    """Two gloo ranks (torchrun), FSDP2 on CPU: re-profiling splits the pivots of a replicated
    model and runs in lockstep on a sharded one, every rank ending on the same pivots (rank 0's
    when they would differ); the final save gathers a sharded model, and merges a sharded LoRA
    model's adapter, into checkpoints `from_pretrained` loads."""
    from transformers import AutoModelForCausalLM

    from test_train_grpo import make_turn

    rows = [dict(make_turn(i), metadata={"easy": i % 3 == 0}) for i in range(8)]
    pivots = tmp_path / "pivots.jsonl"
    pivots.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29519",
           str(ROOT / "tests" / "dist_scaleout_worker.py"), str(tiny_model_dir), str(pivots), str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    hard = [r["id"] for r in rows if not r["metadata"]["easy"]]
    rep = [r["replicated"] for r in ranks]
    assert not any(r["sharded"] for r in rep)
    assert sum(r["profiled"] for r in rep) == 8 and all(0 < r["profiled"] < 8 for r in rep)  # each pivot once
    assert rep[0]["kept"] == rep[1]["kept"] == hard and rep[0]["history"][0]["before"] == 8
    sh = [r["sharded"] for r in ranks]
    assert all(r["sharded"] and r["profiled"] == 8 for r in sh)  # lockstep: every rank every forward
    # rank 1's verifier passes everything: alone it would keep nothing; it follows rank 0
    assert sh[0]["kept"] == sh[1]["kept"] == hard

    full = AutoModelForCausalLM.from_pretrained(out / "full")
    assert same_weights(full, AutoModelForCausalLM.from_pretrained(tiny_model_dir))
    merged = AutoModelForCausalLM.from_pretrained(out / "lora")
    assert (out / "lora" / "adapter" / "adapter_config.json").exists()
    assert same_weights(merged, lora_reference(tiny_model_dir))
    assert not same_weights(merged, full)


def test_save_final_writes_the_gathered_weights_not_the_local_partition(tmp_path, tiny_model_dir):
    """ZeRO-3 as the save path sees it (DeepSpeed does not run on CPU): each process's parameters
    are empty placeholders and only `get_state_dict` (DeepSpeed's 16-bit consolidation through
    accelerate) has the weights; the saved model and the LoRA merge must come from those."""
    from types import SimpleNamespace

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dist_scaleout_worker import lora_model
    from pivotrl.train.grpo import save_final

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    for name, model, reference in (
            ("full", AutoModelForCausalLM.from_pretrained(tiny_model_dir), None),
            ("lora", lora_model(str(tiny_model_dir)), lora_reference(tiny_model_dir))):
        gathered = {k: v.clone() for k, v in model.state_dict().items()}
        reference = reference or AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        with torch.no_grad():
            for p in model.parameters():
                p.data = torch.empty(0)  # the partition a ZeRO-3 rank holds outside a gather
        asked = []
        acc = SimpleNamespace(is_main_process=True, unwrap_model=lambda m: m, wait_for_everyone=lambda: None,
                              get_state_dict=lambda m, asked=asked, gathered=gathered: asked.append(m) or gathered)
        engine = object()  # the DeepSpeed engine: what get_state_dict must be given
        save_final(SimpleNamespace(accelerator=acc, model=model, model_wrapped=engine), tok, tmp_path / name,
                   base_model=str(tiny_model_dir))
        assert asked == [engine]
        assert same_weights(AutoModelForCausalLM.from_pretrained(tmp_path / name), reference)
