"""`pivotrl train`: the GRPO step itself (on the tiny model), the verifier reward, the schedule,
metrics.jsonl and --resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from pivotrl.io.records import Turn
from pivotrl.train.config import GRPORunConfig
from pivotrl.train.reward import PivotReward, group_stats

TOOLS = [{"type": "function", "function": {"name": "get_order", "description": "Look up an order.",
          "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}}}}]


def make_turn(i: int) -> dict:
    return {"id": f"t{i}/1", "trajectory_id": f"t{i}", "turn": 1, "tools": TOOLS,
            "context": [{"role": "user", "content": f"Where is order O-{i}?"}],
            "expected": {"role": "assistant", "tool_calls": [{"id": "c0", "type": "function", "function": {
                "name": "get_order", "arguments": json.dumps({"order_id": f"O-{i}"})}}]}}


def write_pivots(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps(make_turn(i)) + "\n" for i in range(n)))
    return path


def small_config(tmp_path: Path, model: Path, **kw) -> GRPORunConfig:
    base = dict(model=str(model), pivots=str(write_pivots(tmp_path / "pivots.jsonl", 4)),
                output_dir=str(tmp_path / "run"), num_generations=4, per_device_train_batch_size=8,
                max_completion_length=12, learning_rate=1e-4, max_steps=2, save_steps=2)
    base.update(kw)
    return GRPORunConfig(**base)


# ---------------------------------------------------------------- the reward


def test_reward_scores_against_the_pivots_expert_action():
    turn = json.dumps(make_turn(3))
    good = '<tool_call>\n{"name": "get_order", "arguments": {"order_id": "O-3"}}\n</tool_call>'
    wrong = '<tool_call>\n{"name": "get_order", "arguments": {"order_id": "O-4"}}\n</tool_call>'
    trailing = good + " and more"  # not cleanly terminated: invalid (DESIGN.md, reward gaming)
    logged = []
    reward = PivotReward("toolcall", invalid_action_penalty=-0.5)
    out = reward([""] * 4, [good, wrong, "<tool_call>{oops", trailing], [turn] * 4,
                 log_metric=lambda k, v: logged.append((k, v)))
    assert out == [1.0, 0.0, -0.5, -0.5]
    assert logged == [("invalid_rate", 0.5)]


def test_reward_never_crashes_on_hostile_text():
    reward = PivotReward("toolcall")
    turn = json.dumps(make_turn(0))
    texts = ["", "\x00" * 5, "<tool_call>" * 50, '{"name": 5}', "x" * 70_000, "</think>"]
    assert reward([""] * len(texts), texts, [turn] * len(texts)) == [0.0] * len(texts)


def test_group_stats_counts_zero_std_groups():
    stats = group_stats(torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]), 4)
    assert stats["frac_zero_std"] == 0.5
    assert stats["group_std_mean"] == pytest.approx((0.4330127 + 0.0) / 2)


# ---------------------------------------------------------------- config and schedule


def test_schedule_counts_pivots_not_rows(tmp_path):
    cfg = GRPORunConfig(model="m", pivots="p.jsonl", output_dir="o", num_generations=16,
                        per_device_train_batch_size=32, gradient_accumulation_steps=2, num_epochs=3)
    # 2 processes × 32 completions × 2 accumulation / G=16 = 8 pivots per optimizer step
    assert cfg.pivots_per_step(2) == 8
    assert cfg.total_steps(100, num_processes=2) == 38  # ceil(3 × 100 / 8)
    assert cfg.model_copy(update={"max_steps": 5}).total_steps(100) == 5


def test_yaml_config_resolves_paths_and_rejects_unknown_keys(tmp_path):
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({"model": "some/hub-id", "pivots": "p.jsonl",
                                                       "output_dir": "out", "num_generations": 8}))
    cfg = GRPORunConfig.from_yaml(tmp_path / "run.yaml", max_steps=7)
    assert cfg.pivots == tmp_path / "p.jsonl" and cfg.output_dir == tmp_path / "out"
    assert cfg.model == "some/hub-id" and cfg.max_steps == 7 and cfg.num_generations == 8
    assert (cfg.epsilon, cfg.epsilon_high, cfg.beta, cfg.loss_type) == (0.2, 0.28, 0.0, "dapo")
    (tmp_path / "bad.yaml").write_text("model: m\npivots: p\noutput_dir: o\nnum_generatons: 8\n")
    with pytest.raises(ValueError, match="bad.yaml.*num_generatons"):
        GRPORunConfig.from_yaml(tmp_path / "bad.yaml")


def test_training_states_are_the_pivots_file(tmp_path):
    """The ablations' states come from `select --strategy`, not from a second switch in train."""
    from pivotrl.train.grpo import load_pivot_set

    cfg = GRPORunConfig(model="m", pivots=str(write_pivots(tmp_path / "p.jsonl", 3)), output_dir="o")
    assert [t.id for t in load_pivot_set(cfg)] == ["t0/1", "t1/1", "t2/1"]
    assert "pivot_set" not in GRPORunConfig.model_fields and "turns" not in GRPORunConfig.model_fields


def test_prompts_are_one_row_per_pivot_with_its_tools(tiny_model_dir):
    from transformers import AutoTokenizer

    from pivotrl.train.grpo import build_prompts

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    turns = [Turn.model_validate(make_turn(i)) for i in range(3)]
    out = build_prompts(turns, tok, max_prompt_length=None)
    assert len(out.rows) == 3 and not out.dropped
    assert '"get_order"' in out.rows[0]["prompt"] and out.rows[0]["prompt"].endswith("assistant\n")
    assert Turn.model_validate_json(out.rows[1]["turn"]).id == "t1/1"
    short = build_prompts(turns, tok, max_prompt_length=10)
    assert not short.rows and "max_prompt_length" in short.dropped[0][1]


# ---------------------------------------------------------------- one real GRPO step


def completion_logp(model, prompt_ids: list[int], completion_ids: list[int]) -> float:
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logps = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
    target = ids[0, 1:]
    lp = logps.gather(-1, target[:, None]).squeeze(-1)
    return lp[len(prompt_ids) - 1:].sum().item()


@pytest.mark.parametrize("shared_rollouts", [False, True], ids=["trl_rollouts", "shared_rollouts"])
def test_one_grpo_step_moves_rewarded_up_and_unrewarded_down(tmp_path, tiny_model_dir, shared_rollouts):
    """A real TRL optimizer step, with TRL's rollouts and with pivotrl's: completions whose first
    token id is even are rewarded; after the step every rewarded completion's log-probability (on
    the trained model) rose, and the unrewarded ones fell, most of them and on average. (Each
    completion's own term moves it with its advantage's sign; tokens it shares with rewarded
    completions can lift a few unrewarded ones, so "every one fell" depends on the draw.)"""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pivotrl.train.grpo import build_trainer, load_pivot_set

    seen = []

    def parity(prompts, completions, completion_ids, **_):
        rewards = [float(ids[0] % 2 == 0) if ids else 0.0 for ids in completion_ids]
        seen.extend(zip(prompts, completion_ids, rewards))
        return rewards

    cfg = small_config(tmp_path, tiny_model_dir, learning_rate=3e-3, max_steps=1, save_steps=100,
                       num_generations=8, per_device_train_batch_size=16, max_completion_length=8,
                       shared_rollouts=shared_rollouts)
    trainer = build_trainer(cfg, load_pivot_set(cfg), reward_funcs=[parity])
    trainer.train()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    after = trainer.model.eval()
    deltas = {1.0: [], 0.0: []}
    for prompt, ids, reward in seen:
        p = tok(prompt)["input_ids"]
        deltas[reward].append(completion_logp(after, p, list(ids)) - completion_logp(before, p, list(ids)))
    assert deltas[1.0] and deltas[0.0], "the step needs both rewarded and unrewarded completions"
    fell = sum(d < 0 for d in deltas[0.0])
    assert all(d > 0 for d in deltas[1.0]), deltas
    assert sum(deltas[0.0]) < 0 and fell > len(deltas[0.0]) / 2, deltas
    assert trainer.rollout_turns == 16  # 2 pivots × G=8 completions = 16 model turns
    # Tokens, by hand: the one loss forward (one micro-batch, the shared-prefix loss) runs each of
    # the 2 prompts once less its last token, then each row's last prompt token and completion.
    from pivotrl.formats.chat import prompt_token_ids

    prompts = {p: len(prompt_token_ids(tok, p)) for p, _, _ in seen}
    completions = [len(ids) for _, ids, _ in seen]
    assert trainer.shared_prefix and len(prompts) == 2 and len(completions) == 16
    assert trainer.token_counts == {"train_tokens": sum(n - 1 for n in prompts.values()) + sum(completions) + 16,
                                    "rollout_tokens": sum(completions)}


# ---------------------------------------------------------------- CLI, checkpoints, resume


def test_cli_train_checkpoints_metrics_and_resume(tmp_path, tiny_model_dir):
    from typer.testing import CliRunner

    from pivotrl.cli import app

    run_yaml = tmp_path / "run.yaml"
    run_yaml.write_text(yaml.safe_dump({
        "model": str(tiny_model_dir), "pivots": str(write_pivots(tmp_path / "pivots.jsonl", 4)),
        "output_dir": "run", "num_generations": 4, "per_device_train_batch_size": 8,
        "max_completion_length": 8, "learning_rate": 1e-4, "max_steps": 2, "save_steps": 2}))
    runner = CliRunner()
    first = runner.invoke(app, ["train", "--config", str(run_yaml)])
    assert first.exit_code == 0, first.output
    out = tmp_path / "run"
    assert json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["global_step"] == 2
    resumed = runner.invoke(app, ["train", "--config", str(run_yaml), "--resume", "--max-steps", "3"])
    assert resumed.exit_code == 0, resumed.output
    state = json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["global_step"] == 3
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]  # continued, no step repeated
    assert [r["rollout_turns"] for r in rows] == [8, 16, 24]  # counter restored from the checkpoint
    # the token counters too: the third step adds to the first two's (2 pivots × up to 8 new tokens
    # × G=4 generated per step), it does not start again from 0
    for key, most in (("train_tokens", None), ("rollout_tokens", 2 * 4 * 8)):
        steps = [b[key] - a[key] for a, b in zip([{key: 0}] + rows, rows)]
        assert all(0 < n <= (most or n) for n in steps), (key, rows)  # a restart at 0: step 3 < 0
    for key in ("reward_mean", "reward_std", "frac_zero_std", "invalid_rate", "group_std_mean"):
        assert key in rows[-1]
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(out).config.vocab_size > 0
    assert (out / "tokenizer_config.json").exists()
    assert json.loads((out / "template_settings.json").read_text())["chat_template_kwargs"] == {}


def metric_rows_without_times(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if "time" not in k and "second" not in k} for r in rows]


def test_a_resumed_run_is_the_uninterrupted_run(tmp_path, tiny_model_dir):
    """2 steps, then --resume to 4, trains what 4 straight steps train: the same prompts in the
    same order (a resume mid-epoch: 6 pivots, 2 a step), the same samples, the same weights."""
    from safetensors.torch import load_file

    from pivotrl.train.grpo import train

    def parity(prompts, completions, **kwargs):  # mixed outcomes on a random model: the weights move
        return [float(len(str(c)) % 2) for c in completions]

    def run(name: str, steps: int, resume: bool = False) -> Path:
        cfg = small_config(tmp_path, tiny_model_dir, output_dir=str(tmp_path / name), max_steps=steps,
                           resume=resume, pivots=str(write_pivots(tmp_path / "pivots6.jsonl", 6)))
        train(cfg, reward_funcs=[parity])
        return tmp_path / name

    straight = run("straight", 4)
    run("resumed", 2)
    resumed = run("resumed", 4, resume=True)
    assert metric_rows_without_times(resumed) == metric_rows_without_times(straight)
    a, b = load_file(straight / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], load_file(
        straight / "checkpoint-2" / "model.safetensors")["model.embed_tokens.weight"])  # steps 3-4 trained


def test_resume_without_checkpoint_is_a_clear_error(tmp_path, tiny_model_dir):
    from pivotrl.train.grpo import train

    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        train(small_config(tmp_path, tiny_model_dir, resume=True))


def test_reprofiling_samples_as_the_rollouts_unless_told_otherwise():
    from pivotrl.train.grpo import reprofile_config

    cfg = GRPORunConfig(model="m", pivots="p", output_dir="o", temperature=0.8, top_p=0.9, seed=4,
                        verifier="exact", verifier_config={"strict": True}, max_completion_length=40,
                        chat_template_kwargs={"enable_thinking": False}, response_format="hermes",
                        reprofile={"options": {"k": 4}})
    prof = reprofile_config(cfg)
    assert (prof.temperature, prof.top_p, prof.seed, prof.verifier, prof.verifier_config, prof.max_new_tokens,
            prof.chat_template_kwargs, prof.response_format, prof.k) == (
        0.8, 0.9, 4, "exact", {"strict": True}, 40, {"enable_thinking": False}, "hermes", 4)
    with pytest.raises(ValueError, match="kk"):
        reprofile_config(GRPORunConfig(model="m", pivots="p", output_dir="o", reprofile={"options": {"kk": 4}}))


def test_reprofile_hook_stops_reprofiles_and_continues(tmp_path, tiny_model_dir):
    """threshold 0: the hook fires at the first log; the run re-profiles the pivots with the
    current policy (all fail on a random model, so all stay) and continues from the checkpoint."""
    from pivotrl.train.grpo import train

    cfg = small_config(tmp_path, tiny_model_dir, max_steps=3, save_steps=100, reprofile={
        "enabled": True, "threshold": 0.0, "every_n_steps": 100, "options": {"k": 2, "max_new_tokens": 8}})
    summary = train(cfg)
    assert summary["reprofiles"] == 1 and summary["steps"] == 3 and summary["pivots"] == 4
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert (tmp_path / "run" / "checkpoint-1").is_dir()  # the seam the run continued from


def test_lora_run_saves_merged_model_and_adapter(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from pivotrl.train.grpo import train

    cfg = small_config(tmp_path, tiny_model_dir, max_steps=1, save_steps=100, learning_rate=1e-2,
                       lora={"enabled": True, "r": 4, "alpha": 8, "dropout": 0.0})

    def parity(prompts, completions, completion_ids, **_):  # mixed rewards: a real gradient
        return [float(bool(ids) and ids[0] % 2 == 0) for ids in completion_ids]

    train(cfg, reward_funcs=[parity])
    out = tmp_path / "run"
    assert (out / "adapter" / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(out)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert not any("lora" in name for name, _ in merged.named_parameters())
    changed = [n for (n, p), (_, q) in zip(merged.named_parameters(), base.named_parameters())
               if not torch.equal(p, q)]
    assert changed and all("proj" in n for n in changed)  # only adapted linear layers moved


def test_cpu_completion_only_lm_head_gives_the_same_logprobs_and_gradients(tiny_model_dir):
    """score_only_completions_on_cpu changes which positions TRL's fused LM head projects, not
    the numbers: per-token log-probs and the weight gradients match TRL's all-positions path."""
    import trl.trainer.utils as trl_utils
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    from pivotrl.train.trainer import score_only_completions_on_cpu

    torch.manual_seed(0)
    ids = torch.randint(5, 200, (3, 40))
    mask = torch.ones_like(ids)
    mask[0, :7] = 0  # left padding, as TRL pads prompts
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-6] = -100  # only the last 6 tokens (the completion) are scored

    def run(enabled: bool):
        assert score_only_completions_on_cpu(enabled)
        assert trl_utils._use_triton(torch.device("cpu")) is enabled  # which path TRL will take
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        add_fused_lm_head(model)
        out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
        out.log_probs[:, -6:].sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return out.log_probs[:, -6:].detach(), grads

    try:
        full_lp, full_grads = run(False)
        compact_lp, compact_grads = run(True)
    finally:
        score_only_completions_on_cpu(True)
    assert torch.allclose(full_lp, compact_lp, atol=1e-5)
    assert (compact_lp != 0).all()
    assert full_grads.keys() == compact_grads.keys() and full_grads
    for name in full_grads:
        assert torch.allclose(full_grads[name], compact_grads[name], atol=1e-5), name


def test_a_tied_head_is_not_reported_missing_on_resume(tiny_model_dir, monkeypatch):
    """The checkpoint stores a tied LM head once (as the embedding): loading it is not a missing key."""
    import transformers.trainer as hf_trainer
    from transformers import AutoModelForCausalLM

    from pivotrl.train.trainer import PivotGRPOTrainer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.lm_head.weight is model.get_input_embeddings().weight  # tied, as Qwen3-0.6B
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    warned = []
    monkeypatch.setattr(hf_trainer.logger, "warning", lambda msg, *a, **k: warned.append(msg))
    trainer = object.__new__(PivotGRPOTrainer)  # only the load check runs: no trainer set-up
    trainer.model = model
    trainer._issue_warnings_after_load(model.load_state_dict(state, strict=False))
    assert warned == []
    state.pop("model.norm.weight")  # a key really missing still warns, alone
    trainer._issue_warnings_after_load(model.load_state_dict(state, strict=False))
    assert len(warned) == 1 and "model.norm.weight" in warned[0] and "lm_head" not in warned[0]


def test_train_warns_when_its_template_settings_are_not_profilings(tmp_path, tiny_model_dir, monkeypatch, caplog):
    """The pivots' stats carry how they were profiled (select copies PROFILE.stats.json's settings):
    training given other chat-template variables warns (given none, it takes profiling's:
    tests/test_budgets.py); the trained model records its own."""
    import pivotrl.train.grpo as grpo
    from pivotrl.formats.options import recorded_template_settings, template_mismatch, write_template_settings
    from pivotrl.select import SelectConfig, select_file
    from tests.test_select import HARD

    from pivotrl.io.records import write_atomic

    write_atomic(tmp_path / "profile.jsonl", [HARD])
    (tmp_path / "profile.stats.json").write_text(json.dumps({"settings": {
        "model": "m", "chat_template_kwargs": {"enable_thinking": False}, "max_new_tokens": 64}}))
    stats = select_file(tmp_path / "profile.jsonl", tmp_path / "pivots.jsonl", SelectConfig(), plot_png=False)
    assert stats["profile_settings"]["chat_template_kwargs"] == {"enable_thinking": False}

    class Stop(Exception):
        pass

    monkeypatch.setattr(grpo, "load_pivot_set", lambda *a, **k: (_ for _ in ()).throw(Stop()))
    cfg = GRPORunConfig(model=str(tiny_model_dir), pivots=tmp_path / "pivots.jsonl", output_dir=tmp_path / "run")
    with caplog.at_level("WARNING", logger="pivotrl.train.grpo"), pytest.raises(Stop):
        grpo.train(GRPORunConfig(**{**cfg.model_dump(), "chat_template_kwargs": {"enable_thinking": True}}))
    assert "chat_template_kwargs {'enable_thinking': False} there, {'enable_thinking': True} here" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="pivotrl.train.grpo"), pytest.raises(Stop):
        grpo.train(cfg)
    assert "template settings" not in caplog.text
    write_template_settings(tmp_path / "run", {"chat_template_kwargs": {"enable_thinking": False}})
    trained = recorded_template_settings(tmp_path / "run" / "checkpoint-2")  # a checkpoint finds its run's
    assert template_mismatch({}, trained, "evaluate", "training") is not None
    assert template_mismatch({"chat_template_kwargs": {"enable_thinking": False}}, trained, "evaluate",
                             "training") is None


def test_lora_all_linear_on_a_mamba_hybrid_leaves_out_what_peft_refuses(tmp_path):
    """PEFT refuses LoRA on a Mamba mixer's out_proj (Nemotron-H): 'all-linear' leaves it out there."""
    from peft import get_peft_model

    from pivotrl.train.config import LoraOptions
    from pivotrl_testbed.testbed.architectures import build_tiny

    model = build_tiny("nemotron_h", 96)
    model.config.save_pretrained(tmp_path)
    lora = get_peft_model(model, LoraOptions(enabled=True, r=2).peft_config(model=str(tmp_path)))
    names = [n for n, _ in lora.named_parameters() if "lora_A" in n]
    assert names and not any(".mixer.out_proj." in n for n in names)
    assert any("q_proj" in n for n in names)  # attention still adapted
