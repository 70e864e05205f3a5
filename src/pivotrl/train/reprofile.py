"""Re-profiling during training: when the batch reward says the policy has caught up, the pivots are
profiled again with the current policy and those it now always solves are dropped (zero variance:
they no longer teach anything). Off by default (the paper profiles once).

Under several processes every pivot is profiled once and every process continues on the same
pivots. When each process holds the whole model (one process, DDP, ZeRO-1/2), each profiles its
own shard of the pivots (`shard_of(id, world)`; samples are seeded per turn, so the result is the
one a single process gets) and the kept ids are all-gathered. When the parameters are split over
the processes (FSDP, ZeRO-3) every forward is a collective, so every process takes part in the
same generation and rank 0's kept ids are broadcast (`share_kept`), so that no float difference
between ranks can leave them on different pivots. A caller with its own engine (e.g. a vLLM
sampler) passes it as `sampler`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, TypeVar

from transformers import TrainerCallback

from pivotrl.io.records import (Profile, Turn)
from pivotrl.io.seeds import derive_seed
from pivotrl.io.turn_files import (  # noqa: F401 (API)
    RowAccess,
    index_rows,
    read_turns,
    scan_turns,
    shard_of,
)
from pivotrl.profile.loop import ProfileConfig, profile_stream
from pivotrl.select import SUCCESS_THRESHOLD, outcome

T = TypeVar("T", bound=Turn)


def dist_world() -> tuple[int, int]:
    """(rank, world size) of the initialised torch.distributed group; (0, 1) without one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_sharded(model: Any) -> bool:
    """Whether the model's parameters are split over processes: DeepSpeed ZeRO-3 (`ds_id`), FSDP1
    (flat parameters), FSDP2 (its modules' classes; between a forward and a backward the root's
    parameters are plain tensors, so they cannot tell). Then no process can run a forward alone."""
    if any(type(m).__name__.startswith("FSDP") for m in getattr(model, "modules", lambda: ())()):
        return True
    return any(hasattr(p, "ds_id") or getattr(p, "_is_flat_param", False) or type(p).__name__ == "DTensor"
               for p in getattr(model, "parameters", lambda: ())())


def share_kept(ids: list[str], counts: dict[str, int], *, profiled_all: bool) -> tuple[list[str], dict[str, int]]:
    """Every process's view of the kept ids and counts. profiled_all: every process profiled
    every pivot (rank 0's result is broadcast); else each profiled its shard (all-gathered)."""
    _, world = dist_world()
    if world == 1:
        return ids, counts
    import torch.distributed as dist

    if profiled_all:
        box = [(ids, counts)]
        dist.broadcast_object_list(box, src=0)
        return box[0]
    parts: list[Any] = [None] * world
    dist.all_gather_object(parts, (ids, counts))
    total: Counter = Counter()
    for _, part in parts:
        total.update(part)
    return [i for part_ids, _ in parts for i in part_ids], dict(total)


def reprofile(pivots: Sequence[Turn], sampler, verifier, tokenizer, cfg: ProfileConfig,
              threshold: float = SUCCESS_THRESHOLD) -> tuple[list[Profile], dict[str, int]]:
    """Re-profile pivots with the *current* policy (`sampler`) and drop those that became all-pass
    (they no longer teach anything: zero variance). Returns (kept, refreshed Profiles; counts)."""
    kept, counts = [], Counter()
    for prof in profile_stream(pivots, sampler, verifier, tokenizer, cfg):
        result = outcome([s.reward for s in prof.samples], threshold)
        counts[result] += 1
        if result != "all_pass":
            kept.append(prof)
    return kept, {"before": len(pivots), "after": len(kept), **counts}


class ReprofileHook:
    """Call `should_run(batch_reward_mean)` once per training step (or log); when it says so,
    `run(model, tokenizer, pivots)` returns the pivots still worth training on. It fires when the
    batch reward mean reaches `threshold`, at most once every `every_n_steps` steps.

    profile: how to re-profile (a ProfileConfig: k, sampling, verifier and format; `train` builds
    it from the run's rollout settings). verifier: a verifier object instead of `profile`'s.
    """

    def __init__(self, threshold: float = 0.9, every_n_steps: int = 50, profile: ProfileConfig | None = None,
                 verifier: Any = None):
        self.profile = profile or ProfileConfig()
        self.verifier = verifier if verifier is not None else self.profile.build_verifier()
        self.threshold, self.every_n_steps = threshold, every_n_steps
        self.step = 0
        self.last_run: int | None = None
        self.history: list[dict[str, int]] = []

    def should_run(self, batch_reward_mean: float, step: int | None = None) -> bool:
        """`step`: the trainer's global step (default: count the calls)."""
        self.step = self.step + 1 if step is None else int(step)
        due = self.last_run is None or self.step - self.last_run >= self.every_n_steps
        return bool(due and batch_reward_mean >= self.threshold)

    def run(self, model, tokenizer, pivots: Sequence[T], sampler: Any = None) -> list[T]:
        """The pivots (of `pivots`, in order) still worth training on after re-profiling with
        `model` as it is now (eval mode during sampling, mode restored); the same list on every
        process (module doc). sampler: an engine to use instead of HF generation on `model`."""
        from pivotrl.sampling.hf import HFSampler

        self.last_run = self.step
        rank, world = dist_world()
        whole = world == 1 or is_sharded(model)
        mine = list(pivots) if whole else [p for p in pivots if shard_of(p.id, world) == rank]
        sampler = sampler or HFSampler(model, tokenizer=tokenizer, batch_size=self.profile.batch_size)
        cfg = self.profile.model_copy(update={"seed": derive_seed(self.profile.seed, self.step)})
        kept, counts = reprofile(mine, sampler, self.verifier, tokenizer, cfg)
        ids, counts = share_kept([p.id for p in kept], counts, profiled_all=whole)
        self.history.append({"step": self.step, **counts})
        keep = set(ids)
        return [p for p in pivots if p.id in keep]


class ReprofileCallback(TrainerCallback):
    """Stops the current phase (after a checkpoint) when the re-profiling hook wants to run; the
    phase loop in `train` then re-profiles and continues from that checkpoint on the new pivots.
    (A TRL dataloader cannot swap its dataset mid-run; a checkpoint boundary is the clean seam.)"""

    def __init__(self, hook):
        self.hook = hook
        self.triggered = False

    def on_log(self, args, state, control, logs=None, **kwargs):
        reward = (logs or {}).get("reward")
        if reward is not None and state.global_step < state.max_steps and self.hook.should_run(reward, step=state.global_step):
            self.triggered = True
            control.should_save = True
            control.should_training_stop = True
