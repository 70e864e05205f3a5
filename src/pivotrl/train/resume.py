"""Resuming a multi-process CPU run: the optimizer state must load onto the plain CPU device.

Under `accelerate launch` on a machine without CUDA, accelerate names each process's device
`cpu:<local rank>`, and transformers' Trainer loads the optimizer state with that device as
`map_location` whenever more than one process runs. torch's loader knows the location "cpu" but
not "cpu:0", so every resume failed in `torch.load` ("don't know how to restore data location").
A CPU tensor is the same tensor on either name; the load runs with the device named "cpu".
"""

from __future__ import annotations

import torch


class CPUResumable:
    """A Trainer mixin (before the Trainer class in the bases): resume under multi-process CPU."""

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
