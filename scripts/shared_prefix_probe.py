"""The shared-prefix GRPO loss against TRL's repeated-prompt path on one real micro-batch, on
whatever device the trainer runs (scripts/gpu_check.py's shared_prefix_equivalence check)."""

from __future__ import annotations

import time
from typing import Any


def grpo_batch(tokenizer, cfg, device: str, seed: int = 0) -> dict[str, Any]:
    """One GRPO micro-batch as TRL's loss reads it: the pivots' real templated prompts (left
    padded), G random completions each (right padded, lengths 1..max), rows shuffled as TRL
    shuffles a generation batch, advantages of both signs."""
    import torch

    from pivotrl.train.grpo import build_prompts, load_pivot_set

    g = cfg.num_generations
    gen = torch.Generator().manual_seed(seed)
    rows = build_prompts(load_pivot_set(cfg), tokenizer).rows[: cfg.per_device_train_batch_size // g]
    prompts = [tokenizer(r["prompt"], add_special_tokens=False)["input_ids"] for r in rows]
    n_prompt, n_comp = max(map(len, prompts)), cfg.max_completion_length
    pairs = [(p, torch.randint(1, len(tokenizer), (int(torch.randint(1, n_comp + 1, (1,), generator=gen)),),
                               generator=gen)) for p in prompts for _ in range(g)]
    order = torch.randperm(len(pairs), generator=gen).tolist()
    ids = torch.full((len(pairs), n_prompt + n_comp), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, i in enumerate(order):
        p, c = pairs[i]
        ids[r, n_prompt - len(p):n_prompt] = torch.tensor(p)
        mask[r, n_prompt - len(p):n_prompt] = 1
        ids[r, n_prompt:n_prompt + len(c)] = c
        mask[r, n_prompt:n_prompt + len(c)] = 1
    ids, mask = ids.to(device), mask.to(device)
    return {"prompt_ids": ids[:, :n_prompt], "prompt_mask": mask[:, :n_prompt],
            "completion_ids": ids[:, n_prompt:], "completion_mask": mask[:, n_prompt:],
            "advantages": torch.linspace(-1.0, 1.0, len(pairs), device=device),
            "old_per_token_logps": None, "num_items_in_batch": mask[:, n_prompt:].sum().float()}


def loss_paths(trainer, inputs: dict[str, Any]) -> dict[bool, dict[str, Any]]:
    """Per-token log-probs, GRPO loss, every gradient and the seconds of one forward+backward,
    with the shared-prefix path off and on, on the same weights and batch."""
    import torch

    model = trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # Trainer.train() sets it in a real run
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    n_comp = inputs["completion_ids"].size(1)
    out = {}
    for on in (False, True, False, True):  # twice each: the first call of a path warms it up
        trainer.shared_prefix = on
        sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
        sync()
        t0 = time.perf_counter()
        with torch.no_grad():
            logps = trainer._get_per_token_logps_and_entropies(model, ids, mask, n_comp)[0]
        loss = trainer.compute_loss(model, inputs)
        loss.backward()
        sync()
        seconds = time.perf_counter() - t0
        grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        out[on] = {"logps": logps.float(), "loss": float(loss.detach()), "grads": grads, "seconds": seconds}
    return out


def compare_shared_prefix(cfg) -> dict[str, Any]:
    """Build the trainer of run config `cfg` (shared-prefix switch on) and compare the two paths
    on one micro-batch of its pivots."""
    from transformers import AutoTokenizer

    from pivotrl.train.grpo import build_trainer, load_pivot_set

    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    trainer = build_trainer(cfg, load_pivot_set(cfg), tokenizer=tokenizer,
                            reward_funcs=[lambda completions, **_: [0.0] * len(completions)])
    if not trainer.shared_prefix:
        raise RuntimeError("the trainer did not enable the shared-prefix path for this model")
    if cfg.gradient_checkpointing:  # as Trainer.train() turns it on
        trainer.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs)
    inputs = grpo_batch(tokenizer, cfg, str(next(trainer.model.parameters()).device))
    with trainer.accelerator.autocast():
        res = loss_paths(trainer, inputs)
    plain, shared = res[False], res[True]
    cmask = inputs["completion_mask"].bool()
    grad_rel = max(float((shared["grads"][n] - g).abs().max() / g.abs().max().clamp_min(1e-30))
                   for n, g in plain["grads"].items())
    return {"precision": cfg.precision, "rows": int(cmask.size(0)),
            "prompt_columns": int(inputs["prompt_ids"].size(1)),
            "logp_max_abs_diff": float((shared["logps"] - plain["logps"])[cmask].abs().max()),
            "loss": [plain["loss"], shared["loss"]],
            "grad_max_rel_diff": grad_rel, "parameters_compared": len(plain["grads"]),
            "same_parameters": plain["grads"].keys() == shared["grads"].keys(),
            "fwd_bwd_seconds": [round(plain["seconds"], 4), round(shared["seconds"], 4)]}
