"""One rank of tests/test_train_distributed.py's gloo run (launched twice by torchrun): re-profiling
on a replicated model, then on an FSDP2-sharded one, then the final save of a sharded model and of
a sharded LoRA model. Writes OUT/rank<R>.json."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from accelerate import Accelerator
from accelerate.utils import DistributedType
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM, AutoTokenizer

from pivotrl.io.records import Turn
from pivotrl.sampling.hf import HFSampler
from pivotrl.train.grpo import save_final
from pivotrl.profile.loop import ProfileConfig
from pivotrl.train.reprofile import ReprofileHook, is_sharded
from pivotrl.verifiers.base import Score


def lora_model(model_dir: str):
    """The tiny model with a LoRA adapter whose B is not zero (so merging changes weights)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    return get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                           init_lora_weights=False))


class EasyPasses:
    """Passes 'easy' turns only; with `diverge`, rank 1 passes everything (a rank that would
    decide differently if it decided alone)."""

    name = "easy"

    def __init__(self, diverge: bool):
        self.diverge = diverge

    def score(self, turn, action) -> Score:
        return Score(float(bool(turn.metadata.get("easy")) or (self.diverge and dist.get_rank() == 1)), True)


class Recording:
    """The HF sampler (every forward really runs, in lockstep when sharded), its texts replaced by
    a fixed valid action so that the verifier alone decides; counts the prompts it was given."""

    def __init__(self, sampler):
        self.inner, self.prompts = sampler, 0

    def sample(self, prompts, n, params, seeds=None):
        self.prompts += len(prompts)
        out = self.inner.sample(prompts, n, params, seeds=seeds)
        return [[replace(c, text="done.") for c in row] for row in out]


def shard(model, mesh, layers):
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def trainer_over(model):
    """What save_final reads from a Trainer, with accelerate's own FSDP2 state-dict gathering."""
    acc = SimpleNamespace(distributed_type=DistributedType.FSDP, is_fsdp2=True,
                          is_main_process=dist.get_rank() == 0, unwrap_model=lambda m: m,
                          wait_for_everyone=dist.barrier)
    acc.get_state_dict = lambda m: Accelerator.get_state_dict(acc, m)
    return SimpleNamespace(accelerator=acc, model=model, model_wrapped=model)


def main(model_dir: str, pivots: str, out: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    tok = AutoTokenizer.from_pretrained(model_dir)
    turns = [Turn.model_validate_json(line) for line in Path(pivots).read_text().splitlines()]
    report = {}
    for mode in ("replicated", "sharded"):
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        if mode == "sharded":
            shard(model, mesh, model.model.layers)
        sharded = is_sharded(model)
        hook = ReprofileHook(verifier=EasyPasses(diverge=mode == "sharded"),
                             profile=ProfileConfig(k=2, max_new_tokens=3, seed=5))
        sampler = Recording(HFSampler(model, tokenizer=tok))
        kept = hook.run(model, tok, turns, sampler=sampler)
        report[mode] = {"sharded": sharded, "still_sharded": is_sharded(model), "profiled": sampler.prompts,
                        "kept": [t.id for t in kept], "history": hook.history}
    full = AutoModelForCausalLM.from_pretrained(model_dir)
    shard(full, mesh, full.model.layers)
    save_final(trainer_over(full), tok, Path(out) / "full")
    peft = lora_model(model_dir)
    shard(peft, mesh, peft.base_model.model.model.layers)
    save_final(trainer_over(peft), tok, Path(out) / "lora", base_model=model_dir)
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
    # gloo's threads sometimes abort at interpreter teardown (exit -6) after the work is saved
    sys.stdout.flush()
    os._exit(0)
