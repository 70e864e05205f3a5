"""Samplers: n completions per templated prompt, from transformers, vLLM or an OpenAI-compatible server."""

from __future__ import annotations

from typing import Any, Literal

from pivotrl.sampling.base import Completion, Sampler, SamplerError, SamplingParams
from pivotrl.io.seeds import derive_seed

__all__ = ["Completion", "Sampler", "SamplerError", "SamplingParams", "derive_seed", "get_sampler"]

Backend = Literal["hf", "vllm", "openai"]


def get_sampler(backend: Backend, model: Any, **kw: Any) -> Sampler:
    """Build a sampler. `model`: a HF model dir/name (hf, vllm), a loaded model (hf), or the served
    model name (openai; None asks the server). Keyword options are the backend's (see its class)."""
    if backend == "hf":
        from pivotrl.sampling.hf import HFSampler

        return HFSampler(model, **kw)
    if backend == "vllm":
        from pivotrl.sampling.vllm import VLLMSampler

        return VLLMSampler(model, **kw)
    if backend == "openai":
        from pivotrl.sampling.openai import OpenAISampler

        return OpenAISampler(model, **kw)
    raise ValueError(f"unknown sampler backend {backend!r}; known: hf, vllm, openai")
