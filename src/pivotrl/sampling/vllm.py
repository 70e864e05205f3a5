"""The `vllm` backend: vLLM's offline engine, n samples per prompt (GPU; `pip install pivotrl[vllm]`).

One `LLM.generate` call gets all prompts, each with its own `vllm.SamplingParams(n=n, seed=…)`
(vLLM pairs a list of params with the prompts one by one), so vLLM's scheduler batches freely and
each prompt's samples depend on its seed only. vLLM is imported only when this backend is built.
"""

from __future__ import annotations

from typing import Any

from pivotrl.chat import prompt_token_ids
from pivotrl.sampling.base import Completion, SamplerError, SamplingParams, prompt_seeds


class VLLMSampler:
    """model: a HF checkpoint dir/name. engine_kwargs go to `vllm.LLM` (e.g. tensor_parallel_size,
    gpu_memory_utilization, max_model_len, dtype)."""

    name = "vllm"

    def __init__(self, model: str, **engine_kwargs: Any):
        try:
            import vllm
        except ImportError as exc:
            raise SamplerError(
                "the vllm backend needs vLLM (a GPU extra): pip install 'pivotrl[vllm]' "
                f"(vllm==0.31.0, the build that matches torch 2.13.0); import failed: {exc}") from exc
        engine_kwargs.pop("batch_size", None)  # vLLM schedules its own batches
        self._vllm = vllm
        self.llm = vllm.LLM(model=str(model), **engine_kwargs)
        self.tokenizer = self.llm.get_tokenizer()

    def sample(self, prompts: list[str], n: int, params: SamplingParams,
               seeds: list[int] | None = None) -> list[list[Completion]]:
        if not prompts:
            return []
        per_prompt = [
            self._vllm.SamplingParams(n=n, temperature=params.temperature, top_p=params.top_p,
                                      max_tokens=params.max_new_tokens, seed=seed,
                                      # gpt-oss's and DeepSeek's call delimiters are special
                                      # tokens: the parser must see them (chat.completion_text)
                                      skip_special_tokens=False)
            for seed in prompt_seeds(params, len(prompts), seeds)
        ]
        # Token ids, not text: vLLM would add special tokens to a text prompt, and a template that
        # writes its own BOS would then start with two (pivotrl.chat's one tokenization rule).
        inputs = [{"prompt_token_ids": prompt_token_ids(self.tokenizer, p)} for p in prompts]
        outputs = self.llm.generate(inputs, per_prompt, use_tqdm=False)
        results = []
        for out in outputs:  # RequestOutput, in prompt order
            n_prompt = len(out.prompt_token_ids or [])
            results.append([
                Completion(c.text, n_prompt, len(c.token_ids),
                           "stop" if c.finish_reason == "stop" else (c.finish_reason or "length"))
                for c in out.outputs
            ])
        return results
