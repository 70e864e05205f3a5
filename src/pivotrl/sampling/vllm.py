"""The `vllm` backend: vLLM's offline engine, n samples per prompt (GPU; `pip install pivotrl[vllm]`).

One `LLM.generate` call gets all prompts, each with its own `vllm.SamplingParams(n=n, seed=…)`
(vLLM pairs a list of params with the prompts one by one), so vLLM's scheduler batches freely and
each prompt's samples depend on its seed only. Prompts go in as token ids, tokenized without added
special tokens: the chat template's text is the whole prompt (a tokenizer that adds a BOS on
encode would otherwise give a double-BOS prompt). vLLM is imported only when this backend is built.

A prompt longer than the engine's `max_model_len` makes vLLM fail the whole `generate` call, so
`sample` refuses such prompts up front with a SamplerError naming them; profiling drops them
before sampling (`max_prompt_tokens`) and reports them instead.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from pivotrl.sampling.base import Completion, SamplerError, SamplingParams, prompt_seeds


class VLLMOptions(BaseModel):
    """Engine options of the vllm backend (`pivotrl profile --tensor-parallel-size …`, or the
    `engine:` block of a profile YAML). Defaults are vLLM's own unless said otherwise."""

    model_config = ConfigDict(extra="forbid")

    tensor_parallel_size: int = Field(1, ge=1, description="GPUs one model is split over "
                                      "(vLLM's default 1).")
    max_model_len: int | None = Field(None, ge=1, description="Context length (prompt + "
                                      "completion) the engine reserves for; None: the model's "
                                      "own. Longer prompts are skipped and reported.")
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0, description="Share of each "
                                          "GPU's memory vLLM may take (vLLM's default 0.9).")
    dtype: str = Field("auto", description="Weights/activations dtype: auto (the checkpoint's), "
                       "bfloat16, float16, float32 (vLLM's default auto).")
    enable_prefix_caching: bool = Field(True, description="Reuse the KV cache of shared prompt "
                                        "prefixes: turns of one trajectory share most of their "
                                        "context, so profiling benefits (ours: on).")
    extra: dict[str, Any] = Field(default_factory=dict, description="Any other `vllm.LLM` "
                                  "keyword (e.g. enforce_eager, max_num_seqs, quantization).")

    def engine_kwargs(self) -> dict[str, Any]:
        kwargs = self.model_dump(exclude={"extra"}, exclude_none=True)
        return {**kwargs, **self.extra}


class VLLMSampler:
    """model: a HF checkpoint dir/name. Keyword options: the fields of VLLMOptions (unknown ones
    are an error: a typo must not be silently ignored on a multi-GPU job)."""

    name = "vllm"

    def __init__(self, model: str, **options: Any):
        options.pop("batch_size", None)  # vLLM schedules its own batches
        self.options = VLLMOptions(**options)
        try:
            import vllm
        except ImportError as exc:
            raise SamplerError(
                "the vllm backend needs vLLM (a GPU extra): pip install 'pivotrl[vllm]' "
                f"(vllm==0.31.0, the build that matches torch 2.13.0); import failed: {exc}") from exc
        self._vllm = vllm
        self.llm = vllm.LLM(model=str(model), **self.options.engine_kwargs())
        self.tokenizer = self.llm.get_tokenizer()
        self.max_model_len = self._engine_max_len()

    def _engine_max_len(self) -> int | None:
        for path in (("llm_engine", "model_config", "max_model_len"),
                     ("llm_engine", "vllm_config", "model_config", "max_model_len")):
            obj: Any = self.llm
            for attr in path:
                obj = getattr(obj, attr, None)
            if isinstance(obj, int):
                return obj
        return self.options.max_model_len

    def max_prompt_tokens(self) -> int | None:
        """Longest prompt the engine accepts (one position is left for the first new token)."""
        return None if self.max_model_len is None else self.max_model_len - 1

    def sample(self, prompts: list[str], n: int, params: SamplingParams,
               seeds: list[int] | None = None) -> list[list[Completion]]:
        if not prompts:
            return []
        ids = [list(self.tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
        limit = self.max_prompt_tokens()
        too_long = [i for i, x in enumerate(ids) if limit is not None and len(x) > limit]
        if too_long:
            raise SamplerError(f"{len(too_long)} prompt(s) longer than max_model_len="
                               f"{self.max_model_len} (first: #{too_long[0]}, "
                               f"{len(ids[too_long[0]])} tokens); raise --max-model-len or drop them")
        per_prompt = [
            self._vllm.SamplingParams(n=n, temperature=params.temperature, top_p=params.top_p,
                                      max_tokens=params.max_new_tokens, seed=seed,
                                      # gpt-oss's and DeepSeek's call delimiters are special
                                      # tokens: the parser must see them (chat.completion_text)
                                      skip_special_tokens=False)
            for seed in prompt_seeds(params, len(prompts), seeds)
        ]
        outputs = self.llm.generate([{"prompt_token_ids": x} for x in ids], per_prompt,
                                    use_tqdm=False)
        results = []
        for x, out in zip(ids, outputs):  # RequestOutput, in prompt order
            results.append([
                Completion(c.text, len(x), len(c.token_ids),
                           "stop" if c.finish_reason == "stop" else (c.finish_reason or "length"))
                for c in out.outputs
            ])
        return results
