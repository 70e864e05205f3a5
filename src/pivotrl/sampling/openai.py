"""The `openai` backend: any OpenAI-compatible server (`vllm serve`, SGLang, `pivotrl serve`).

It uses `/v1/completions` with the prompt text, since prompts are already templated (a chat
endpoint would template them a second time, perhaps differently from training). One request per
prompt with `n` samples, many requests in flight (a thread pool over one client). HTTP is the
official `openai` client's: its `max_retries` (connection errors, timeouts, 408, 409, 429, 5xx,
exponential backoff with jitter from 0.5 s to 8 s, honouring `Retry-After`), `default_headers`
and `extra_body`; no retry loop of our own.

Token counts: `usage.prompt_tokens` is the prompt's; `usage.completion_tokens` is the total over
the n choices, split evenly among them (the API gives no per-choice count), so totals are exact.

Authentication: the API key is read from an environment variable (OPENAI_API_KEY unless
`api_key_env` names another), never from the command line, where `ps` would show it. `headers`
go with every request (e.g. a gateway's routing header); `extra_body` is merged into every
request body (e.g. vLLM's `top_k`, `min_p`, `add_special_tokens`).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pivotrl.sampling.base import Completion, SamplerError, SamplingParams, prompt_seeds


class OpenAISampler:
    """model: the served model name (None: the first one the server lists at /v1/models).
    base_url: up to and including `/v1`. concurrency: requests in flight. max_retries: tries after
    the first one (the `openai` client's backoff). extra_body: fields added to every request,
    e.g. {"add_special_tokens": False} for `vllm serve` with a template that already writes the
    BOS token (vLLM otherwise adds a second one)."""

    name = "openai"

    def __init__(self, model: str | None = None, base_url: str = "http://127.0.0.1:8000/v1",
                 api_key: str | None = None, concurrency: int = 16, timeout: float = 300.0,
                 max_retries: int = 5, batch_size: int | None = None,
                 extra_body: dict[str, Any] | None = None, headers: dict[str, str] | None = None,
                 api_key_env: str | None = None):
        import httpx
        import openai

        del batch_size  # the server batches; concurrency is the knob here
        self.base_url = base_url.rstrip("/")
        self.concurrency = max(1, int(concurrency))
        self.extra_body = dict(extra_body or {})
        if api_key is None and api_key_env is not None and api_key_env not in os.environ:
            raise SamplerError(f"api_key_env: environment variable {api_key_env} is not set")
        key = api_key or os.environ.get(api_key_env or "OPENAI_API_KEY") or "EMPTY"
        self.client = openai.OpenAI(
            base_url=self.base_url, api_key=key, timeout=timeout,
            max_retries=max(0, int(max_retries)), default_headers=headers or None,
            # one pool for the thread pool's requests: as many keep-alive connections as in flight
            http_client=httpx.Client(limits=httpx.Limits(
                max_connections=self.concurrency, max_keepalive_connections=self.concurrency)))
        self.max_model_len: int | None = None
        self.model = model or self._first_model()
        if self.max_model_len is None and model is not None:
            self._read_model_card(model)

    def _call(self, what: str, fn):
        """`fn()` with the client's errors as SamplerErrors naming the server."""
        import openai

        url = f"{self.base_url}{what}"
        try:
            return fn()
        except openai.APIStatusError as exc:
            raise SamplerError(f"{url} answered HTTP {exc.status_code} (after "
                               f"{self.client.max_retries} retries where retryable): "
                               f"{str(exc.message)[:500]}") from None
        except openai.APIConnectionError as exc:  # refused, reset, timed out
            raise SamplerError(f"OpenAI-compatible server at {self.base_url} is unreachable "
                               f"({self.client.max_retries + 1} tries; last error: {exc}). Is it "
                               "running? Check --base-url.") from None
        except openai.APIResponseValidationError as exc:
            raise SamplerError(f"{url} answered something that is not an OpenAI response: "
                               f"{exc}") from None

    def _cards(self) -> list[dict[str, Any]]:
        page = self._call("/models", lambda: self.client.models.list())
        return [card.model_dump() for card in page.data]

    def _first_model(self) -> str:
        data = self._cards()
        if not data or not data[0].get("id"):
            raise SamplerError(f"{self.base_url}/models lists no model; pass the model name")
        self._card_length(data[0])
        return str(data[0]["id"])

    def _read_model_card(self, model: str) -> None:
        """max_model_len from /models when the server lists it (vLLM and pivotrl serve do);
        a server without /models still samples."""
        try:
            data = self._cards()
        except SamplerError:
            return
        for card in data:
            if card.get("id") == model:
                self._card_length(card)

    def _card_length(self, card: dict[str, Any]) -> None:
        length = card.get("max_model_len")
        self.max_model_len = length if isinstance(length, int) and length > 0 else None

    def max_prompt_tokens(self) -> int | None:
        """Longest prompt the server accepts (from its model card), or None when unknown."""
        return None if self.max_model_len is None else self.max_model_len - 1

    # ------------------------------------------------------------ sampling

    def _one(self, prompt: str, n: int, params: SamplingParams, seed: int | None) -> list[Completion]:
        body: dict[str, Any] = {"model": self.model, "prompt": prompt, "n": n,
                                "max_tokens": params.max_new_tokens,
                                "temperature": params.temperature, "top_p": params.top_p}
        if seed is not None:
            body["seed"] = seed
        raw = self._call("/completions", lambda: self.client.completions.with_raw_response.create(
            **body, extra_body=self.extra_body or None))
        try:  # the JSON as sent: servers differ in what they fill in, so no strict model here
            data = raw.http_response.json()
        except ValueError:
            raise SamplerError(f"{self.base_url}/completions answered with non-JSON: "
                               f"{raw.http_response.text[:200]!r}") from None
        choices = sorted(data.get("choices") or [], key=lambda c: c.get("index", 0))
        if len(choices) != n:
            raise SamplerError(f"{self.base_url}/completions returned {len(choices)} choices, "
                               f"asked for {n}")
        usage = data.get("usage") or {}
        total = int(usage.get("completion_tokens") or 0)
        share = [total // n + (1 if j < total % n else 0) for j in range(n)]
        return [Completion(str(c.get("text") or ""), int(usage.get("prompt_tokens") or 0), share[j],
                           str(c.get("finish_reason") or "length"))
                for j, c in enumerate(choices)]

    def sample(self, prompts: list[str], n: int, params: SamplingParams,
               seeds: list[int] | None = None) -> list[list[Completion]]:
        seeds_ = prompt_seeds(params, len(prompts), seeds)
        if len(prompts) <= 1 or self.concurrency == 1:
            return [self._one(p, n, params, s) for p, s in zip(prompts, seeds_)]
        with ThreadPoolExecutor(min(self.concurrency, len(prompts))) as pool:
            return list(pool.map(lambda ps: self._one(ps[0], n, params, ps[1]),
                                 zip(prompts, seeds_)))

    def close(self) -> None:
        self.client.close()
