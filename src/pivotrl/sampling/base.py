"""The sampler protocol: `sample(prompts, n, params) -> n completions per prompt`, with token counts.

Prompts are already-templated text (`pivotrl.formats.chat.prompt_text`), so every backend sees exactly
the string training will see. Backends: `hf` (transformers generate), `vllm` (offline engine),
`openai` (any OpenAI-compatible server: `vllm serve`, SGLang, `pivotrl serve`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel, Field

from pivotrl.io.seeds import derive_seed


class SamplingParams(BaseModel):
    """How each completion is sampled. Defaults follow the OpenAI/vLLM APIs (temperature 1, top-p 1:
    sampling from the policy itself, which is what profiling π0 means)."""

    max_new_tokens: int = Field(256, ge=1, description="Most tokens generated per completion "
                                "(one tool call of the testbed fits in ~100; real agents need more).")
    temperature: float = Field(1.0, ge=0.0, description="Softmax temperature; 0 means greedy "
                               "(1.0 = the policy's own distribution, as GRPO samples it).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass (1.0 = off).")
    seed: int | None = Field(None, description="Base seed; a sampler derives one seed per prompt and "
                             "sample from it (None: nondeterministic).")


@dataclass(frozen=True)
class Completion:
    text: str  # decoded without special tokens (the end-of-turn token is not in the text)
    prompt_tokens: int
    completion_tokens: int  # generated tokens, the end token included when one was generated
    finish_reason: str  # "stop" (end token) or "length" (max_new_tokens reached)


class Sampler(Protocol):
    """`seeds`, when given, is one seed per prompt: sample j of prompt i is then a function of
    (prompt i, seeds[i], j) only (see each backend for how exactly that holds)."""

    name: str

    def sample(self, prompts: list[str], n: int, params: SamplingParams,
               seeds: list[int] | None = None) -> list[list[Completion]]:
        ...


class SamplerError(RuntimeError):
    """A backend could not produce completions (unreachable server, missing extra, ...)."""


def prompt_seeds(params: SamplingParams, n_prompts: int, seeds: list[int] | None) -> list[int | None]:
    """Per-prompt seeds: the caller's, else derived from params.seed and the prompt's position."""
    if seeds is not None:
        if len(seeds) != n_prompts:
            raise ValueError(f"got {len(seeds)} seeds for {n_prompts} prompts")
        return list(seeds)
    if params.seed is None:
        return [None] * n_prompts
    return [derive_seed(params.seed, i) for i in range(n_prompts)]
