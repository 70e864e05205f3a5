"""Engine options from the command line to a sampler: which flags go to which backend.

`pivotrl profile` collects them into `ProfileConfig.engine`; `build_sampler` hands each backend
only what it takes (an option for another backend is an error, not silently dropped: a typo on a
multi-GPU job should fail before the GPUs are taken).
"""

from __future__ import annotations

import json
from typing import Any

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
        raise ValueError(f"engine options {wrong} do not apply to --backend {backend}")
    return dict(engine)


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
