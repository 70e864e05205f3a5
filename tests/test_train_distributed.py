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
def test_train_under_accelerate_two_processes(tmp_path, tiny_model_dir):
    run_yaml = tmp_path / "run.yaml"
    run_yaml.write_text(yaml.safe_dump({
        "model": str(tiny_model_dir), "pivots": str(write_pivots(tmp_path / "pivots.jsonl", 8)),
        "output_dir": str(tmp_path / "run"), "num_generations": 4, "per_device_train_batch_size": 4,
        "max_completion_length": 8, "learning_rate": 1e-4, "max_steps": 2, "save_steps": 2}))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(CONFIGS / "cpu_2proc.yaml"), "--main_process_port", "29517",
           "-m", "pivotrl.cli", "train", "--config", str(run_yaml)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
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
