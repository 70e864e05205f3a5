"""Do the demo's Theorem 3.2 statistics tell structure from noise? A random untrained tiny model,
two reward rules, each statistic beside its shuffled-reward null (pivotrl_testbed.theory).

- random rewards: 0/1 at random, unrelated to the action. Nothing to learn: a statistic that
  still "confirms" the theorem here is the construction, not evidence.
- action rewards: 1 when the first sampled token id is below the state's median (a third of the
  states get all 0, so zero-std states exist too). There is structure to learn.

    python3 docs/results/studies/theory_null_controls/theory_null_controls.py --states 48
"""

import argparse
import json
import random
import time

import torch

from pivotrl_testbed.testbed.tiny import TinyModelConfig, build_model, build_tokenizer
from pivotrl_testbed.theory import sample_actions, state_signal, summarise_gradient
from pivotrl.io.records import Profile


def corpus(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    words = ["order", "refund", "customer", "ls", "cat", "grep", "total", "status", "reverse", "upper"]
    return [" ".join(rng.choice(words) + str(rng.randint(0, 99)) for _ in range(12)) for _ in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--states", type=int, default=48)
    ap.add_argument("--samples", type=int, default=16, help="G per half (2G sampled per state)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    texts = corpus(400, 0)
    tok = build_tokenizer(texts, vocab_size=512)
    model = build_model(tok, TinyModelConfig(max_positions=2048))
    model.eval()
    rng, t0, out = random.Random(0), time.time(), {}
    for rule in ("random rewards", "action rewards"):
        points = []
        for i in range(args.states):
            state = Profile(id=f"s{i}", trajectory_id="t", turn=i, tools=[],
                            context=[{"role": "user", "content": texts[i]}],
                            expected={"role": "assistant", "content": "x"}, k=0, samples=[],
                            reward_mean=0.0, reward_std=0.0)
            prompt, comps, _ = sample_actions(model, tok, state, 2 * args.samples, 8, seed=i)
            if rule == "random rewards":
                p = rng.choice([0.2, 0.5, 0.8])
                rewards = [float(rng.random() < p) for _ in comps]
            else:
                cut = sorted(c[0] for c in comps)[len(comps) // 2] if i % 3 else -1
                rewards = [float(c[0] < cut) for c in comps]
            half = rewards[: args.samples]
            m = sum(half) / len(half)
            std = (sum((r - m) ** 2 for r in half) / len(half)) ** 0.5
            points.append({"id": state.id, "pivot": False, "reward_std": std,
                           **state_signal(model, prompt, comps, rewards, random.Random(i))})
        summary = summarise_gradient(points)
        summary.pop("points")
        out[rule] = summary
    out["seconds"] = round(time.time() - t0, 1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
