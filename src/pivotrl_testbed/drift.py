"""How far a checkpoint moved from the base on OOD text: the mean per-token KL and the rank
correlation of the base's top-k next tokens, averaged over every position. A descriptive drift
measure (the demo's matched-KL frontier reads it); the demo's Theorem 3.3 check proper is in
theory.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def ood_logprob_stats(model, ref_model, tokenizer, prompts: Sequence[str], top_k: int = 10,
                      batch_size: int = 32) -> dict[str, float]:
    """How far `model` moved from `ref_model` on OOD text.

    `prompts` are full texts (an OOD eval prompt with its answer, rendered with the chat
    template). Returns `kl`: mean over positions of KL(model ‖ ref) between next-token
    distributions, and `rank_corr`: mean over positions of the Spearman correlation between the
    two models' log-probabilities of the ref's top-k next tokens (Thm 3.3: a functional reward
    reshapes mass within the acceptable set and keeps the order of the rest; 1.0 = order kept).
    """
    import torch

    kls, corrs, n_pos = 0.0, 0.0, 0
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    for i in range(0, len(prompts), batch_size):
        ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts[i:i + batch_size]]
        ids = [x for x in ids if len(x) >= 2]
        if not ids:
            continue
        width = max(len(x) for x in ids)
        input_ids = torch.tensor([x + [pad] * (width - len(x)) for x in ids])
        mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids])
        with torch.no_grad():
            lp = torch.log_softmax(model(input_ids=input_ids, attention_mask=mask).logits.float(), -1)
            lq = torch.log_softmax(ref_model(input_ids=input_ids, attention_mask=mask).logits.float(), -1)
        sel = mask.bool()
        lp, lq = lp[sel], lq[sel]  # (positions, vocab)
        vocab = min(lp.shape[-1], lq.shape[-1])
        lp, lq = lp[:, :vocab], lq[:, :vocab]
        kls += (lp.exp() * (lp - lq)).sum(-1).clamp_min(0).sum().item()
        top = lq.topk(min(top_k, vocab), dim=-1).indices
        corrs += _spearman_rows(lp.gather(-1, top), lq.gather(-1, top)).sum().item()
        n_pos += lp.shape[0]
    if not n_pos:
        return {"kl": 0.0, "rank_corr": 1.0, "positions": 0}
    return {"kl": kls / n_pos, "rank_corr": corrs / n_pos, "positions": n_pos}


def _spearman_rows(a, b):
    """Row-wise Spearman correlation (ties broken by position; fine for continuous log-probs)."""

    def ranks(x):
        return x.argsort(-1).argsort(-1).float()

    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(-1, keepdim=True), rb - rb.mean(-1, keepdim=True)
    denom = (ra.norm(dim=-1) * rb.norm(dim=-1)).clamp_min(1e-12)
    return (ra * rb).sum(-1) / denom


def ood_texts(tokenizer, tasks: Sequence[Any]) -> list[str]:
    """OOD eval prompts with their answers as chat text (the input `ood_logprob_stats` wants)."""
    from pivotrl.formats.chat import template_messages
    from pivotrl.io.records import Message
    from pivotrl_testbed.testbed.agentic_ood import expected_reply

    return [tokenizer.apply_chat_template(
        template_messages(list(getattr(t, "messages", None) or [Message(role="user", content=t.prompt)])
                          + [expected_reply(t)]),
        tools=getattr(t, "tools", None) or None, tokenize=False)
        for t in tasks]
