"""The plan of `pivotrl profile` (pivotrl.io.run_plan): turns to profile, samples, token budget; read
without writing anything (a dry run may look at an output it must not touch)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pivotrl.formats.template_vars import unread_kwargs_warning
from pivotrl.io.empty import require_some
from pivotrl.io.records import Reject, is_blank, iter_lines
from pivotrl.io.turn_files import parse_shard, scan_turns
from pivotrl.profile.loop import ProfileConfig
from pivotrl.io.run_plan import RunPlan


def written_ids(path: str | Path) -> set[str]:
    """Ids of the whole rows an output holds (a torn last line is skipped, not repaired)."""
    path, ids = Path(path), set()
    if not path.is_file():
        return ids
    for _, text, _ in iter_lines(path):
        if is_blank(text):
            continue
        try:
            ids.add(str(json.loads(text)["id"]))
        except (ValueError, KeyError, TypeError):
            continue
    return ids


def profile_plan(turns: str | Path, out: str | Path, cfg: ProfileConfig, tokenizer: Any, model: str) -> RunPlan:
    shard = parse_shard(cfg.shard)
    ids, rejected, first_reject = [], 0, None
    for _, rec in scan_turns(turns, shard):
        if isinstance(rec, Reject):
            rejected += 1
            first_reject = first_reject or rec.reason
        else:
            ids.append(rec.id)
    if shard is None:  # the whole file holds no turn: the reason (e.g. trajectories, not turns) names the fix
        require_some(len(ids), "turns", turns, rejected=rejected, first_reject=first_reject, expects="turns")
    done = written_ids(out) if cfg.resume else set()
    todo = sum(1 for i in ids if i not in done)
    warning = unread_kwargs_warning(tokenizer, cfg.chat_template_kwargs, model)
    return RunPlan(
        verb="profile", unit="turns", items=len(ids), read=len(ids) + rejected, dropped=rejected,
        token_budget={"max_new_tokens": cfg.sampling(tokenizer).max_new_tokens},
        details={"turns_done_before": len(ids) - todo, "turns_to_profile": todo, "samples_per_turn": cfg.k,
                 "samples": todo * cfg.k, "turns_per_sampler_call": cfg.chunk_turns, "backend": cfg.backend,
                 **({"shard": cfg.shard} if cfg.shard else {})},
        may_be_empty=shard is not None, warnings=[warning] if warning else [])
