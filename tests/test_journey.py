"""The user's path through the command line, as a user runs it, so that it cannot go stale.

1. The whole path on one model (the testbed's shipped base, Hermes calls, on examples/): extract
   -> profile -> select -> train -> sft -> evaluate (as trained) -> compare -> export/import.
2. The model-sensitive verbs (`profile`, `train`, `sft`, `evaluate`) on each model kind people
   bring, each a tiny random model of its family's own transformers config class carrying its
   family's TRL chat template (a byte-level tokenizer, tests/test_families.py's `make_tokenizer`):
   a Qwen3 thinking template, a Qwen3-MoE with `output_router_logits: true`, a Qwen3.5 hybrid
   (Gated DeltaNet + attention) trained with LoRA, a Llama 3 with tied embeddings and gpt-oss's
   Harmony format.

Every verb runs in-process (typer's CliRunner on `pivotrl.cli.app`), and each step checks what it
wrote (metrics rows, a saved model that loads, the eval result's fields, pivot counts, the same
turns back from an import), not only the exit code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_families import TOOLS, VOCAB, make_tokenizer
from typer.testing import CliRunner

from pivotrl.cli import app
from pivotrl.io.records import Turn
from pivotrl.io.turn_files import read_turns as read_turn_file

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "trajectories.jsonl"
SHIPPED_BASE = ROOT / "src" / "pivotrl_testbed" / "testbed" / "shipped_base" / "base"


def pivotrl(*argv: str | Path) -> str:
    """Run `pivotrl ARGV` in-process; its console output (a failure shows the command and it)."""
    args = [str(a) for a in argv]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, f"pivotrl {' '.join(args)}\n{result.output}\n{result.exception!r}"
    return result.output


def read_turns(path: Path) -> list:
    """The turns of a turns or pivots file (compact rows expanded); a bad line fails the test."""
    turns, rejects = read_turn_file(path)
    assert not rejects, rejects
    return [turn for _, turn in turns]


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def trained_rows(run: Path) -> list[dict]:
    """metrics.jsonl's rows of a logged optimizer step."""
    return [r for r in jsonl(run / "metrics.jsonl") if "loss" in r]


def saved_model(run: Path, base: Path, moved: bool = True):
    """The saved model: it loads, with the base's weights' names (a LoRA run saves the merged
    model), and, when `moved`, training changed them (a GRPO step whose groups all scored 0 has
    no advantage to follow, so a random model's weights stay put)."""
    from transformers import AutoModelForCausalLM

    trained = AutoModelForCausalLM.from_pretrained(run)
    start = AutoModelForCausalLM.from_pretrained(base).state_dict()
    assert trained.state_dict().keys() == start.keys()
    if moved:
        assert any(not torch.equal(w, start[k]) for k, w in trained.state_dict().items()), run
    return trained


# ---------------------------------------------------------------- the whole path, one model


def test_the_whole_path_on_the_shipped_base(tmp_path):
    base = SHIPPED_BASE
    data = tmp_path / "trajectories.jsonl"
    data.write_text("".join(EXAMPLES.read_text().splitlines(keepends=True)[:12]))
    turns, profile, pivots = tmp_path / "turns.jsonl", tmp_path / "profile.jsonl", tmp_path / "pivots.jsonl"

    pivotrl("extract", data, "--out", turns, "--eval-fraction", "0.34")
    split = json.loads((tmp_path / "turns.split.json").read_text())
    assert len(split["eval"]) == 4 and len(split["train"]) == 8
    train_turns = read_turns(turns)
    eval_turns = read_turns(tmp_path / "turns.eval.jsonl")
    assert {t.trajectory_id for t in train_turns} == set(split["train"])
    assert {t.trajectory_id for t in eval_turns} == set(split["eval"])

    pivotrl("profile", turns, "--model", base, "--k", "4", "--max-new-tokens", "24", "--out", profile,
            "--no-progress")
    profiled = jsonl(profile)
    assert sorted(p["id"] for p in profiled) == sorted(t.id for t in train_turns)
    assert all(p["k"] == len(p["samples"]) == 4 for p in profiled)

    pivotrl("select", profile, "--out", pivots, "--no-plot")
    kept = jsonl(pivots)
    rates = {p["id"]: sum(s["reward"] >= 0.5 for s in p["samples"]) / 4 for p in profiled}
    assert kept and [p["id"] for p in kept] == [i for i, r in rates.items() if 0 < r < 0.75]
    stats = json.loads((tmp_path / "pivots.stats.json").read_text())
    assert stats["turns"] == len(profiled) and stats["kept"] == len(kept), stats
    assert stats["all_fail"] + stats["all_pass"] + stats["mixed"] == len(profiled), stats

    run = tmp_path / "pivotrl"
    pivotrl("train", "--pivots", pivots, "--model", base, "--output-dir", run, "--max-steps", "1",
            "--num-generations", "4", "--progress-seconds", "0")
    assert [r["step"] for r in trained_rows(run)] == [1]
    trained_with = json.loads((run / "template_settings.json").read_text())
    assert trained_with["max_new_tokens"] == 24, trained_with  # profiling's budget, not the default
    saved_model(run, base)

    sft = tmp_path / "sft"
    pivotrl("sft", "--data", data, "--split", tmp_path / "turns.split.json", "--model", base,
            "--output-dir", sft, "--max-steps", "1", "--progress-seconds", "0")
    assert [r["step"] for r in trained_rows(sft)] == [1]
    saved_model(sft, base)

    results = {}
    # PivotRL's model is scored as trained, with nothing repeated; the SFT run samples nothing, so
    # its budget is given (compare refuses results scored with different budgets).
    for name, flags in (("pivotrl", []), ("sft", ["--max-new-tokens", "24"])):
        out = tmp_path / f"{name}.eval.json"
        pivotrl("evaluate", "--model", tmp_path / name, "--turns", tmp_path / "turns.eval.jsonl", "--out", out,
                *flags)
        results[name] = json.loads(out.read_text())
        assert results[name]["turns"] == len(eval_turns) and results[name]["split"]["turns_not_held_out"] == 0
        assert 0.0 <= results[name]["accuracy"] <= 1.0
    assert results["pivotrl"]["settings"]["max_new_tokens"] == 24
    assert "warnings" not in results["pivotrl"]

    pivotrl("compare", "--result", tmp_path / "pivotrl.eval.json", "--result", tmp_path / "sft.eval.json",
            "--out", tmp_path / "compare.json")
    [pair] = json.loads((tmp_path / "compare.json").read_text())["pairs"]
    assert pair["a"].endswith("pivotrl") and pair["b"].endswith("sft") and pair["pairs"] == len(eval_turns)
    assert pair["diff"] == pytest.approx(results["pivotrl"]["accuracy"] - results["sft"]["accuracy"])
    assert pair["verdict"] in ("met", "not met", "within noise")

    # Out to the other engines and back: the same turns (the Turn's own fields; a pivot's samples
    # are not a turn's).
    def as_turns(path: Path) -> dict[str, dict]:
        return {t.id: t.model_dump(mode="json", include=set(Turn.model_fields)) for t in read_turns(path)}

    want = as_turns(pivots)
    for engine, rows in (("nemo-gym", tmp_path / "pivots.nemo.jsonl"), ("verl", tmp_path / "pivots.parquet")):
        back = tmp_path / f"pivots.from-{engine}.jsonl"
        pivotrl("export", pivots, "--format", engine, "--out", rows)
        pivotrl("import", engine, rows, "--out", back)
        assert as_turns(back) == want, engine


# ---------------------------------------------------------------- each model kind


def _trajectory(i: int) -> dict:
    call = {"id": "c0", "type": "function", "function": {
        "name": "cancel_order", "arguments": json.dumps({"order_id": f"7500{i}", "quantity": i + 1})}}
    return {"id": f"order-{i}", "tools": TOOLS, "messages": [
        {"role": "system", "content": "You help with orders."},
        {"role": "user", "content": f"Cancel {i + 1} items of order 7500{i}."},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c0", "content": '{"ok": true}'},
        {"role": "assistant", "content": "Done."}]}


@pytest.fixture(scope="module")
def orders(tmp_path_factory):
    """Three short order trajectories, extracted with one held out: (folder, train turns, eval turns)."""
    folder = tmp_path_factory.mktemp("orders")
    (folder / "trajectories.jsonl").write_text("".join(json.dumps(_trajectory(i)) + "\n" for i in range(3)))
    pivotrl("extract", folder / "trajectories.jsonl", "--out", folder / "turns.jsonl", "--eval-fraction", "0.34")
    return folder, read_turns(folder / "turns.jsonl"), read_turns(folder / "turns.eval.jsonl")


def _attention(width: int = 32) -> dict:
    return dict(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=width // 4)


def _llama3_tied(vocab: int, tok):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab, tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                       eos_token_id=tok.eos_token_id, max_position_embeddings=4096, **_attention())


def _gpt_oss(vocab: int, tok):
    from transformers import GptOssConfig

    # max_position_embeddings = YaRN's 4096 × its factor 32, as gpt-oss ships it.
    return GptOssConfig(vocab_size=vocab, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=131072,
                        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **_attention())


def _architecture(name: str, **overrides):
    def config(vocab: int, tok):
        from pivotrl_testbed.testbed.architectures import tiny_config

        return tiny_config(name, vocab, **overrides)
    return config


# kind -> (TRL chat template, tokenizer prepends BOS, config builder, extra `train` flags)
KINDS = {
    "qwen3-thinking": ("qwen3", False, _architecture("qwen3"), []),
    "qwen3-moe-router-logits": ("qwen3", False, _architecture("qwen3_moe", output_router_logits=True), []),
    "qwen3.5-hybrid-lora": ("qwen3_5_think", False, _architecture("qwen3_5"), ["--lora", "{enabled: true}"]),
    "llama3-tied": ("llama3_1", True, _llama3_tied, []),
    "gpt-oss-harmony": ("gptoss", False, _gpt_oss, []),
}
BUDGET = 4  # tokens per sample: a thinking family's default (4096) would take minutes


def tiny_checkpoint(kind: str, path: Path) -> Path:
    """A random tiny model of `kind` saved with its family's tokenizer (a folder every verb reads)."""
    from transformers import AutoModelForCausalLM

    template, add_bos, config, _ = KINDS[kind]
    tok = make_tokenizer(template, add_bos=add_bos)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config(VOCAB, tok), dtype=torch.float32)
    for config in (model.config, model.generation_config):  # the tokenizer's, as a real checkpoint has
        config.eos_token_id, config.pad_token_id = tok.eos_token_id, tok.pad_token_id
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_profile_train_sft_evaluate_on_each_model_kind(kind, orders, tmp_path):
    from transformers import AutoConfig

    folder, train_turns, eval_turns = orders
    base = tiny_checkpoint(kind, tmp_path / "base")
    base_config = json.loads((base / "config.json").read_text())

    profile = tmp_path / "profile.jsonl"
    pivotrl("profile", folder / "turns.jsonl", "--model", base, "--k", "2", "--max-new-tokens", BUDGET,
            "--out", profile, "--no-progress")
    profiled = jsonl(profile)
    assert sorted(p["id"] for p in profiled) == sorted(t.id for t in train_turns)
    assert all(p["k"] == 2 and all(s["tokens"] <= BUDGET for s in p["samples"]) for p in profiled)
    totals = json.loads((tmp_path / "profile.stats.json").read_text())["totals"]
    cut = sum(s["finish_reason"] == "length" for p in profiled for s in p["samples"])
    assert totals["rollout_turns"] == 2 * len(profiled) and totals["truncated_samples"] == cut

    run = tmp_path / "pivotrl"
    pivotrl("train", "--pivots", folder / "turns.jsonl", "--model", base, "--output-dir", run, "--max-steps", "1",
            "--num-generations", "2", "--max-completion-length", BUDGET, "--learning-rate", "1e-3",
            "--save-steps", "10", "--progress-seconds", "0", *KINDS[kind][3])
    [row] = trained_rows(run)
    assert row["step"] == 1 and row["rollout_turns"] > 0 and {"truncated_rate", "invalid_rate"} <= set(row)
    sft = tmp_path / "sft"
    pivotrl("sft", "--data", folder / "trajectories.jsonl", "--split", folder / "turns.split.json",
            "--model", base, "--output-dir", sft, "--max-steps", "1", "--learning-rate", "1e-3",
            "--per-device-train-batch-size", "2", "--progress-seconds", "0")
    [sft_row] = trained_rows(sft)
    assert sft_row["step"] == 1
    if base_config.get("output_router_logits"):  # the router's load-balancing loss is logged
        assert "aux_loss" in row and "aux_loss" in sft_row, (row, sft_row)

    from pivotrl.train.saved_config import SAVED_CONFIG_KEYS, config_differences

    may_change = {key for key, (saved, _) in SAVED_CONFIG_KEYS.items() if saved == "trained"}
    for trained in (run, sft):
        # The saved model loads as the base's architecture, with the base's config but for the
        # keys training may change (one list, with why: pivotrl.train.saved_config).
        assert set(config_differences(base, trained)) <= may_change, (trained.name, config_differences(base, trained))
        model = saved_model(trained, base, moved=trained == sft)
        assert type(model).__name__ == AutoConfig.from_pretrained(base).architectures[0]
        if base_config.get("tie_word_embeddings"):
            assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    if "--lora" in KINDS[kind][3]:
        assert (run / "adapter" / "adapter_config.json").is_file()

    out = tmp_path / "pivotrl.eval.json"
    pivotrl("evaluate", "--model", run, "--turns", folder / "turns.eval.jsonl", "--out", out)
    result = json.loads(out.read_text())
    assert result["turns"] == len(eval_turns) and result["split"]["turns_not_held_out"] == 0
    assert result["samples"] == len(eval_turns) and 0.0 <= result["accuracy"] <= 1.0
    # As trained: the budget `train` used, not the family's default.
    assert result["settings"]["max_new_tokens"] == BUDGET and "warnings" not in result, result
