"""Profiling runs over files: `profile_file` streams a Turn file through `loop.profile_stream`,
appends one Profile per line with a flush per record, and can be killed at any moment: the same
command resumes, skipping the ids already written (a torn last line is repaired first). So a resumed
run equals an uninterrupted one, and shards (`--shard I/N`, by a stable hash of the id) merged
(`merge_profiles`) equal an unsharded run.

Costs are counted: rollout turns (= samples generated, one model call each) and generated tokens,
in PROFILE.stats.json (one entry per run, and their totals)."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pivotrl.io.empty import EmptyResultError, check_input, require_some
from pivotrl.io.outputs import claim_output, output_lock
from pivotrl.io.progress import ProgressLog, TokenCount
from pivotrl.io.records import (AppendWriter, Profile, Reject, Turn, done_ids, is_blank, iter_lines,
                                read_records, rejects_path, sidecar_path, stats_path, write_atomic,
                                write_text_atomic)
from pivotrl.io.turn_files import RowAccess, index_rows, parse_shard, scan_turns
from pivotrl.profile.loop import ProfileConfig, RunStats, profile_stream
from pivotrl.sampling.pipeline import longer_context_fix, prompt_limit
from pivotrl.select import SUCCESS_THRESHOLD, outcome


def _identity(cfg: ProfileConfig, model: str, backend: str) -> dict[str, Any]:
    """Settings that must not change between a run and its resume (else samples would mix)."""
    return {"model": model, "backend": backend, "k": cfg.k, "seed": cfg.seed,
            "verifier": cfg.verifier, "verifier_config": cfg.verifier_config,
            "max_new_tokens": cfg.max_new_tokens, "temperature": cfg.temperature,
            "top_p": cfg.top_p, "shard": cfg.shard,
            # only when set, so runs written before these options existed resume unchanged
            **({"chat_template_kwargs": cfg.chat_template_kwargs} if cfg.chat_template_kwargs else {}),
            **({"response_format": cfg.response_format} if cfg.response_format else {})}


def summarize_output(path: str | Path, threshold: float = SUCCESS_THRESHOLD) -> dict[str, Any]:
    """Outcome counts over a whole Profile file (binary outcome, as select uses)."""
    counts: Counter[str] = Counter()
    n = samples = invalid = unverifiable = 0
    path = Path(path)
    if path.exists():
        for _, line, _ in iter_lines(path):
            if is_blank(line):
                continue
            rec = json.loads(line)
            rewards = [s["reward"] for s in rec.get("samples", [])]
            counts[outcome(rewards, threshold)] += 1
            n += 1
            samples += len(rewards)
            invalid += sum(not s.get("valid", True) for s in rec.get("samples", []))
            unverifiable += bool(rec.get("unverifiable"))
    return {"turns": n, "samples": samples, "invalid_samples": invalid,
            "unverifiable_turns": unverifiable,
            "all_fail": counts["all_fail"], "all_pass": counts["all_pass"], "mixed": counts["mixed"],
            "success_threshold": threshold}


def profile_file(turns_path: str | Path, out_path: str | Path, sampler, verifier, tokenizer,
                 cfg: ProfileConfig, *, model_name: str = "", progress: bool = True,
                 on_progress: Callable[[int, int, str], Any] | None = None) -> dict[str, Any]:
    """Profile a Turn file into an append-only Profile file (resumable); returns the stats dict
    also written to PROFILE.stats.json. One run per output at a time: a second run on the same
    `out_path` fails with OutputLockedError (a ValueError) instead of writing every turn twice.
    Progress: plain lines on stderr and in PROFILE.log (`progress`); `on_progress(done, total,
    rate)` after every turn (a live bar; the lines then go to the log only)."""
    with output_lock(out_path):
        return _profile_locked(turns_path, out_path, sampler, verifier, tokenizer, cfg,
                               model_name=model_name, progress=progress, on_progress=on_progress)


def _profile_locked(turns_path: str | Path, out_path: str | Path, sampler, verifier, tokenizer,
                    cfg: ProfileConfig, *, model_name: str = "", progress: bool = True,
                    on_progress: Callable[[int, int, str], Any] | None = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    shard = parse_shard(cfg.shard)
    out_path, spath = Path(out_path), stats_path(out_path)
    claim_output(out_path, resume=cfg.resume, overwrite=cfg.overwrite,
                 companions=[spath, sidecar_path(out_path, ".log"), rejects_path(out_path)])
    identity = _identity(cfg, model_name, getattr(sampler, "name", "?"))
    previous = json.loads(spath.read_text()) if spath.exists() else None
    if previous and Path(out_path).exists():
        changed = {k: (previous["settings"].get(k), v) for k, v in identity.items()
                   if previous["settings"].get(k) != v}
        if changed:
            raise ValueError(f"{out_path} was written with other settings {changed} "
                             "(old, new): resume with the same settings, start over with --overwrite, "
                             "or write a new --out")
    # Two passes: ids and line numbers first (each turn dropped as read), then the turns to do,
    # streamed into the sampler, so a run holds about one chunk of turns, not its whole shard.
    check_input(turns_path)
    lines: dict[str, int] = {}  # valid turn id -> line, in file order
    rejects: list[Reject] = []
    for lineno, rec in scan_turns(turns_path, shard):
        if isinstance(rec, Reject):
            rejects.append(rec)
        else:
            lines[rec.id] = lineno
    if rejects:
        write_atomic(rejects_path(out_path), [r.to_json() for r in rejects])
    if shard is None:  # a shard may hold no turn of a small file; the whole file may not
        require_some(len(lines), "turns", turns_path, rejected=len(rejects),
                     first_reject=rejects[0].reason if rejects else None, expects="turns")
    done = done_ids(out_path)
    n_todo = sum(1 for tid in lines if tid not in done)
    todo = (t for _, t in scan_turns(turns_path, shard)
            if isinstance(t, Turn) and t.id in lines and t.id not in done)
    stats = RunStats(turns_selected=len(lines), turns_done_before=len(lines) - n_todo,
                     rejected_lines=len(rejects))
    runs = (previous or {}).get("runs", []) if Path(out_path).exists() else []

    def save(final: bool) -> dict[str, Any]:
        # Saved after every chunk too, so a kill -9 loses at most one chunk's cost accounting.
        stats.wall_seconds = round(time.perf_counter() - t0, 3)
        stats.samples_per_second = round(stats.rollout_turns / max(stats.wall_seconds, 1e-9), 3)
        all_runs = runs + [stats.model_dump()]
        keys = ("turns_profiled", "rollout_turns", "generated_tokens", "prompt_tokens",
                "invalid_samples", "truncated_samples", "unverifiable_turns", "wall_seconds")
        doc = {"settings": identity, "turns_file": str(turns_path),
               "totals": {k: sum(r.get(k, 0) for r in all_runs) for k in keys},
               "outcomes": summarize_output(out_path) if final else None, "runs": all_runs}
        write_text_atomic(spath, json.dumps(doc, indent=2))
        return doc

    log = ProgressLog("profile", len(lines), unit="turn", log_file=sidecar_path(out_path, ".log"),
                      every_s=cfg.progress_seconds,
                      start=len(lines) - n_todo, echo=progress and on_progress is None)
    save(final=False)
    if on_progress is not None:
        on_progress(len(lines) - n_todo, len(lines), "")
    try:
        # Profiles arrive a chunk at a time, and lines come from the clock (`running`): the log
        # is told a whole chunk at once, so no line rates a chunk's time as a few turns' (the
        # turns of a chunk are scored one by one, as fast as the machine allows).
        rate = ""
        # Tokens as they are drawn (the hf sampler reports each decoding step), so a line moves
        # while a chunk of long samples is sampled, before any of its turns is scored.
        tokens = TokenCount(t0)

        def on_tokens(k: int) -> None:
            tokens.add(k)
            log.note(log.done, " · ".join(filter(None, [rate, tokens.text()])))
            if on_progress is not None:
                on_progress(log.done, len(lines), " · ".join(filter(None, [rate, tokens.text()])))

        with AppendWriter(out_path) as writer, log.running():
            for i, rec in enumerate(profile_stream(todo, sampler, verifier, tokenizer, cfg, stats,
                                                   on_tokens=on_tokens)):
                writer.write(rec)
                rate = f"{stats.rollout_turns / max(time.perf_counter() - t0, 1e-9):,.1f} samples/s"
                finished = len(lines) - n_todo + i + 1
                if on_progress is not None:
                    on_progress(finished, len(lines), rate)
                if (i + 1) % cfg.chunk_turns == 0:
                    log.note(finished, " · ".join(filter(None, [rate, tokens.text()])))
                    save(final=False)
        if n_todo:
            log.update(len(lines), rate)  # the last line
    finally:
        doc = save(final=True)
    if stats.too_long:  # nothing lost: what the engine cannot take is listed with the reason
        write_atomic(rejects_path(out_path), [r.to_json() for r in rejects] + [
            # n: the count, or the fewest tokens of a prompt too long to tokenize (split_too_long)
            Reject(str(turns_path), lines.get(tid, 0), f"prompt of at least {n} tokens is longer "
                   f"than the engine takes ({prompt_limit(sampler)}); {longer_context_fix(sampler)}",
                   "context").to_json()
            for tid, n in stats.too_long.items()])
    # Turns to profile and none profiled, by this run or before: every prompt was set aside as too
    # long (a shard that drew no turn of a small file profiles nothing, rightly, and passes).
    if lines and not doc["outcomes"]["turns"] and stats.too_long:
        raise EmptyResultError(out_path, f"0 turns profiled: all {len(stats.too_long)} turns' prompts "
                               f"are longer than the engine takes ({prompt_limit(sampler)} tokens; the "
                               f"shortest has at least {min(stats.too_long.values())}; listed in "
                               f"{rejects_path(out_path)}); {longer_context_fix(sampler)}", result=doc)
    return doc


class MergeError(ValueError):
    pass


def merge_profiles(turns_path: str | Path, shard_paths: Sequence[str | Path],
                   out_path: str | Path) -> dict[str, Any]:
    """Join shard outputs into one Profile file in TURNS order; every valid turn of TURNS must
    appear exactly once across the shards (else MergeError, naming the ids, and nothing written)."""
    # Valid ids in file order, first copy of a repeated id (read_turns' rule), contexts not kept.
    expected = list(dict.fromkeys(r.id for _, r in read_records(turns_path, Turn) if not isinstance(r, Reject)))
    where: dict[str, list[tuple[int, int]]] = {}  # id -> (shard, row index) of each copy
    paths = [Path(p) for p in shard_paths]
    index = []
    for s, path in enumerate(paths):
        if not path.exists():
            raise MergeError(f"shard file {path} does not exist")
        try:
            index.append(index_rows(path))
        except ValueError as exc:
            raise MergeError(f"{exc}; resume that shard to repair it") from None
        for i, row in enumerate(index[-1]):
            where.setdefault(row[0], []).append((s, i))
    want = set(expected)
    missing = [i for i in expected if i not in where]
    doubled = {i: len(v) for i, v in where.items() if len(v) > 1}
    unknown = [i for i in where if i not in want]
    if missing or doubled or unknown:
        parts = []
        if missing:
            parts.append(f"{len(missing)} turn(s) missing: {', '.join(missing[:10])}")
        if doubled:
            parts.append(f"{len(doubled)} turn(s) doubled: " +
                         ", ".join(f"{i} ×{c}" for i, c in list(doubled.items())[:10]))
        if unknown:
            parts.append(f"{len(unknown)} id(s) not in {turns_path}: {', '.join(unknown[:10])}")
        raise MergeError("cannot merge: " + "; ".join(parts))
    # Rows are expanded and written again: a compact row continues the row before it in its
    # shard file, which is not the row before it in TURNS order.
    rows = RowAccess(paths, index, Profile)
    try:
        write_atomic(out_path, (rows.get(*where[tid][0]) for tid in expected))
    except ValueError as exc:
        raise MergeError(f"cannot merge: {exc}") from None
    finally:
        rows.close()
    docs = [json.loads(stats_path(p).read_text()) for p in shard_paths if stats_path(p).exists()]
    totals: Counter[str] = Counter()
    for d in docs:
        totals.update(d.get("totals", {}))
    doc = {"merged_from": [str(p) for p in shard_paths], "turns_file": str(turns_path),
           "totals": dict(totals), "outcomes": summarize_output(out_path),
           "settings": docs[0]["settings"] if docs else {}, "runs": []}
    stats_path(out_path).write_text(json.dumps(doc, indent=2))
    return doc
