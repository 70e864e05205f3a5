"""Profiling (PivotRL step 2), the loop: for each Turn, K samples from the frozen reference policy
(sampler), each parsed and scored by a verifier through the one scoring path (`pivotrl.scoring`),
summarised as a Profile record (docs/DESIGN.md): reward mean and population std.

Samples are reproducible and independent of how a run is cut: turn t's seed is derived from
(seed, t.id), and each backend derives sample j's seed from that (pivotrl.sampling.hf explains what
holds for batching). `pivotrl.profile.runs` puts this loop over files."""

from __future__ import annotations

import inspect
import statistics
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from pydantic import BaseModel, Field

from pivotrl.formats.actions import parse_completion
from pivotrl.formats.chat import prompt_text
from pivotrl.formats.families import PLAIN_TOKEN_BUDGET, is_thinking
from pivotrl.formats.options import FormatOptions
from pivotrl.io.records import Profile, Sample, Turn
from pivotrl.io.seeds import derive_seed
from pivotrl.io.turn_files import chunks
from pivotrl.sampling.base import Completion, SamplingParams
from pivotrl.sampling.options import EngineConfig, SamplingOptions
from pivotrl.sampling.pipeline import check_budget, prefetch, prompt_limit, split_too_long
from pivotrl.scoring import Parser, score_completions
from pivotrl.verifiers.base import Score
from pivotrl.verifiers.options import VerifierOptions


class TurnSampling(EngineConfig, SamplingOptions, VerifierOptions, FormatOptions):
    """What a verb that samples actions at turns and scores them needs (`pivotrl profile`,
    `pivotrl evaluate --turns`, `pivotrl compare`): the engine, the sampling, verifier and format
    blocks, a seed and a token budget. CLI flags and YAML keys."""

    seed: int = Field(0, description="Base seed; turn t samples with a seed derived from (seed, t.id).")
    max_new_tokens: int | None = Field(None, ge=1, description="Tokens per sample. None (ours): 4096 for a "
                                       "thinking model, else 256 (pivotrl.formats.families.token_budget); "
                                       "cut samples are counted as truncated.")
    chunk_turns: int = Field(64, ge=1, description="Turns per sampler call; the sampler sorts them "
                             "by length into batches, so larger chunks pad less (memory only, not "
                             "results).")

    def budget_source(self, tokenizer: Any) -> str:
        """Where the token budget comes from, as a user would change it."""
        if self.max_new_tokens is not None:
            return "set by max_new_tokens"
        thinking = is_thinking(tokenizer, self.chat_template_kwargs, self.response_format)
        return "the default for a thinking template" if thinking else "the default"

    def sampling(self, tokenizer: Any = None) -> SamplingParams:
        """Sampling parameters; an unset max_new_tokens is the model's budget (needs `tokenizer`)."""
        budget = self.max_new_tokens
        if budget is None:
            budget = self.token_budget(tokenizer) if tokenizer is not None else PLAIN_TOKEN_BUDGET
        return self.sampling_params(budget, self.seed)


class ProfileConfig(TurnSampling):
    """Options of a profiling run: `pivotrl profile --field value` flags and YAML keys
    (precedence: defaults < `--config` YAML < flags)."""

    k: int = Field(8, ge=1, description="Samples per turn (the paper profiles each candidate "
                   "with K samples of π0; 8 gives outcome rates in steps of 1/8).")
    shard: str | None = Field(None, description="'I/N': profile only turns with "
                              "hash(id) mod N == I (0-based).")
    resume: bool = Field(False, description="Continue an --out that holds profiles (a stopped run: same "
                         "settings, no turn lost or doubled).")
    overwrite: bool = Field(False, description="Delete an --out that holds profiles, and its stats, log and "
                            "rejects (a crashed run's too), first; without it or --resume such an --out is an error.")
    progress_seconds: float = Field(30.0, gt=0, description="Seconds between progress lines (stderr off "
                                    "a terminal, and PROFILE.log), also while one chunk is sampled.")


def turn_seed(seed: int, turn_id: str) -> int:
    return derive_seed("profile", seed, turn_id)


def score_samples(verifier, turns: Sequence[Turn], completions: Sequence[Sequence[Completion]],
                  parse: Parser = parse_completion) -> list[list[Sample]]:
    """Score every completion through the one scoring path (`pivotrl.scoring`)."""
    flat_turns = [turns[i] for i, comps in enumerate(completions) for _ in comps]
    flat = [c for comps in completions for c in comps]
    scores = iter(score_completions(verifier, flat_turns, [c.text for c in flat], parse))
    return [[_sample(c, next(scores)) for c in comps] for comps in completions]


def unverifiable(verifier, turn: Turn) -> str:
    """Why `verifier` cannot verify `turn` ("" when it can, or when it does not say: the
    optional `unverifiable(turn)` method of executable verifiers)."""
    check = getattr(verifier, "unverifiable", None)
    return str(check(turn) or "") if callable(check) else ""


# What the parsers add to a reason when a thinking block or analysis channel is left open: they
# read the text alone, so they cannot tell a sample cut at the budget from one that stopped there.
RAISE_BUDGET = "raise max_new_tokens"


def sample_reason(reason: str, finish_reason: str) -> str:
    """The parser's reason, told "cut" only when the sample was: a sample that ended with its stop
    token inside an open thinking block left it open itself, and a larger budget changes nothing."""
    if finish_reason == "length" or RAISE_BUDGET not in reason:
        return reason
    for hint in (f"; {RAISE_BUDGET}", f" ({RAISE_BUDGET})"):
        reason = reason.replace(hint, "")
    return reason.replace("cut inside", "ended inside") + " before the token budget (not cut)"


def _sample(c: Completion, s: Score) -> Sample:
    return Sample(completion=c.text, reward=s.reward, valid=s.valid,
                  reason=sample_reason(s.reason, c.finish_reason),
                  finish_reason=c.finish_reason, tokens=c.completion_tokens)


def make_profile(turn: Turn, samples: list[Sample], unverifiable: str = "") -> Profile:
    """The Profile record: reward mean and *population* std over the K samples, and why the
    turn cannot be verified when it cannot. It shares the turn's message objects (not copies):
    the writer sees they continue the previous row."""
    rewards = [s.reward for s in samples]
    mean = statistics.fmean(rewards) if rewards else 0.0
    std = statistics.pstdev(rewards) if len(rewards) > 1 else 0.0
    data = turn.model_dump(mode="json", exclude_none=True, exclude={"context", "expected"})
    data.update(context=turn.context, expected=turn.expected,
                k=len(samples), samples=[s.model_dump(mode="json") for s in samples],
                reward_mean=mean, reward_std=std, unverifiable=unverifiable or None)
    return Profile.model_validate(data)


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
    unverifiable_turns: int = Field(0, description="Turns the verifier cannot verify at all "
                                    "(its `unverifiable(turn)`): never pivots.")
    rejected_lines: int = Field(0, description="Bad lines of the Turn file (see the rejects file).")
    too_long: dict[str, int] = Field(default_factory=dict, description="Turns skipped because "
                                     "their prompt is longer than the engine takes (id: prompt "
                                     "tokens, or the fewest it can be for a prompt too long to "
                                     "tokenize); in the rejects file, and skipped again on resume.")
    wall_seconds: float = 0.0
    samples_per_second: float = 0.0


def checked_sampling(cfg: TurnSampling, sampler, tokenizer) -> SamplingParams:
    """The sampling parameters, their token budget checked against the engine's context
    (`check_budget`, the rule `train` applies too)."""
    params = cfg.sampling(tokenizer)
    limit = prompt_limit(sampler)  # the engine's context less the first new token's position
    check_budget(params.max_new_tokens, None if limit is None else limit + 1, "max_new_tokens")
    return params


# A thinking model may spend its whole budget on every sample. As reported on 2 CPU cores (hf
# backend, a tiny model with a Qwen3 thinking template, 78 turns): at the thinking default of 4096
# tokens no turn had finished after 10 min; at 96 tokens the run took 12 s. Above this budget (the
# plain default), a CPU run is told so.
CPU_THINKING_BUDGET = 256


def budget_notes(cfg: TurnSampling, sampler, tokenizer, samples_per_turn: int, verb: str,
                 source: str | None = None) -> list[str]:
    """What a verb says before it samples: its token budget and where it comes from (`source`,
    when the caller knows better than the config), and, for a thinking template whose budget will
    not finish in reasonable time on the hf backend on CPU, that it will not and how to set it.
    The budget is checked first (`checked_sampling`)."""
    budget, source = cfg.sampling(tokenizer).max_new_tokens, source or cfg.budget_source(tokenizer)
    try:
        checked_sampling(cfg, sampler, tokenizer)
    except ValueError as exc:
        raise ValueError(f"{exc} (the budget is {source}; --max-new-tokens sets it)") from None
    notes = [f"{verb}: token budget {budget} tokens per sample ({source}); {samples_per_turn} "
             f"sample(s) per turn"]
    on_cpu = getattr(sampler, "name", "") == "hf" and str(getattr(sampler, "device", "")).startswith("cpu")
    if on_cpu and budget > CPU_THINKING_BUDGET and is_thinking(tokenizer, cfg.chat_template_kwargs,
                                                                cfg.response_format):
        notes.append(f"warning: a thinking template may spend all {budget} tokens on every sample: up "
                     f"to {samples_per_turn * budget:,} tokens per turn, minutes per turn on the hf "
                     f"backend on CPU. Set --max-new-tokens (e.g. {CPU_THINKING_BUDGET}; cut samples "
                     "are counted as truncated) or sample on a GPU (--backend vllm).")
    return notes


def sample_and_score(turns: Iterable[Turn], sampler, verifier, tokenizer, cfg: TurnSampling, n: int,
                     seed_of: Callable[[int, str], int], parse: Parser | None = None,
                     too_long: dict[str, int] | None = None,
                     on_tokens: Callable[[int], Any] | None = None
                     ) -> Iterator[tuple[Turn, list[Completion], list[Sample]]]:
    """The one sample-then-score loop (profiling and evaluation): each turn's prompt in the
    model's own template, `n` actions sampled with the seed `seed_of(cfg.seed, turn.id)`, each
    scored through `pivotrl.scoring`; (turn, completions, samples) in order. A prompt longer than
    the engine takes is set aside into `too_long` (id → prompt tokens), not sampled.
    parse: the completion parser (default: the model's own format, `cfg.parser`). on_tokens(k):
    called as a sampler that reports its decoding steps (hf) draws k more tokens, from the
    sampling thread, so progress moves while a chunk is sampled."""
    params = checked_sampling(cfg, sampler, tokenizer)
    extra = {}
    if on_tokens is not None and "on_step" in inspect.signature(sampler.sample).parameters:
        extra["on_step"] = lambda step: on_tokens(int(step.active.sum()))
    parse = parse or cfg.parser(tokenizer)
    limit = prompt_limit(sampler)
    too_long = too_long if too_long is not None else {}

    def sample(chunk: list[Turn]) -> tuple[list[Turn], list[list[Completion]], dict[str, int]]:
        prompts = [prompt_text(tokenizer, t.context, t.tools, cfg.chat_template_kwargs) for t in chunk]
        fits, over = split_too_long(prompts, tokenizer, limit)
        skipped = {chunk[i].id: n_tokens for i, n_tokens in over.items()}
        chunk, prompts = [chunk[i] for i in fits], [prompts[i] for i in fits]
        seeds = [seed_of(cfg.seed, t.id) for t in chunk]
        return chunk, sampler.sample(prompts, n, params, seeds=seeds, **extra) if chunk else [], skipped

    # Chunk i+1 is sampled while chunk i is scored (pivotrl.sampling.pipeline).
    for chunk, completions, skipped in prefetch(sample, chunks(turns, cfg.chunk_turns)):
        too_long.update(skipped)  # by the caller's thread: its stats are saved there
        yield from zip(chunk, completions, score_samples(verifier, chunk, completions, parse))


def profile_stream(turns: Iterable[Turn], sampler, verifier, tokenizer, cfg: ProfileConfig,
                   stats: RunStats | None = None, parse: Parser | None = None,
                   on_tokens: Callable[[int], Any] | None = None) -> Iterator[Profile]:
    """Profiles of `turns` in order (the library core; `profile_file` adds files and resume).
    parse: the completion parser (default: the tokenizer's own format, `formats.parser_for`).
    on_tokens: `sample_and_score`'s."""
    stats = stats if stats is not None else RunStats()
    for turn, comps, row in sample_and_score(turns, sampler, verifier, tokenizer, cfg, cfg.k, turn_seed,
                                             parse, stats.too_long, on_tokens):
        stats.rollout_turns += len(comps)
        stats.generated_tokens += sum(c.completion_tokens for c in comps)
        stats.prompt_tokens += comps[0].prompt_tokens if comps else 0
        stats.invalid_samples += sum(not s.valid for s in row)
        stats.truncated_samples += sum(c.finish_reason == "length" for c in comps)
        stats.turns_profiled += 1
        why = unverifiable(verifier, turn)
        stats.unverifiable_turns += bool(why)
        yield make_profile(turn, row, why)
