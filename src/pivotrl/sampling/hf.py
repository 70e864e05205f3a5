"""The `hf` backend: a transformers causal LM on CPU or GPU, through `pivotrl.sampling.generate`.

Prompts are tokenized and handed to `generation.generate`, which batches prompts of similar length
with left padding, prefills each prompt once for its n samples (the n samples decode against one
copy of the prompt's cache) and stops each row at an end token or `max_new_tokens`.

Reproducibility. Sample j of prompt i is drawn from its own generator seeded with
`derive_seed(seed_i, j)`: it is a function of (model, prompt i, seed_i, j) alone — the same
whichever other prompts share its batch, however the batches are cut, whether its prompt's
prefill is shared, and whether a run was resumed — up to floating-point differences of the
batched forward pass (padding changes reduction sizes by ~1e-7, which can flip a draw only when
it lands that close to a token boundary). Across devices and dtypes samples differ.

Prompts longer than the model's context (`max_prompt_tokens`, from its config and tokenizer) are
for the caller to set aside (`sampling.pipeline.split_too_long`), as with the other engines.

Sampling uses only temperature and top-p: the model's own generation_config defaults (repetition
penalty, top-k, ...) are not applied, so profiling draws from π0's distribution as GRPO will.
"""

from __future__ import annotations

from typing import Any

from pivotrl.formats.chat import completion_text
from pivotrl.sampling.generate import generate, sample_seeds, stop_ids
from pivotrl.sampling.base import Completion, SamplingParams, prompt_seeds
from pivotrl.sampling.pipeline import context_length


class HFSampler:
    """Sample with a transformers causal LM.

    model: a checkpoint dir/name, or a loaded model (then pass `tokenizer`; used by re-profiling
    during training). batch_size: sequences (rows) per generate call; a batch holds
    max(1, batch_size // n) prompts × n samples. device: "cuda"/"cpu"/None (cuda when available).
    dtype: torch dtype name; default bfloat16 on GPU, float32 on CPU (bf16 on CPU is ~16× slower).
    stop_token_ids: end tokens (default: the tokenizer's eos + the model's generation_config eos).
    share_prefix: prefill each prompt once for its n samples (False: every sample prefills
    its own copy, the per-sample path; same samples, slower).
    """

    name = "hf"

    def __init__(self, model: Any, tokenizer: Any = None, batch_size: int = 64,
                 device: str | None = None, dtype: str | None = None,
                 stop_token_ids: list[int] | None = None, share_prefix: bool = True):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
            path = str(model)
            torch_dtype = getattr(torch, dtype) if dtype else (
                torch.bfloat16 if device.startswith("cuda") else torch.float32)
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).to(device)
            model.eval()
        elif tokenizer is None:
            raise ValueError("HFSampler(model_object) needs tokenizer=")
        else:
            device = str(next(model.parameters()).device)
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.batch_size = max(1, int(batch_size))
        self.share_prefix = share_prefix
        if stop_token_ids is None:
            stop_token_ids = stop_ids(tokenizer, model)
        if not stop_token_ids:
            raise ValueError("the tokenizer has no eos token: pass stop_token_ids=")
        self.stop_token_ids = list(stop_token_ids)

    def max_prompt_tokens(self) -> int | None:
        """Longest prompt that leaves the model room for one new token (None: no stated context)."""
        context = context_length(getattr(self.model, "config", None), self.tokenizer)
        return None if context is None else context - 1

    def sample(self, prompts: list[str], n: int, params: SamplingParams,
               seeds: list[int] | None = None, on_step: Any = None) -> list[list[Completion]]:
        """on_step: `generation.generate`'s per-step observer (rows index `prompts`)."""
        if n < 1:
            raise ValueError("n must be ≥ 1")
        seeds_ = prompt_seeds(params, len(prompts), seeds)
        ids = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        outs = generate(self.model, ids, sample_seeds(seeds_, n),
                        max_new_tokens=params.max_new_tokens, stop_token_ids=self.stop_token_ids,
                        temperature=params.temperature, top_p=params.top_p,
                        batch_size=self.batch_size, share_prefix=self.share_prefix,
                        on_step=on_step)
        results = []
        for prompt, gens in zip(ids, outs):
            # The end token is counted in completion_tokens but is not part of the text.
            bodies = [g.tokens[:-1] if g.finish_reason == "stop" else g.tokens for g in gens]
            # Special tokens are kept: some families' call delimiters are special (chat.completion_text).
            texts = [completion_text(self.tokenizer, body) for body in bodies]
            results.append([Completion(t, len(prompt), len(g.tokens), g.finish_reason)
                            for t, g in zip(texts, gens)])
        return results
