"""Resuming a run from its checkpoint: what transformers' Trainer gets wrong for our runs.

- Multi-process CPU: under `accelerate launch` on a machine without CUDA, accelerate names each
  process's device `cpu:<local rank>`, and the Trainer loads the optimizer state with that device
  as `map_location` whenever more than one process runs. torch's loader knows the location "cpu"
  but not "cpu:0", so every resume failed in `torch.load` ("don't know how to restore data
  location"). A CPU tensor is the same tensor on either name; the load runs with "cpu".
- Tied embeddings (the LM head shares the input embedding's weight, as small Qwen3 models do):
  the checkpoint stores the shared tensor once, so loading it reports the head's key as missing
  ("There were missing keys in the checkpoint model loaded: ['lm_head.weight']") although the
  head was loaded through the embedding. Only keys that share no tensor with a loaded key warn.
- The data order: TRL's RepeatSampler (GRPO) and torch's RandomSampler (SFT) shuffle each epoch
  from a generator that lives in the process, so a resumed process's epoch e was shuffled as if it
  were the first epoch, and each resumed run trained on other prompts than the uninterrupted one.
  Here each epoch's order is a function of (seed, epoch) alone (the Trainer calls `set_epoch`
  before each epoch; GRPO's is TRL's own order, SFT's a seeded shuffle per epoch), and a resume
  fast-forwards past the batches its epoch already trained (`ignore_data_skip` off): 2 steps +
  resume to 4 trains the prompts of 4 straight steps.
"""

from __future__ import annotations

import torch
from torch.utils.data import RandomSampler
from trl.trainer.utils import RepeatSampler

from pivotrl.io.seeds import derive_seed


class Resumable:
    """A Trainer mixin (before the Trainer class in the bases) for the resume fixes above."""

    def _get_train_sampler(self, *args, **kwargs):
        return epoch_seeded(super()._get_train_sampler(*args, **kwargs), self.args.seed)

    def _load_optimizer_and_scheduler(self, checkpoint):
        device = self.args.device
        if device.type != "cpu" or device.index is None:
            return super()._load_optimizer_and_scheduler(checkpoint)
        # TrainingArguments.device reads the cached `_setup_devices`; only this load sees "cpu".
        self.args.__dict__["_setup_devices"] = torch.device("cpu")
        try:
            return super()._load_optimizer_and_scheduler(checkpoint)
        finally:
            self.args.__dict__["_setup_devices"] = device

    def _issue_warnings_after_load(self, load_result):
        return super()._issue_warnings_after_load(
            load_result._replace(missing_keys=untied_missing_keys(self.model, load_result.missing_keys)))


def untied_missing_keys(model, missing: list[str]) -> list[str]:
    """The keys of `missing` that were really not loaded: a key whose tensor is also a loaded
    key's tensor (a tied weight) was loaded through that key."""
    state = model.state_dict(keep_vars=True)
    gone = set(missing)
    loaded = {t.data_ptr() for k, t in state.items() if k not in gone}
    return [k for k in missing if k not in state or state[k].data_ptr() not in loaded]


class EpochSeededRepeatSampler(RepeatSampler):
    """TRL's GRPO sampler (each prompt G times, in shuffled chunks) whose epoch e is the e-th
    shuffle of a generator seeded with the run's seed: TRL's own order, epoch for epoch, but
    rebuilt from (seed, epoch) rather than from the generator's state in this process."""

    epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        self.generator.manual_seed(self.seed)
        for _ in range(self.epoch):  # the shuffles of the epochs before (TRL draws one an epoch)
            torch.randperm(self.num_samples, generator=self.generator)
        return super().__iter__()


class EpochSeededRandomSampler(RandomSampler):
    """torch's shuffling sampler (the Trainer's, for SFT), each epoch shuffled from (seed, epoch)."""

    def __init__(self, data_source, seed: int):
        super().__init__(data_source, generator=torch.Generator())
        self.seed, self.epoch = seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        self.generator.manual_seed(derive_seed("data order", self.seed, self.epoch))
        return super().__iter__()


def epoch_seeded(sampler, seed: int):
    """`sampler` with each epoch's order a function of (seed, epoch) when it is TRL's shuffling
    RepeatSampler or torch's plain RandomSampler; any other (sequential, length-grouped) as it is."""
    if type(sampler) is RepeatSampler and sampler.shuffle:
        return EpochSeededRepeatSampler(sampler.data_source, sampler.mini_repeat_count, sampler.batch_size,
                                        sampler.repeat_count, shuffle=True, seed=seed)
    if type(sampler) is RandomSampler and not sampler.replacement and sampler._num_samples is None:
        return EpochSeededRandomSampler(sampler.data_source, seed)
    return sampler
