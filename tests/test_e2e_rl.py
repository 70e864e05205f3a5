"""The end-to-end RL baseline: whole episodes in a testbed world, reward = success."""

from __future__ import annotations

import json
import re

import pytest
import torch

from pivotrl_testbed.e2e import E2ERunConfig


@pytest.mark.parametrize("world", ["toolshop", "mixed"])
def test_e2e_runs_and_counts_rollout_turns(tmp_path, tiny_model_dir, world):
    """`mixed`: one toolshop and one terminal task in each step (world from task metadata)."""
    from pivotrl_testbed.testbed.tasks import make_tasks
    from pivotrl_testbed.e2e import train_e2e

    if world == "mixed":
        from pivotrl.sandbox import bwrap as sandbox

        if not sandbox.sandbox_available():
            pytest.skip("no sandbox (bubblewrap) for the terminal world")
        tasks = make_tasks("toolshop", "train", 1) + make_tasks("terminal", "train", 1)
    else:
        tasks = make_tasks(world, "train", 2)
    cfg = E2ERunConfig(model=str(tiny_model_dir), output_dir=tmp_path / "e2e",
                       world=None if world == "mixed" else world,
                       tasks=tmp_path / "unused.jsonl", tasks_per_step=2, num_generations=2,
                       max_turns=2, max_completion_length=16, learning_rate=1e-3, max_steps=2)
    summary = train_e2e(cfg, tasks)
    rows = [json.loads(line) for line in (tmp_path / "e2e" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    turns_per_step = [r["episode_turns_mean"] * 4 for r in rows]  # 2 tasks × G=2 episodes
    assert rows[0]["rollout_turns"] == pytest.approx(turns_per_step[0])
    assert rows[1]["rollout_turns"] == pytest.approx(sum(turns_per_step))
    assert summary["rollout_turns"] == rows[-1]["rollout_turns"] >= 4  # ≥ 1 turn per episode
    assert (tmp_path / "e2e" / "config.json").exists()


def test_two_passes_per_batch_compare_each_span_with_its_own_old_log_probs(tmp_path, tiny_model_dir,
                                                                         monkeypatch):
    """μ = 2: the old log-probs are taken once per packed sequence and each span's ratio reads
    its own (the first pass, on unchanged weights, gives exactly the old values)."""
    from pivotrl_testbed import e2e
    from pivotrl_testbed.testbed.tasks import make_tasks

    calls, ran, generated = [], [], []

    def spy(model, batch, temperature=1.0):
        out = span_logps(model, batch, temperature)
        calls.append(([n for _, spans in batch for _, n in spans], [t.detach().clone() for t in out]))
        ran.append((torch.is_grad_enabled(), sum(len(ids) for ids, _ in batch)))
        return out

    def sampled(*args, **kwargs):
        gens = generate_each(*args, **kwargs)
        generated.extend(len(g.tokens) for g in gens)
        return gens

    span_logps, generate_each = e2e.span_logps, e2e.generate_each
    monkeypatch.setattr(e2e, "span_logps", spy)
    monkeypatch.setattr(e2e, "generate_each", sampled)
    cfg = E2ERunConfig(model=str(tiny_model_dir), output_dir=tmp_path / "mu2", world="toolshop",
                       tasks=tmp_path / "unused.jsonl", tasks_per_step=2, num_generations=2,
                       max_turns=2, max_completion_length=12, learning_rate=1e-3, max_steps=1,
                       num_iterations=2, micro_batch_size=1)
    order = iter(range(1000))  # rewards 0, 1, 0, 1, …: every group of G = 2 has a spread
    e2e.train_e2e(cfg, make_tasks("toolshop", "train", 2), reward_fn=lambda r: float(next(order) % 2))
    row = json.loads((tmp_path / "mu2" / "metrics.jsonl").read_text().splitlines()[0])
    assert all(map(lambda v: v == v, (row["loss"], row["clip_ratio"])))  # finite, no NaN
    assert calls and len(calls) % 3 == 0
    third = len(calls) // 3  # old (no grad), pass 1, pass 2: one call per micro-batch each
    old, first = calls[:third], calls[third:2 * third]
    assert [n for n, _ in old] == [n for n, _ in first]
    for (_, a), (_, b) in zip(old, first):
        assert all(torch.allclose(x, y, atol=1e-6) for x, y in zip(a, b))
    # Tokens, by hand: both passes' sequences (each its own length, once per pass), not the old
    # log-probs' no-gradient pass; and every token the episodes generated.
    assert [g for g, _ in ran] == [False] * third + [True] * 2 * third
    assert row["train_tokens"] == sum(n for g, n in ran if g) == 2 * sum(n for g, n in ran if not g) > 0
    assert row["rollout_tokens"] == sum(generated) > 0


def test_a_resumed_run_is_the_uninterrupted_run(tmp_path, tiny_model_dir):
    """Stopped at a checkpoint and resumed, the run ends with the same weights and metrics as one
    run straight through (nothing lost or doubled), so the demo can stop E2E RL early."""
    from safetensors.torch import load_file

    from pivotrl_testbed.e2e import train_e2e
    from pivotrl_testbed.testbed.tasks import make_tasks

    tasks = make_tasks("toolshop", "train", 3)

    def run(out, steps, resume=False):
        cfg = E2ERunConfig(model=str(tiny_model_dir), output_dir=out, world="toolshop",
                           tasks=tmp_path / "unused.jsonl", tasks_per_step=2, num_generations=2,
                           max_turns=2, max_completion_length=12, learning_rate=1e-3,
                           max_steps=steps, save_steps=2, resume=resume)
        return train_e2e(cfg, tasks)

    def metrics(out):
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k != "step_time"} for r in rows]

    run(tmp_path / "straight", 4)
    assert run(tmp_path / "split", 2)["resumed_from"] == 0
    with (tmp_path / "split" / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 3, "rollout_turns": 999}) + "\n")  # a step lost in a crash
    assert run(tmp_path / "split", 4, resume=True)["resumed_from"] == 2
    assert metrics(tmp_path / "split") == metrics(tmp_path / "straight")
    a = load_file(tmp_path / "straight" / "model.safetensors")
    b = load_file(tmp_path / "split" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (tmp_path / "split" / "checkpoint-4" / "config.json").exists()


def test_e2e_policy_gradient_step_follows_the_reward(tmp_path, tiny_model_dir):
    """Reward the episodes whose first completion token is even: after one step, the log-prob of
    those first turns rises and that of the others falls (the loss really is the PG loss)."""
    from transformers import AutoModelForCausalLM

    from pivotrl_testbed.testbed.tasks import make_tasks
    from pivotrl_testbed import e2e

    recorded = []
    original = e2e.RecordingPolicy

    class Spy(original):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            recorded.append(self)

    tasks = make_tasks("toolshop", "train", 1)
    cfg = E2ERunConfig(model=str(tiny_model_dir), output_dir=tmp_path / "pg", world="toolshop",
                       tasks=tmp_path / "unused.jsonl", tasks_per_step=1, num_generations=8,
                       max_turns=1, max_completion_length=8, learning_rate=3e-3, max_steps=1)
    episode_index = iter(range(10**6))

    def reward(result):
        i = next(episode_index)
        first = recorded[-1].turns[i][0][1]
        return float(bool(first) and first[0] % 2 == 0)

    e2e.RecordingPolicy = Spy
    try:
        e2e.train_e2e(cfg, tasks, reward_fn=reward)
    finally:
        e2e.RecordingPolicy = original
    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "pg")
    up, down = [], []
    for turns in recorded[0].turns:
        prompt, completion = turns[0]
        if not completion:
            continue
        with torch.no_grad():
            delta = (e2e.token_logps(after, [(prompt, completion)], 1.0)[0].sum()
                     - e2e.token_logps(before, [(prompt, completion)], 1.0)[0].sum()).item()
        (up if completion[0] % 2 == 0 else down).append(delta)
    assert up and down, "the step needs both rewarded and unrewarded episodes"
    assert sum(up) / len(up) > 0 > sum(down) / len(down)


def test_token_logps_match_a_full_forward(tiny_model_dir):
    """Completion-only projection gives the log-probs a plain full-logits forward gives, per
    completion, with prompts and completions of different lengths (padding) in one batch."""
    from transformers import AutoModelForCausalLM

    from pivotrl_testbed import e2e

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    batch = [([5, 9, 13, 2], [7, 8, 3]), ([4, 6], [11]), ([3, 3, 3, 3, 3, 3], [9, 10, 12, 14, 2])]
    got = e2e.token_logps(model, batch, 0.7)
    for (prompt, completion), lp in zip(batch, got):
        ids = torch.tensor([prompt + completion])
        with torch.no_grad():
            full = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float() / 0.7, dim=-1)
        want = full[len(prompt) - 1:].gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)
        assert lp.shape == (len(completion),)
        assert torch.allclose(lp.detach(), want, atol=1e-5)


def test_pack_turns_joins_only_turns_whose_prompt_replays_the_episode_exactly():
    from pivotrl_testbed.e2e import pack_turns

    turns = [([1, 2, 3], [4, 5]),
             ([1, 2, 3, 4, 5, 6, 7], [8]),  # earlier turn + tool output: one more span
             ([1, 2, 3, 4, 9, 6, 7, 8, 6], [2]),  # history re-rendered (one token differs): new row
             ([1, 2, 3, 4, 9, 6, 7, 8, 6, 2, 5], []),  # no completion: not in the loss
             ([1, 2, 3, 4, 9, 6, 7, 8, 6, 2, 5], [7])]
    assert pack_turns(turns) == [
        ([1, 2, 3, 4, 5, 6, 7, 8], [(3, 2), (7, 1)]),
        ([1, 2, 3, 4, 9, 6, 7, 8, 6, 2, 5, 7], [(9, 1), (11, 1)])]
    assert pack_turns([([1, 2], [3]), ([1], [2])]) == [([1, 2, 3], [(2, 1)]), ([1, 2], [(1, 1)])]


def test_a_packed_episode_scores_each_turn_as_its_own_forward_does(tiny_model_dir):
    """One pass over the episode's last sequence gives every turn's log-probs and gradients as
    one pass per turn (prompt + completion) does: the packing changes the cost, not the loss."""
    from transformers import AutoModelForCausalLM

    from pivotrl_testbed.e2e import pack_turns
    from pivotrl.sampling.generate import completion_logps, span_logps

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    episode = [([5, 9, 13], [7, 8, 2]), ([5, 9, 13, 7, 8, 2, 4, 6], [11, 2]),
               ([5, 9, 13, 7, 8, 2, 4, 6, 11, 2, 3, 3], [9, 10, 12])]
    other = [([4, 6], [11, 1])]
    packed = pack_turns(episode) + pack_turns(other)
    assert len(packed) == 2
    grads = []
    for run in ("per turn", "packed"):
        model.zero_grad()
        lps = (completion_logps(model, episode + other, 0.7) if run == "per turn"
               else span_logps(model, packed, 0.7))
        torch.stack([lp.sum() for lp in lps]).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
        if run == "per turn":
            want = [lp.detach() for lp in lps]
    assert [lp.shape for lp in lps] == [w.shape for w in want]
    for got, ref in zip(lps, want):
        assert torch.allclose(got.detach(), ref, atol=1e-5)
    assert torch.allclose(grads[0], grads[1], atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="span outside"):
        span_logps(model, [([1, 2, 3], [(2, 5)])])


def test_cli_e2e_skips_and_counts_bad_task_lines(tmp_path, tiny_model_dir):
    """A bad line in the task file is skipped and counted (its reason in the rejects file), as
    `sft` does, instead of stopping the run."""
    from typer.testing import CliRunner

    from pivotrl.cli import app
    from pivotrl.io.records import write_atomic
    from pivotrl_testbed.testbed.experts import generate_trajectories

    tasks = tmp_path / "tasks.jsonl"
    write_atomic(tasks, generate_trajectories("toolshop", "train", 2))
    with tasks.open("a") as fh:
        fh.write("this is not json\n" + json.dumps({"id": "no-messages"}) + "\n")
    out = tmp_path / "e2e"
    r = CliRunner().invoke(app, ["e2e", "--tasks", str(tasks), "--model", str(tiny_model_dir),
                                 "--output-dir", str(out), "--world", "toolshop", "--tasks-per-step", "2",
                                 "--num-generations", "2", "--max-turns", "1", "--max-completion-length", "8",
                                 "--max-steps", "1"], env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output
    assert re.search(r"rejected_lines\W+2 \(first: ", r.output), r.output
    rejects = [json.loads(line) for line in (out / "tasks.rejects.jsonl").read_text().splitlines()]
    assert [(x["line"], x["field"]) for x in rejects] == [(3, ""), (4, "messages")]
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1
