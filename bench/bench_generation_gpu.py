"""Shared-prefix generation on a GPU: agreement with the per-sample path and with transformers'
generate, and samples/s of the three, side by side in one run.

    python3 bench/bench_generation_gpu.py [--prompts 64] [--k 8] [--max-new-tokens 48]

A random Llama (hidden 1024, 8 layers, 16 heads over 4 kv heads: grouped-query attention, as the
models users train) in float32 and bfloat16, ~400-token prompts. Agreement: the fraction of greedy
completions whose tokens equal transformers' `generate` on the prompt alone, next to the same
fraction for transformers' own generate on the prompts as one padded batch (float noise flips the
near-ties of a random model's flat distributions, more in bfloat16: that is the floor). Rates: K
samples of every prompt, no stop token (every row runs max_new_tokens).
"""

from __future__ import annotations

import argparse
import random
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--batch-size", type=int, default=512)
    args = ap.parse_args()

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from pivotrl.sampling.generate import generate, sample_seeds

    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"torch {torch.__version__}, device {device}"
          f"{' (' + torch.cuda.get_device_name() + ')' if device == 'cuda' else ''}")
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 32000) for _ in range(rng.randrange(350, 450))]
               for _ in range(args.prompts)]
    stop = [1]
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=32000, hidden_size=1024, num_hidden_layers=8,
                          num_attention_heads=16, num_key_value_heads=4, intermediate_size=2816,
                          max_position_embeddings=4096, eos_token_id=1, pad_token_id=0)
        model = LlamaForCausalLM(cfg).to(device, dtype).eval()
        kw = {"max_new_tokens": args.max_new_tokens, "stop_token_ids": stop,
                  "batch_size": args.batch_size}
        few = prompts[:8]
        greedy = generate(model, few, [[None]] * len(few), temperature=0.0, **kw)
        with torch.no_grad():
            ref = [model.generate(input_ids=torch.tensor([p], device=device),
                                  max_new_tokens=args.max_new_tokens, do_sample=False,
                                  eos_token_id=stop, pad_token_id=0)[0, len(p):].tolist()
                   for p in few]
        agree = sum(g[0].tokens == r[:len(g[0].tokens)] for g, r in zip(greedy, ref)) / len(few)
        # The noise floor: transformers' generate on the same prompts as one left-padded batch.
        width = max(map(len, few))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in few], device=device)
        att = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in few], device=device)
        with torch.no_grad():
            batched = model.generate(input_ids=ids, attention_mask=att, do_sample=False,
                                     max_new_tokens=args.max_new_tokens, eos_token_id=stop,
                                     pad_token_id=0)[:, width:].tolist()
        floor = sum(b == r for b, r in zip(batched, ref)) / len(few)
        # Teacher-forced check: the logits of the second decoding step against a plain forward
        # of prompt + first token in the same dtype (greedy, so the first token is the same).
        from pivotrl.sampling import generate as generation

        real, seen = generation.pick_tokens, []
        def spy(logits, *a, seen=seen, real=real, **k):
            seen.append(logits)
            return real(logits, *a, **k)

        generation.pick_tokens = spy
        deltas, own = {}, 0.0
        try:
            for share in (True, False):
                worst = 0.0
                for p in few:  # one prompt per call: rows are in the order generate sorts them
                    seen.clear()
                    first = generate(model, [p], [[None, None]], temperature=0.0,
                                     share_prefix=share, **{**kw, "max_new_tokens": 2})[0][0]
                    with torch.no_grad():
                        full = model(input_ids=torch.tensor([p + first.tokens[:1]], device=device)
                                     ).logits[0, -1].float()
                        pre = model(input_ids=torch.tensor([p], device=device), use_cache=True)
                        step = model(input_ids=torch.tensor([first.tokens[:1]], device=device),
                                     past_key_values=pre.past_key_values).logits[0, -1].float()
                    worst = max(worst, ((seen[1][0] - full).abs().max() / full.std()).item())
                    own = max(own, ((step - full).abs().max() / full.std()).item())
                deltas[share] = worst
        finally:
            generation.pick_tokens = real
        print(f"{dtype!s:>15}: decoding-step logits vs a full forward, max |Δ| / std(logits): "
              f"shared {deltas[True]:.2e}, per-sample {deltas[False]:.2e}, transformers' own cached "
              f"step {own:.2e}")
        seeds = sample_seeds(range(len(prompts)), args.k)
        a = generate(model, prompts, seeds, **kw)
        b = generate(model, prompts, seeds, share_prefix=False, **kw)
        same = sum(x == y for x, y in zip(a, b)) / len(a)
        rates = {}
        for name in ("shared", "per_sample", "hf_generate", "shared", "per_sample"):
            torch.cuda.synchronize() if device == "cuda" else None
            t0 = time.perf_counter()
            if name == "hf_generate":
                for s in range(0, len(prompts), args.batch_size // args.k):
                    chunk = prompts[s:s + args.batch_size // args.k]
                    width = max(map(len, chunk))
                    ids = torch.tensor([[0] * (width - len(p)) + p for p in chunk], device=device)
                    att = (torch.arange(width, device=device)[None, :]
                           >= torch.tensor([width - len(p) for p in chunk], device=device)[:, None])
                    with torch.no_grad():
                        model.generate(input_ids=ids, attention_mask=att.long(), do_sample=True,
                                       top_k=0, num_return_sequences=args.k,
                                       max_new_tokens=args.max_new_tokens,
                                       min_new_tokens=args.max_new_tokens,
                                       pad_token_id=0, eos_token_id=stop)
            else:
                generate(model, prompts, seeds, share_prefix=name == "shared", **kw)
            torch.cuda.synchronize() if device == "cuda" else None
            rates[name] = len(prompts) * args.k / (time.perf_counter() - t0)
        print(f"{dtype!s:>15}: greedy = transformers generate on {agree:.0%} of prompts "
              f"(transformers batched = alone on {floor:.0%}); "
              f"sampled shared = per-sample on {same:.0%} of prompts; samples/s (second run) "
              f"shared {rates['shared']:.0f}, per-sample {rates['per_sample']:.0f}, "
              f"transformers generate {rates['hf_generate']:.0f}; shared÷per-sample "
              f"{rates['shared'] / rates['per_sample']:.2f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
