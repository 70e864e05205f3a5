"""`pivotrl serve`: a small OpenAI-compatible endpoint around a local HF model (FastAPI + uvicorn).

Endpoints: `GET /v1/models`, `POST /v1/completions` (prompt text or a list of them),
`POST /v1/chat/completions` (messages + tools, templated with the model's own chat template;
tool calls in the completion are returned as OpenAI `tool_calls`). Request fields honoured:
`n`, `max_tokens` (default 256), `temperature`, `top_p`, `seed`, `stop`.

It lets users profile (`pivotrl profile --backend openai`) or judge with a local model on a CPU.
Generation goes through the `hf` sampler, one request at a time, so for a given `seed` a prompt's
samples are the ones `--backend hf` draws in-process for that seed. For throughput on GPUs use
`vllm serve`; this server is for small models and tests.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from typing import Any

from pydantic import BaseModel, Field

from pivotrl.records import Message

DEFAULT_MAX_TOKENS = 256
MAX_N = 128


class _Common(BaseModel):
    model: str | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None


class CompletionRequest(_Common):
    prompt: str | list[str]


class ChatRequest(_Common):
    messages: list[Message]
    tools: list[dict[str, Any]] | None = None


def _apply_stop(text: str, stop: str | list[str] | None) -> tuple[str, bool]:
    stops = [stop] if isinstance(stop, str) else (stop or [])
    cut = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def create_app(model_dir: str, batch_size: int = 64, served_name: str | None = None):
    from fastapi import FastAPI, HTTPException

    from pivotrl.actions import parse_completion
    from pivotrl.chat import prompt_text
    from pivotrl.sampling.base import SamplingParams, derive_seed
    from pivotrl.sampling.hf import HFSampler

    sampler = HFSampler(model_dir, batch_size=batch_size)
    name = served_name or str(model_dir)
    lock = threading.Lock()  # one generate at a time: the model is not re-entrant on CPU
    app = FastAPI(title="pivotrl serve", version="1")

    def generate(prompts: list[str], req: _Common):
        params = SamplingParams(max_new_tokens=req.max_tokens or DEFAULT_MAX_TOKENS,
                                temperature=req.temperature, top_p=req.top_p)
        base = req.seed if req.seed is not None else random.getrandbits(62)
        # A single prompt samples with the request's seed itself (= hf backend with that seed).
        seeds = [base] if len(prompts) == 1 else [derive_seed(base, i) for i in range(len(prompts))]
        with lock:
            return sampler.sample(prompts, req.n, params, seeds=seeds)

    def usage(results) -> dict[str, int]:
        prompt = sum(r[0].prompt_tokens for r in results if r)
        completion = sum(c.completion_tokens for r in results for c in r)
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                            "owned_by": "pivotrl"}]}

    @app.post("/v1/completions")
    def completions(req: CompletionRequest) -> dict[str, Any]:
        prompts = [req.prompt] if isinstance(req.prompt, str) else list(req.prompt)
        if not prompts:
            raise HTTPException(400, "prompt is empty")
        results = generate(prompts, req)
        choices = []
        for i, comps in enumerate(results):
            for j, c in enumerate(comps):
                text, stopped = _apply_stop(c.text, req.stop)
                choices.append({"index": i * req.n + j, "text": text, "logprobs": None,
                                "finish_reason": "stop" if stopped else c.finish_reason})
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                "created": int(time.time()), "model": name, "choices": choices,
                "usage": usage(results)}

    @app.post("/v1/chat/completions")
    def chat(req: ChatRequest) -> dict[str, Any]:
        try:
            prompt = prompt_text(sampler.tokenizer, req.messages, req.tools)
        except Exception as exc:  # noqa: BLE001 - a template error is the client's input
            raise HTTPException(400, f"chat template failed: {exc}") from None
        results = generate([prompt], req)
        choices = []
        for j, c in enumerate(results[0]):
            text, stopped = _apply_stop(c.text, req.stop)
            parsed = parse_completion(text)
            message: dict[str, Any] = {"role": "assistant", "content": text}
            reason = "stop" if stopped else c.finish_reason
            if parsed.valid and parsed.message.tool_calls:
                message = {"role": "assistant", "content": parsed.message.content,
                           "tool_calls": [tc.model_dump(mode="json")
                                          for tc in parsed.message.tool_calls]}
                reason = "tool_calls"
            choices.append({"index": j, "message": message, "finish_reason": reason,
                            "logprobs": None})
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
                "created": int(time.time()), "model": name, "choices": choices,
                "usage": usage(results)}

    return app


def serve(model_dir: str, host: str = "127.0.0.1", port: int = 8000, batch_size: int = 64,
          served_name: str | None = None, log_level: str = "warning") -> None:
    import uvicorn

    uvicorn.run(create_app(model_dir, batch_size, served_name), host=host, port=port,
                log_level=log_level)
