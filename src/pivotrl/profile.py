"""Profiling (PivotRL step 2): K samples per turn from the frozen reference policy, each parsed and
scored by a verifier, summarised as a Profile record (docs/DESIGN.md): reward mean and std.

A run streams the Turn file, appends one Profile per line with a flush per record, and can be
killed at any moment: the same command resumes, skipping the ids already written (a torn last
line is repaired first). Samples are reproducible and independent of how the run was cut: turn
t's seed is derived from (--seed, t.id), and each backend derives sample j's seed from that
(pivotrl.sampling.hf explains what holds for batching). So a resumed run equals an uninterrupted
one, and shards (`--shard I/N`, by a stable hash of the id) merged equal an unsharded run.

Costs are counted: rollout turns (= samples generated, one model call each) and generated tokens,
in PROFILE.stats.json (one entry per run, and their totals).
"""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from pivotrl.formats.actions import parse_completion
from pivotrl.formats.chat import prompt_text
from pivotrl.formats.families import PLAIN_TOKEN_BUDGET, parser_for, token_budget
from pivotrl.io.outputs import output_lock
from pivotrl.io.records import (AppendWriter, Profile, Reject, Sample, Turn, done_ids, is_blank,
                             iter_lines, read_records, rejects_path, write_atomic,
                             write_text_atomic)
from pivotrl.sampling.base import Completion, SamplingParams
from pivotrl.io.seeds import derive_seed
from pivotrl.sampling.pipeline import prefetch, prompt_limit, split_too_long
from pivotrl.scoring import Parser, score_completions
from pivotrl.io.turn_files import (RowAccess, index_rows, read_turns, scan_turns,  # noqa: F401 (API)
                             shard_of)
from pivotrl.verifiers.base import Score

# A shaped reward counts as a success from here (docs/DESIGN.md pitfall). The toolcall verifier's
# partial_credit pays matched / expert calls for a subset of the expert's calls, so with it on,
# half of a turn's calls reaches this threshold (its config says so next to the option).
SUCCESS_THRESHOLD = 0.5


class ProfileConfig(BaseModel):
    """Options of a profiling run (CLI flags and configs/profile.yaml keys)."""

    k: int = Field(8, ge=1, description="Samples per turn (the paper profiles each candidate "
                   "with K samples of π0; 8 gives outcome rates in steps of 1/8).")
    verifier: str = Field("toolcall", description="Verifier name (pivotrl.verifiers registry).")
    verifier_config: dict[str, Any] = Field(default_factory=dict,
                                            description="The verifier's options (its YAML keys).")
    seed: int = Field(0, description="Base seed; turn t samples with seed derive(seed, t.id).")
    max_new_tokens: int | None = Field(None, ge=1, description="Tokens per sample. None (ours): 4096 for a "
                                       "thinking model, else 256 (pivotrl.formats.families.token_budget); cut samples "
                                       "are counted in truncated_samples.")
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict, description="Extra chat-template "
                                                 "variables (e.g. enable_thinking: false); training must use "
                                                 "the same ones (ours: none).")
    response_format: str | None = Field(None, description="Tool-call format of the completions (hermes, "
                                        "qwen-xml, glm, deepseek, harmony, response-template); None: "
                                        "detected from the chat template (pivotrl.formats.families).")
    temperature: float = Field(1.0, ge=0.0, description="1.0: sample π0 itself (SamplingParams).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus mass (1.0 = off).")
    chunk_turns: int = Field(64, ge=1, description="Turns per sampler call; the sampler sorts them "
                             "by length into batches, so larger chunks pad less (records of a "
                             "chunk are written when it is done).")
    shard: str | None = Field(None, description="'I/N': profile only turns with "
                              "hash(id) mod N == I (0-based).")
    engine: dict[str, Any] = Field(default_factory=dict, description="Options of the sampling "
                                   "backend: vllm, pivotrl.sampling.vllm.VLLMOptions "
                                   "(tensor_parallel_size, max_model_len, gpu_memory_utilization, "
                                   "dtype, enable_prefix_caching, extra); openai, headers, "
                                   "extra_body, api_key_env. They change speed, not samples, so a "
                                   "resume may change them.")

    def sampling(self, tokenizer: Any = None) -> SamplingParams:
        """Sampling parameters; an unset max_new_tokens is the model's budget (needs `tokenizer`)."""
        budget = self.max_new_tokens
        if budget is None:
            budget = (token_budget(tokenizer, self.chat_template_kwargs, self.response_format)
                      if tokenizer is not None else PLAIN_TOKEN_BUDGET)
        return SamplingParams(max_new_tokens=budget, temperature=self.temperature,
                              top_p=self.top_p, seed=self.seed)


# ---------------------------------------------------------------- seeds and shards


def turn_seed(seed: int, turn_id: str) -> int:
    return derive_seed("profile", seed, turn_id)


def parse_shard(spec: str | None) -> tuple[int, int] | None:
    if spec is None:
        return None
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError:
        raise ValueError(f"--shard must be I/N (e.g. 0/4), got {spec!r}") from None
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"--shard {spec!r}: need 0 ≤ I < N")
    return i, n


# ---------------------------------------------------------------- pure pieces


def score_samples(verifier, turns: Sequence[Turn], completions: Sequence[Sequence[Completion]],
                  parse: Parser = parse_completion) -> list[list[Sample]]:
    """Score every completion through the one scoring path (`pivotrl.scoring`)."""
    flat_turns = [turns[i] for i, comps in enumerate(completions) for _ in comps]
    flat = [c for comps in completions for c in comps]
    scores = iter(score_completions(verifier, flat_turns, [c.text for c in flat], parse))
    return [[_sample(c, next(scores)) for c in comps] for comps in completions]


def _sample(c: Completion, s: Score) -> Sample:
    return Sample(completion=c.text, reward=s.reward, valid=s.valid, reason=s.reason,
                  finish_reason=c.finish_reason, tokens=c.completion_tokens)


def make_profile(turn: Turn, samples: list[Sample]) -> Profile:
    """The Profile record: reward mean and *population* std over the K samples. It shares the
    turn's message objects (not copies): the writer sees they continue the previous row."""
    rewards = [s.reward for s in samples]
    mean = statistics.fmean(rewards) if rewards else 0.0
    std = statistics.pstdev(rewards) if len(rewards) > 1 else 0.0
    data = turn.model_dump(mode="json", exclude_none=True, exclude={"context", "expected"})
    data.update(context=turn.context, expected=turn.expected,
                k=len(samples), samples=[s.model_dump(mode="json") for s in samples],
                reward_mean=mean, reward_std=std)
    return Profile.model_validate(data)


def outcome(rewards: Iterable[float], threshold: float = SUCCESS_THRESHOLD) -> str:
    """all_fail / all_pass / mixed on the BINARY outcome (reward ≥ threshold is a success)."""
    wins = [r >= threshold for r in rewards]
    if not wins:
        return "empty"
    return "all_pass" if all(wins) else "all_fail" if not any(wins) else "mixed"


# ---------------------------------------------------------------- the run


class RunStats(BaseModel):
    """What one run did and spent (PROFILE.stats.json keeps one per run, plus their sum)."""

    turns_selected: int = Field(0, description="Valid turns of this shard (or the whole file).")
    turns_done_before: int = Field(0, description="Already in the output when the run started.")
    turns_profiled: int = Field(0, description="Profiles written by this run.")
    rollout_turns: int = Field(0, description="Samples generated (one model turn each).")
    generated_tokens: int = Field(0, description="Completion tokens generated.")
    prompt_tokens: int = Field(0, description="Prompt tokens read (once per turn).")
    invalid_samples: int = Field(0, description="Unparseable or unusable samples (reward 0).")
    truncated_samples: int = Field(0, description="Samples cut at max_new_tokens.")
    rejected_lines: int = Field(0, description="Bad lines of the Turn file (see the rejects file).")
    too_long: dict[str, int] = Field(default_factory=dict, description="Turns skipped because "
                                     "their prompt is longer than the engine takes (id: prompt "
                                     "tokens); in the rejects file, and skipped again on resume.")
    wall_seconds: float = 0.0
    samples_per_second: float = 0.0


def chunks(items: Iterable[Turn], size: int) -> Iterator[list[Turn]]:
    """Consecutive lists of `size` turns (the last may be shorter), read lazily."""
    chunk: list[Turn] = []
    for it in items:
        chunk.append(it)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def profile_stream(turns: Iterable[Turn], sampler, verifier, tokenizer, cfg: ProfileConfig,
                   stats: RunStats | None = None, parse: Parser | None = None) -> Iterator[Profile]:
    """Profiles of `turns` in order (the library core; `profile_file` adds files and resume).
    parse: the completion parser (default: the tokenizer's own format, `formats.parser_for`)."""
    params = cfg.sampling(tokenizer)
    parse = parse or parser_for(tokenizer, cfg.response_format, cfg.chat_template_kwargs)
    stats = stats if stats is not None else RunStats()
    limit = prompt_limit(sampler)

    def sample(chunk: list[Turn]) -> tuple[list[Turn], list[list[Completion]], dict[str, int]]:
        prompts = [prompt_text(tokenizer, t.context, t.tools, cfg.chat_template_kwargs) for t in chunk]
        fits, too_long = split_too_long(prompts, tokenizer, limit)
        # set aside and reported (by the caller's thread: stats is saved there), not a failed chunk
        skipped = {chunk[i].id: n for i, n in too_long.items()}
        chunk, prompts = [chunk[i] for i in fits], [prompts[i] for i in fits]
        seeds = [turn_seed(cfg.seed, t.id) for t in chunk]
        return chunk, sampler.sample(prompts, cfg.k, params, seeds=seeds) if chunk else [], skipped

    # Chunk i+1 is sampled while chunk i is scored (pivotrl.sampling.pipeline).
    for chunk, completions, skipped in prefetch(sample, chunks(turns, cfg.chunk_turns)):
        stats.too_long.update(skipped)
        samples = score_samples(verifier, chunk, completions, parse)
        for turn, comps, row in zip(chunk, completions, samples):
            stats.rollout_turns += len(comps)
            stats.generated_tokens += sum(c.completion_tokens for c in comps)
            stats.prompt_tokens += comps[0].prompt_tokens if comps else 0
            stats.invalid_samples += sum(not s.valid for s in row)
            stats.truncated_samples += sum(c.finish_reason == "length" for c in comps)
            stats.turns_profiled += 1
            yield make_profile(turn, row)


def stats_path(out: str | Path) -> Path:
    """`profile.jsonl` → `profile.stats.json`, next to the output."""
    out = Path(out)
    stem = out.name[: -len(".jsonl")] if out.name.endswith(".jsonl") else out.name
    return out.with_name(f"{stem}.stats.json")


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
    n = samples = invalid = 0
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
    return {"turns": n, "samples": samples, "invalid_samples": invalid,
            "all_fail": counts["all_fail"], "all_pass": counts["all_pass"], "mixed": counts["mixed"],
            "success_threshold": threshold}


def profile_file(turns_path: str | Path, out_path: str | Path, sampler, verifier, tokenizer,
                 cfg: ProfileConfig, *, model_name: str = "", progress: bool = True,
                 console=None) -> dict[str, Any]:
    """Profile a Turn file into an append-only Profile file (resumable); returns the stats dict
    also written to PROFILE.stats.json. One run per output at a time: a second run on the same
    `out_path` fails with OutputLockedError (a ValueError) instead of writing every turn twice."""
    with output_lock(out_path):
        return _profile_locked(turns_path, out_path, sampler, verifier, tokenizer, cfg,
                               model_name=model_name, progress=progress, console=console)


def _profile_locked(turns_path: str | Path, out_path: str | Path, sampler, verifier, tokenizer,
                    cfg: ProfileConfig, *, model_name: str = "", progress: bool = True,
                    console=None) -> dict[str, Any]:
    t0 = time.perf_counter()
    shard = parse_shard(cfg.shard)
    out_path, spath = Path(out_path), stats_path(out_path)
    identity = _identity(cfg, model_name, getattr(sampler, "name", "?"))
    previous = json.loads(spath.read_text()) if spath.exists() else None
    if previous and Path(out_path).exists():
        changed = {k: (previous["settings"].get(k), v) for k, v in identity.items()
                   if previous["settings"].get(k) != v}
        if changed:
            raise ValueError(f"{out_path} was written with other settings {changed} "
                             "(old, new); resume with the same command or write a new --out")
    # Two passes: ids and line numbers first (each turn dropped as read), then the turns to do,
    # streamed into the sampler, so a run holds about one chunk of turns, not its whole shard.
    lines: dict[str, int] = {}  # valid turn id -> line, in file order
    rejects: list[Reject] = []
    for lineno, rec in scan_turns(turns_path, shard):
        if isinstance(rec, Reject):
            rejects.append(rec)
        else:
            lines[rec.id] = lineno
    if rejects:
        write_atomic(rejects_path(out_path), [r.to_json() for r in rejects])
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
                "invalid_samples", "truncated_samples", "wall_seconds")
        doc = {"settings": identity, "turns_file": str(turns_path),
               "totals": {k: sum(r.get(k, 0) for r in all_runs) for k in keys},
               "outcomes": summarize_output(out_path) if final else None, "runs": all_runs}
        write_text_atomic(spath, json.dumps(doc, indent=2))
        return doc

    bar = _progress(console) if progress else None
    save(final=False)
    try:
        with AppendWriter(out_path) as writer:
            if bar is not None:
                bar.start()
                task = bar.add_task("profiling", total=len(lines), completed=len(lines) - n_todo,
                                    rate="")
            for i, rec in enumerate(profile_stream(todo, sampler, verifier, tokenizer, cfg, stats)):
                writer.write(rec)
                if (i + 1) % cfg.chunk_turns == 0:
                    save(final=False)
                if bar is not None:
                    rate = stats.rollout_turns / max(time.perf_counter() - t0, 1e-9)
                    bar.update(task, advance=1, rate=f"{rate:,.1f} samples/s")
    finally:
        if bar is not None:
            bar.stop()
        doc = save(final=True)
    if stats.too_long:  # nothing lost: what the engine cannot take is listed with the reason
        write_atomic(rejects_path(out_path), [r.to_json() for r in rejects] + [
            Reject(str(turns_path), lines.get(tid, 0), f"prompt of {n} tokens is longer than the "
                   f"engine takes ({prompt_limit(sampler)}); raise max_model_len", "context").to_json()
            for tid, n in stats.too_long.items()])
    return doc


def _progress(console):
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("turns · {task.fields[rate]}"), TimeElapsedColumn(),
                    TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=False)


# ---------------------------------------------------------------- shards


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


# ---------------------------------------------------------------- re-profiling


def reprofile(pivots: Sequence[Turn], sampler, verifier, tokenizer, k: int = 8,
              params: SamplingParams | None = None, seed: int = 0,
              threshold: float = SUCCESS_THRESHOLD, chat_template_kwargs: dict[str, Any] | None = None,
              response_format: str | None = None) -> tuple[list[Profile], dict[str, int]]:
    """Re-profile pivots with the *current* policy (`sampler`) and drop those that became all-pass
    (they no longer teach anything: zero variance). Returns (kept, refreshed Profiles; counts)."""
    params = params or SamplingParams()
    cfg = ProfileConfig(k=k, seed=seed, max_new_tokens=params.max_new_tokens,
                        temperature=params.temperature, top_p=params.top_p,
                        chat_template_kwargs=chat_template_kwargs or {}, response_format=response_format)
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

    verifier: a name (built with `verifier_config`) or a verifier object. Sampling: `params`
    (SamplingParams or a dict of its fields) or the plain keywords max_new_tokens / temperature /
    top_p, so a YAML config can hold every option.
    """

    def __init__(self, threshold: float = 0.9, every_n_steps: int = 50, verifier: Any = "toolcall",
                 verifier_config: dict[str, Any] | None = None, k: int = 8,
                 params: SamplingParams | dict[str, Any] | None = None, seed: int = 0,
                 batch_size: int = 64, max_new_tokens: int | None = None,
                 temperature: float | None = None, top_p: float | None = None,
                 chat_template_kwargs: dict[str, Any] | None = None, response_format: str | None = None):
        if isinstance(verifier, str):
            from pivotrl.verifiers import get_verifier

            verifier = get_verifier(verifier, **(verifier_config or {}))
        self.verifier = verifier
        self.threshold, self.every_n_steps, self.k = threshold, every_n_steps, k
        base = params.model_dump() if isinstance(params, SamplingParams) else dict(params or {})
        base.update({key: val for key, val in (("max_new_tokens", max_new_tokens),
                                               ("temperature", temperature), ("top_p", top_p))
                     if val is not None})
        self.params = SamplingParams(**base)
        self.seed, self.batch_size = seed, batch_size
        self.chat_template_kwargs, self.response_format = chat_template_kwargs or {}, response_format
        self.step = 0
        self.last_run: int | None = None
        self.history: list[dict[str, int]] = []

    def should_run(self, batch_reward_mean: float, step: int | None = None) -> bool:
        """`step`: the trainer's global step (default: count the calls)."""
        self.step = self.step + 1 if step is None else int(step)
        due = self.last_run is None or self.step - self.last_run >= self.every_n_steps
        return bool(due and batch_reward_mean >= self.threshold)

    def run(self, model, tokenizer, pivots: Sequence[Turn]) -> list[Profile]:
        """Re-profile with `model` as it is now (eval mode during sampling, mode restored)."""
        from pivotrl.sampling.hf import HFSampler

        self.last_run = self.step
        sampler = HFSampler(model, tokenizer=tokenizer, batch_size=self.batch_size)
        kept, counts = reprofile(pivots, sampler, self.verifier, tokenizer, self.k, self.params,
                                 seed=derive_seed(self.seed, self.step),
                                 chat_template_kwargs=self.chat_template_kwargs,
                                 response_format=self.response_format)
        self.history.append({"step": self.step, **counts})
        return kept
