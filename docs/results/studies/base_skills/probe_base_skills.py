"""Can the tiny base learn the OOD skills at all? Pretrain a fresh model on OOD tasks only and
print eval accuracy per family after each chunk of steps (issue #4's open problem).

    python3 docs/results/studies/base_skills/probe_base_skills.py --testbed runs/testbed --steps 1200 --examples 4000 \
        --families upper,recall [--layers 2] [--overfit]

--overfit trains on 16 examples of the first family and checks them (the loop itself works).
Uses the testbed's tokenizer, so it tests the model + tokenizer + chat format as built.
"""

import argparse
import time

import torch

from pivotrl_testbed.evaluate import ood_answers
from pivotrl_testbed.testbed import ood
from pivotrl_testbed.testbed.pretrain import PretrainConfig, pretrain
from pivotrl_testbed.testbed.tiny import TinyModelConfig, build_model, load_tiny


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--testbed", default="runs/testbed")
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--chunks", type=int, default=3)
    ap.add_argument("--examples", type=int, default=600, help="train examples per family")
    ap.add_argument("--families", default=",".join(ood.FAMILIES))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch-tokens", type=int, default=4096)
    ap.add_argument("--overfit", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    _, tok = load_tiny(f"{args.testbed}/base")
    model = build_model(tok, TinyModelConfig(num_layers=args.layers))
    fams = args.families.split(",")
    train = [t for f in fams for t in ood.generate(f, "train", 16 if args.overfit else args.examples, 0)]
    evals = train if args.overfit else [t for f in fams for t in ood.generate(f, "eval", 40, 0)]
    examples = [{"messages": [{"role": "user", "content": t.prompt},
                              {"role": "assistant", "content": t.answer}]} for t in train]
    t0 = time.time()
    every = args.steps // args.chunks

    def report(step: int, loss: float) -> None:
        # One schedule for the whole run; evaluate every `every` steps without disturbing it.
        if step % every:
            return
        model.eval()
        answers = ood_answers(model, tok, [t.prompt for t in evals], 8, 100)
        model.train()
        acc: dict[str, list[bool]] = {}
        for t, a in zip(evals, answers):
            acc.setdefault(t.family, []).append(ood.check(t.family, a, t.answer))
        print(f"step {step}  {time.time() - t0:.0f}s  loss {loss:.3f}  " +
              "  ".join(f"{f} {sum(v) / len(v):.2f}" for f, v in acc.items()), flush=True)

    pretrain(model, tok, examples, PretrainConfig(
        steps=args.steps, lr=args.lr, warmup=50, tokens_per_batch=args.batch_tokens,
        max_rows=128, threads=args.threads), report)


if __name__ == "__main__":
    main()
