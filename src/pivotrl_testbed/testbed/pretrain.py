"""The base model's "pretraining": a plain torch loop on chat examples, loss on assistant tokens.

A plain loop (not TRL's SFTTrainer) because it is the simplest thing that is fast on 2 cores:
examples are tokenized once with the chat template's generation mask, bucketed by length (little
padding), and trained with AdamW + warmup/cosine decay in float32 on one thread. The same mask
TRL uses (`{% generation %}`) decides which tokens carry loss, so the base learns exactly the
assistant side of the format that profiling, training and evaluation will prompt it with.

What the base is taught (see `build.py` for the mixture): OOD task families thoroughly (so OOD
accuracy is high) and a smaller, noisier share of agentic trajectories (so in-domain skill is
partial and pivots exist).

Same config → same weights on the same machine: the init is seeded (`TinyModelConfig.seed`), the
batch order comes from `random.Random(seed)`, dropout is off, and the thread count is fixed by
the config (`threads`), so the float sums run in the same order (two quick builds, 1 and 2
threads, were bitwise equal). Another thread count or BLAS library changes that order and hence
the last bits of the weights.
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from pivotrl.formats.chat import template_messages
from pivotrl.io.records import Message


class PretrainConfig(BaseModel):
    """Loop settings. Defaults: the build measured in README (≈ 0.25 s/step on 2 cores)."""

    steps: int = Field(5400, description="Optimizer steps. Measured with the default mix: at "
                                         "3600 steps toolshop's turn 4 stayed at per-sample "
                                         "success 0.09 and turn 5 at 0.03; 5400 lifted them to "
                                         "0.22 and 0.71 (docs/RESULTS.md).")
    tokens_per_batch: int = Field(4096, description="Token budget of one batch (padded length × "
                                                    "rows); bucketing by length keeps padding small.")
    max_rows: int = Field(128, description="At most this many examples in one batch.")
    lr: float = Field(1e-3, description="Peak AdamW learning rate. Measured on one OOD family, "
                                           "200 steps: 1e-3 → 1.00 eval accuracy, 3e-3 → 0.82, "
                                           "1e-2 → 0.00; on the five-family mix 3e-3 learned "
                                           "nothing in 1500 steps.")
    warmup: int = Field(100, description="Linear warmup steps, then cosine decay to 10%.")
    weight_decay: float = Field(0.01, description="AdamW weight decay.")
    bucket_width: int = Field(64, description="Length bucket (tokens): batches hold examples whose "
                                              "lengths round up to the same multiple of this.")
    max_len: int = Field(2048, description="Examples longer than this (tokens) are dropped.")
    seed: int = Field(0, description="Shuffling seed.")
    threads: int = Field(1, description="torch threads. 1, so two builds (or a build and other "
                                        "work) share the 2-core machine: two 1-thread builds side by "
                                        "side ran 0.22 s/step each; alone, 2 threads ran 1.4× faster "
                                        "than 1 (measured). The count is part of the weights' recipe "
                                        "(module doc).")


def encode_examples(tokenizer, examples: Sequence[dict[str, Any]], max_len: int) -> list[tuple[list[int], list[int]]]:
    """Each example `{"messages": [Message|dict], "tools": [...]|None}` → (ids, loss mask). With
    `"context_messages": n`, the first n messages are context: no loss on their tokens, even an
    assistant's (a wrong call the example shows but does not teach)."""
    out = []
    for ex in examples:
        msgs = [m if isinstance(m, Message) else Message.model_validate(m) for m in ex["messages"]]
        tools = ex.get("tools") or None
        enc = tokenizer.apply_chat_template(template_messages(msgs), tools=tools, tokenize=True,
                                            return_dict=True, return_assistant_tokens_mask=True)
        ids, mask = list(enc["input_ids"]), list(enc["assistant_masks"])
        if ex.get("context_messages"):
            head = list(tokenizer.apply_chat_template(
                template_messages(msgs[:ex["context_messages"]]), tools=tools, tokenize=True,
                return_dict=True)["input_ids"])
            if ids[:len(head)] != head:
                raise ValueError("the chat template renders an example's context differently "
                                 "alone: its loss mask cannot be cut there")
            mask[:len(head)] = [0] * len(head)
        if len(ids) <= max_len and any(mask):
            out.append((ids, mask))
    return out


def _batches(encoded, cfg: PretrainConfig, rng: random.Random):
    """Endless stream of batches (lists of indices). Examples are grouped in coarse length
    buckets and shuffled *within* each bucket every epoch: padding stays small, but a batch still
    mixes tasks. (Sorting by exact length made nearly every batch one OOD family, since their
    lengths differ by family; the learning rate, not this, was what kept the mix from learning.)"""
    buckets: dict[int, list[int]] = {}
    for i, (ids, _) in enumerate(encoded):
        buckets.setdefault(-(-len(ids) // cfg.bucket_width), []).append(i)
    while True:
        batches = []
        for key in sorted(buckets):
            members = buckets[key][:]
            rng.shuffle(members)
            rows = max(1, min(cfg.max_rows, cfg.tokens_per_batch // (key * cfg.bucket_width)))
            batches += [members[j:j + rows] for j in range(0, len(members), rows)]
        rng.shuffle(batches)
        yield from batches


def _assistant_loss(model, ids, attn, labels):
    """Next-token cross-entropy on the labelled positions only. The output layer runs on those
    positions alone: most tokens are prompt, so this skips most of the vocabulary projection
    (the largest matmul of a tiny model) — same loss as `model(labels=...)`, less compute."""
    import torch.nn.functional as F

    hidden = model.get_decoder()(input_ids=ids, attention_mask=attn).last_hidden_state
    keep = labels[:, 1:] != -100
    logits = model.get_output_embeddings()(hidden[:, :-1][keep])
    return F.cross_entropy(logits.float(), labels[:, 1:][keep])


def _save_state(path: Path, model, opt, step: int, loss_ema: float | None, seconds: float,
                key: str) -> None:
    """The loop's whole state after `step` steps, written atomically (a kill mid-write leaves the
    previous checkpoint)."""
    import torch

    tmp = path.with_name(path.name + ".tmp")
    torch.save({"key": key, "step": step, "loss_ema": loss_ema, "seconds": seconds,
                "model": model.state_dict(), "opt": opt.state_dict()}, tmp)
    os.replace(tmp, path)


def _load_state(path: Path, key: str) -> dict[str, Any] | None:
    """The checkpoint at `path` when it was written for `key` (the same model, data and
    config), else None: another recipe's state is never resumed."""
    import torch

    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except (OSError, RuntimeError, EOFError, ValueError):
        return None  # unreadable (a partial file from an older writer): start over
    return state if isinstance(state, dict) and state.get("key") == key else None


def pretrain(model, tokenizer, examples: Sequence[dict[str, Any]], cfg: PretrainConfig | None = None,
             on_step: Callable[[int, float], None] | None = None, *,
             checkpoint: str | Path | None = None, checkpoint_every: int = 200,
             checkpoint_key: str = "") -> dict[str, Any]:
    """Train `model` in place; returns {"steps", "seconds", "final_loss", "examples", "tokens",
    "resumed_from"}.

    With `checkpoint`, the loop's state (weights, optimizer, step) is saved there every
    `checkpoint_every` steps and a run resumes from it when its `checkpoint_key` matches (the
    caller's name for the recipe: model, data and config): a pretraining that outlives a session
    is not lost. The batch stream is a function of the seed alone, so a resumed run replays the
    same batches and ends with the weights an unbroken run gives (tested)."""
    import torch

    cfg = cfg or PretrainConfig()
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    encoded = encode_examples(tokenizer, examples, cfg.max_len)
    if not encoded:
        raise ValueError("no training examples (all empty or longer than max_len)")
    pad = tokenizer.pad_token_id
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                            betas=(0.9, 0.98))

    def lr_at(step: int) -> float:
        if step < cfg.warmup:
            return cfg.lr * (step + 1) / cfg.warmup
        t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))

    model.train()
    start, loss_ema, stream = time.time(), None, _batches(encoded, cfg, rng)
    path = Path(checkpoint) if checkpoint is not None else None
    first, earlier = 0, 0.0
    state = _load_state(path, checkpoint_key) if path is not None else None
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        first, loss_ema, earlier = state["step"], state["loss_ema"], state["seconds"]
        for _ in range(first):
            next(stream)
    for step in range(first, cfg.steps):
        idx = next(stream)
        width = max(len(encoded[i][0]) for i in idx)
        ids = torch.full((len(idx), width), pad, dtype=torch.long)
        labels = torch.full((len(idx), width), -100, dtype=torch.long)
        attn = torch.zeros((len(idx), width), dtype=torch.long)
        for row, i in enumerate(idx):  # right padding: positions stay 0..n-1
            toks, mask = encoded[i]
            ids[row, :len(toks)] = torch.tensor(toks)
            attn[row, :len(toks)] = 1
            labels[row, :len(toks)] = torch.tensor([t if m else -100 for t, m in zip(toks, mask)])
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        loss = _assistant_loss(model, ids, attn, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_ema = loss.item() if loss_ema is None else 0.95 * loss_ema + 0.05 * loss.item()
        if path is not None and ((step + 1) % checkpoint_every == 0 or step + 1 == cfg.steps):
            _save_state(path, model, opt, step + 1, loss_ema, earlier + time.time() - start,
                        checkpoint_key)
        if on_step:
            on_step(step + 1, loss_ema)
    model.eval()
    return {"steps": cfg.steps, "seconds": round(earlier + time.time() - start, 1),
            "final_loss": loss_ema, "examples": len(encoded),
            "tokens": sum(len(e[0]) for e in encoded), "resumed_from": first}
