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
"""

from __future__ import annotations

import torch


class Resumable:
    """A Trainer mixin (before the Trainer class in the bases) for the two resume fixes above."""

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
