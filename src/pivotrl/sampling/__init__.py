"""Samplers: n completions per templated prompt, from transformers, vLLM or an OpenAI-compatible server."""

from pivotrl.sampling.base import (Completion, Sampler, SamplerError, SamplingParams, derive_seed,
                                   get_sampler)

__all__ = ["Completion", "Sampler", "SamplerError", "SamplingParams", "derive_seed", "get_sampler"]
