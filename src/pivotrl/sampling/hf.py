"""The `hf` backend: transformers `generate`, batched with left padding, CPU or GPU.

Prompts are sorted by token length and cut into batches of similar length (little padding); each
prompt is repeated n times in its batch (what `num_return_sequences=n` does inside generate).

Reproducibility. Sampling is done by a logits processor, not by generate's global RNG: every row
(prompt i, sample j) owns a `torch.Generator` seeded from (seed_i, j) and draws its uniforms from
it, and generate runs greedily over the processor's one-hot output. So sample j of prompt i is a
function of (model, prompt i, seed_i, j) alone — the same whichever other prompts share its batch,
however the batches are cut, and whether a run was resumed — up to floating-point differences of
the batched forward pass (padding changes reduction sizes by ~1e-7, which can flip a draw only when
it lands that close to a token boundary). Across devices and dtypes samples differ.

Sampling uses only temperature and top-p: the model's own generation_config defaults (repetition
penalty, top-k, ...) are not applied, so profiling draws from π0's distribution as GRPO will.
"""

from __future__ import annotations

from typing import Any

from pivotrl.sampling.base import Completion, SamplingParams, derive_seed, prompt_seeds


class _PerRowSampler:
    """A logits processor that samples each row with its own pre-drawn uniforms (inverse CDF),
    applying temperature and top-p, and returns a one-hot score row for the greedy step."""

    def __init__(self, uniforms, temperature: float, top_p: float):
        self.uniforms = uniforms  # [rows, max_new_tokens] on the model's device
        self.temperature = temperature
        self.top_p = top_p
        self.step = 0

    def __call__(self, input_ids, scores):
        import torch

        scores = scores.float()
        if self.temperature == 0.0:
            choice = scores.argmax(dim=-1)
        else:
            probs = torch.softmax(scores / self.temperature, dim=-1)
            probs, order = probs.sort(dim=-1, descending=True)  # fixed order: reproducible CDF
            cdf = probs.cumsum(dim=-1)
            if self.top_p < 1.0:
                # Keep the smallest prefix whose mass reaches top_p (the first token always).
                keep = (cdf - probs) < self.top_p
                probs = probs * keep
                cdf = probs.cumsum(dim=-1)
            u = self.uniforms[:, self.step].unsqueeze(-1) * cdf[:, -1:]
            idx = torch.searchsorted(cdf, u).clamp_(max=cdf.shape[-1] - 1)
            choice = order.gather(-1, idx).squeeze(-1)
        self.step += 1
        out = torch.full_like(scores, float("-inf"))
        out.scatter_(-1, choice.unsqueeze(-1), 0.0)
        return out


class HFSampler:
    """Sample with a transformers causal LM.

    model: a checkpoint dir/name, or a loaded model (then pass `tokenizer`; used by re-profiling
    during training). batch_size: sequences (rows) per generate call; a batch holds
    max(1, batch_size // n) prompts × n samples. device: "cuda"/"cpu"/None (cuda when available).
    dtype: torch dtype name; default bfloat16 on GPU, float32 on CPU (bf16 on CPU is ~16× slower).
    stop_token_ids: end tokens (default: the tokenizer's eos + the model's generation_config eos).
    share_prefix: prefill each prompt once for its n samples (see `_shared_prefill`).
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
            stop_token_ids = []
            if tokenizer.eos_token_id is not None:
                stop_token_ids.append(tokenizer.eos_token_id)
            gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
            for t in (gen_eos if isinstance(gen_eos, list) else [gen_eos]):
                if t is not None and t not in stop_token_ids:
                    stop_token_ids.append(t)
        if not stop_token_ids:
            raise ValueError("the tokenizer has no eos token: pass stop_token_ids=")
        self.stop_token_ids = list(stop_token_ids)
        pad = tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else self.stop_token_ids[0]

    def sample(self, prompts: list[str], n: int, params: SamplingParams,
               seeds: list[int] | None = None) -> list[list[Completion]]:
        import torch

        if n < 1:
            raise ValueError("n must be ≥ 1")
        seeds_ = prompt_seeds(params, len(prompts), seeds)
        ids = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        # Longest first: similar lengths share a batch, and an out-of-memory shows up at once.
        order = sorted(range(len(prompts)), key=lambda i: -len(ids[i]))
        per_batch = max(1, self.batch_size // n)
        results: list[list[Completion]] = [[] for _ in prompts]
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                for start in range(0, len(order), per_batch):
                    batch = order[start:start + per_batch]
                    outs = self._generate([ids[i] for i in batch], [seeds_[i] for i in batch], n,
                                          params)
                    for i, comps in zip(batch, outs):
                        results[i] = comps
        finally:
            if was_training:
                self.model.train()
        return results

    def _shared_prefill(self, input_ids, attention, n: int):
        """Run the prompts (all but their last token) once and copy the KV cache n times: the n
        samples of a prompt share its prefill instead of recomputing it (k=8: ~8× less prefill).
        Position ids as generate computes them for left padding. None if the model won't."""
        import torch

        if not self.share_prefix:
            return None
        att = attention[:, :-1]
        pos = (att.cumsum(-1) - 1).masked_fill_(att == 0, 1)
        try:
            out = self.model(input_ids=input_ids[:, :-1], attention_mask=att, position_ids=pos,
                             use_cache=True)
            cache = out.past_key_values
            cache.batch_repeat_interleave(n)
        except (AttributeError, TypeError, NotImplementedError, RuntimeError):
            self.share_prefix = False  # e.g. a model without a repeatable cache: plain path
            return None
        del out
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
        return cache

    def _generate(self, batch_ids: list[list[int]], seeds: list[int | None], n: int,
                  params: SamplingParams) -> list[list[Completion]]:
        import torch
        from transformers import GenerationConfig, LogitsProcessorList

        width = max(len(x) for x in batch_ids)
        input_ids = torch.full((len(batch_ids), width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(batch_ids), width), dtype=torch.long)
        for r, x in enumerate(batch_ids):  # left padding: every prompt ends at the same column
            if x:
                input_ids[r, width - len(x):] = torch.tensor(x, dtype=torch.long)
                attention[r, width - len(x):] = 1
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        cache = self._shared_prefill(input_ids, attention, n) if n > 1 and width > 1 else None
        input_ids = input_ids.repeat_interleave(n, dim=0)
        attention = attention.repeat_interleave(n, dim=0)
        steps = params.max_new_tokens
        uniforms = torch.empty((len(batch_ids) * n, steps), dtype=torch.float32)
        for r, seed in enumerate(seeds):
            base = int(torch.randint(0, 2**62, (1,)).item()) if seed is None else seed
            for j in range(n):
                g = torch.Generator().manual_seed(derive_seed(base, j))
                uniforms[r * n + j] = torch.rand(steps, generator=g)
        proc = _PerRowSampler(uniforms.to(self.device), params.temperature, params.top_p)
        config = GenerationConfig(max_new_tokens=steps, do_sample=False, num_beams=1,
                                  eos_token_id=self.stop_token_ids, pad_token_id=self.pad_token_id)
        extra = {"past_key_values": cache} if cache is not None else {}
        out = self.model.generate(input_ids=input_ids, attention_mask=attention,
                                  generation_config=config, **extra,
                                  logits_processor=LogitsProcessorList([proc]))
        gen = out[:, width:].tolist()
        stops = set(self.stop_token_ids)
        texts_ids, counts, reasons = [], [], []
        for row in gen:
            end = next((t for t, tok in enumerate(row) if tok in stops), None)
            if end is None:
                texts_ids.append(row)
                counts.append(len(row))
                reasons.append("length")
            else:
                texts_ids.append(row[:end])
                counts.append(end + 1)
                reasons.append("stop")
        texts = self.tokenizer.batch_decode(texts_ids, skip_special_tokens=True)
        return [[Completion(texts[r * n + j], len(batch_ids[r]), counts[r * n + j],
                            reasons[r * n + j]) for j in range(n)]
                for r in range(len(batch_ids))]
