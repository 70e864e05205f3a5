"""Engine options from the command line to a sampler: which flags go to which backend.

`EngineConfig` holds the choice of engine and its options for every verb that samples
(`pivotrl profile`'s ProfileConfig, `pivotrl evaluate --turns` and `pivotrl compare`'s
TurnEvalConfig); `build_sampler` hands each backend only what it takes (an option for another
backend is an error, not silently dropped: a typo on a multi-GPU job should fail before the GPUs
are taken).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, Field

from pivotrl.io.yaml_config import YamlConfig
from pivotrl.sampling.base import SamplingParams

OPENAI_ENGINE_KEYS = ("headers", "extra_body", "api_key_env")


def engine_flags(*, header: list[str] | None = None, extra_body: str | None = None,
                 **flags: Any) -> dict[str, Any]:
    """Flags given on the command line as `ProfileConfig.engine` keys (None: not given).
    header: 'Name: value' strings; extra_body: a JSON object. Raises ValueError when malformed."""
    out = {key: val for key, val in flags.items() if val is not None}
    if header:
        pairs = [h.split(":", 1) for h in header]
        if any(len(p) != 2 or not p[0].strip() for p in pairs):
            raise ValueError(f"--header must be 'Name: value', got {header}")
        out["headers"] = {name.strip(): value.strip() for name, value in pairs}
    if extra_body is not None:
        body = json.loads(extra_body)  # a JSONDecodeError is a ValueError
        if not isinstance(body, dict):
            raise ValueError("--extra-body must be a JSON object")
        out["extra_body"] = body
    return out


def backend_options(backend: str, engine: dict[str, Any]) -> dict[str, Any]:
    """The engine options `backend` takes (hf: none; openai: OPENAI_ENGINE_KEYS; vllm: the
    rest, checked by VLLMOptions); any other is a ValueError."""
    if backend == "openai":
        wrong = sorted(set(engine) - set(OPENAI_ENGINE_KEYS))
    elif backend == "hf":
        wrong = sorted(engine)
    else:
        wrong = sorted(set(engine) & set(OPENAI_ENGINE_KEYS))
    if wrong:
        takes = {"hf": "none: its context is the model's own", "openai": ", ".join(OPENAI_ENGINE_KEYS)}
        raise ValueError(f"engine options {wrong} do not apply to --backend {backend} (it takes "
                         f"{takes.get(backend, 'the vllm options: pivotrl.sampling.vllm.VLLMOptions')}): "
                         "drop them, or choose the backend they belong to")
    return dict(engine)


# EngineConfig fields only one backend reads: given for another, the run would ignore them.
BACKEND_OF_FIELD = {"batch_size": "hf", "concurrency": "openai", "base_url": "openai",
                    "served_model_name": "openai"}


def check_backend_flags(backend: str, given: dict[str, Any]) -> None:
    """Refuse a flag `backend` would ignore (`given`: the flags on the command line, by field;
    `engine`: the engine options): --batch-size off hf, --concurrency / --base-url /
    --served-model-name off openai, an engine option of another backend (`backend_options`).
    Checked before anything loads, so a dry run refuses them too. ValueError naming the flag."""
    for name in sorted(set(given) & set(BACKEND_OF_FIELD)):
        owner = BACKEND_OF_FIELD[name]
        if given[name] is not None and owner != backend:
            raise ValueError(f"--{name.replace('_', '-')} is an option of --backend {owner}, and "
                             f"--backend {backend} ignores it: drop it, or use --backend {owner}")
    backend_options(backend, given.get("engine") or {})


def build_sampler(backend: str, model: str, engine: dict[str, Any], *, base_url: str,
                  served_model_name: str | None, concurrency: int, batch_size: int):
    """(sampler, tokenizer) for `pivotrl profile`: the openai backend templates prompts with the
    tokenizer of `model` (the server only sees text); the others bring their own."""
    from pivotrl.sampling import get_sampler

    if backend == "openai":
        from transformers import AutoTokenizer

        sampler = get_sampler("openai", served_model_name, base_url=base_url,
                              concurrency=concurrency, **backend_options("openai", engine))
        return sampler, AutoTokenizer.from_pretrained(model)
    extra = {"batch_size": batch_size} if backend == "hf" else {}
    sampler = get_sampler(backend, model, **extra, **backend_options(backend, engine))
    return sampler, sampler.tokenizer


class EngineConfig(YamlConfig):
    """Which engine writes the samples, and its options (CLI flags and YAML keys)."""

    backend: Literal["hf", "vllm", "openai"] = Field("hf", description="Sampler: hf (transformers "
                                                    "generate, CPU or one GPU), vllm (offline engine), "
                                                    "openai (any OpenAI-compatible server).")
    base_url: str = Field("http://127.0.0.1:8000/v1", description="openai backend: the server's URL (…/v1).")
    served_model_name: str | None = Field(None, description="openai backend: the model name on the server "
                                          "(None: ask the server).")
    batch_size: int = Field(64, ge=1, description="hf backend: sequences per generate call.")
    concurrency: int = Field(16, ge=1, description="openai backend: requests in flight.")
    engine: dict[str, Any] = Field(default_factory=dict, description="Options of the sampling "
                                   "backend: vllm, pivotrl.sampling.vllm.VLLMOptions "
                                   "(tensor_parallel_size, max_model_len, gpu_memory_utilization, "
                                   "dtype, enable_prefix_caching, extra); openai, headers, "
                                   "extra_body, api_key_env. They change speed, not samples, so a "
                                   "resume may change them.")

    def build_sampler(self, model: str):
        """(sampler, tokenizer) for `model` (a model dir; the openai backend reads only its tokenizer)."""
        return build_sampler(self.backend, model, self.engine, base_url=self.base_url,
                             served_model_name=self.served_model_name, concurrency=self.concurrency,
                             batch_size=self.batch_size)


class SamplingOptions(BaseModel):
    """How actions are drawn from the policy, for every stage that samples (profile, evaluate, the
    GRPO rollouts, the E2E baseline): declared once here and embedded in each stage's config."""

    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature: 1.0 samples the policy "
                               "itself (paper, TRL); 0 is greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus mass (1.0 = off; TRL: 1.0).")

    def sampling_options(self) -> dict[str, Any]:
        """These fields as keyword arguments of another config (one config feeds the next)."""
        return {name: getattr(self, name) for name in SamplingOptions.model_fields}

    def sampling_params(self, max_new_tokens: int, seed: int) -> SamplingParams:
        return SamplingParams(max_new_tokens=max_new_tokens, temperature=self.temperature,
                              top_p=self.top_p, seed=seed)
