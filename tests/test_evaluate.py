"""`pivotrl evaluate` on the quick testbed, Wilson intervals, and the distance-to-base statistics."""

from __future__ import annotations

import json
import math

import pytest

from pivotrl_testbed.drift import _spearman_rows
from pivotrl_testbed.evaluate import markdown, wilson


@pytest.mark.parametrize("k,n,lo,hi", [
    # 0/n and n/n: z²/(n+z²) closed forms; 81/263: Wikipedia's closed form, computed separately
    (0, 10, 0.0, 0.27753279),
    (10, 10, 0.72246721, 1.0),
    (5, 10, 0.23659309, 0.76340691),
    (81, 263, 0.25528852, 0.36620958),
    (1, 1, 0.20654931, 1.0),
])
def test_wilson_matches_known_values(k, n, lo, hi):
    got = wilson(k, n)
    assert got[0] == pytest.approx(lo, abs=1e-6) and got[1] == pytest.approx(hi, abs=1e-6)


def test_wilson_degenerate_n():
    assert wilson(0, 0) == (0.0, 1.0)


def test_spearman_rows():
    import torch

    a = torch.tensor([[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]])
    b = torch.tensor([[10.0, 20.0, 30.0, 40.0], [4.0, 3.0, 2.0, 1.0]])
    assert _spearman_rows(a, b).tolist() == pytest.approx([1.0, -1.0])


def _check_shape(result):
    assert set(result["in_domain"]) == {"toolshop", "terminal"}
    for v in result["in_domain"].values():
        assert 0 <= v["ci95"][0] <= v["success"] <= v["ci95"][1] <= 1
        assert isinstance(v["episodes"], int) and v["episodes"] > 0
        assert 0 <= v["turn_accuracy"] <= 1
    assert len(result["ood"]) >= 3
    for v in result["ood"].values():
        assert 0 <= v["ci95"][0] <= v["accuracy"] <= v["ci95"][1] <= 1
        assert isinstance(v["n"], int) and v["n"] > 0


def test_build_writes_the_contract_layout_and_is_cached(quick_testbed):
    from pivotrl.io.records import Trajectory, iter_valid
    from pivotrl_testbed.testbed.build import TestbedConfig, build_testbed

    out, info = quick_testbed
    assert not info["cached"]
    for world in ("toolshop", "terminal"):
        for split in ("train", "eval"):
            trajs = list(iter_valid(out / world / f"{split}.jsonl", Trajectory))
            assert trajs and all(t.metadata["split"] == split for t in trajs)
            assert all(t.metadata["success"] for t in trajs)  # expert trajectories
    assert (out / "ood" / "train.jsonl").exists() and (out / "ood" / "eval.jsonl").exists()
    assert (out / "base" / "config.json").exists() and (out / "base" / "tokenizer.json").exists()
    build = json.loads((out / "build.json").read_text())
    assert build["parameters"] > 0 and build["build_seconds"] > 0 and build["config_hash"]
    _check_shape(build["base"])
    # the record says where pivots can be: per world and turn position, the per-sample success
    for world in ("toolshop", "terminal"):
        turns = list(iter_valid(out / world / "train.jsonl", Trajectory))
        by_position = build["base"]["by_position"][world]
        assert sum(p["turns"] for p in by_position.values()) == sum(
            m.role == "assistant" for t in turns for m in t.messages)
        assert all(0 <= p["q"] <= 1 and 0 <= p["mixed"] <= 1 for p in by_position.values())
    # the build's log: each stage with its time, pretraining with its rate and ETA
    log = (out / "build.log").read_text()
    steps = build["config"]["pretrain"]["steps"]
    for stage in ("expert trajectories", "tokenizer", "pretraining the base", "measuring the base"):
        assert stage in log, stage
    assert f"pretraining the base: step {steps}/{steps} · " in log and "ETA" in log
    before = (out / "build.json").stat().st_mtime_ns
    again = build_testbed(out, TestbedConfig().quick())
    assert again["cached"] and (out / "build.json").stat().st_mtime_ns == before
    # another config is not a cache hit
    other = TestbedConfig().quick().model_copy(update={"n_eval": 9})
    from pivotrl_testbed.testbed.build import is_built
    assert not is_built(out, other)


def test_evaluate_cli_writes_contract_json_and_markdown(quick_testbed, tmp_path):
    from typer.testing import CliRunner

    from pivotrl.cli import app

    out, _ = quick_testbed
    result_path = tmp_path / "res" / "RESULT.json"
    run = CliRunner().invoke(app, ["testbed", "evaluate", "--model", str(out / "base"), "--testbed", str(out),
                                   "--out", str(result_path), "--episodes", "3",
                                   "--turn-trajectories", "1", "--ood", "4"])
    assert run.exit_code == 0, run.output
    result = json.loads(result_path.read_text())
    _check_shape(result)
    assert all(v["episodes"] == 3 for v in result["in_domain"].values())
    assert all(v["n"] == 4 for v in result["ood"].values())
    md = result_path.with_suffix(".md").read_text()
    assert "| toolshop |" in md and "| next |" in md
    assert markdown(result) == md


def test_evaluate_cli_rejects_missing_dirs(tmp_path):
    from typer.testing import CliRunner

    from pivotrl.cli import app

    run = CliRunner().invoke(app, ["testbed", "evaluate", "--model", str(tmp_path / "nope"), "--testbed",
                                   str(tmp_path), "--out", str(tmp_path / "r.json")])
    assert run.exit_code == 2 and "not a directory" in run.output


def test_ood_logprob_stats(tiny_model_dir):
    import torch

    from pivotrl_testbed.drift import ood_logprob_stats
    from pivotrl_testbed.testbed.tiny import load_tiny

    model, tok = load_tiny(tiny_model_dir)
    texts = ["<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<|im_start|>assistant\n7<|im_end|>\n",
             "<|im_start|>user\nReverse abc.<|im_end|>\n<|im_start|>assistant\ncba<|im_end|>\n"]
    same = ood_logprob_stats(model, model, tok, texts)
    assert same["kl"] == pytest.approx(0.0, abs=1e-6) and same["rank_corr"] == pytest.approx(1.0)
    other, _ = load_tiny(tiny_model_dir)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    moved = ood_logprob_stats(other, model, tok, texts)
    assert moved["kl"] > 0.01 and moved["rank_corr"] < 0.99
    assert moved["positions"] == same["positions"] > 0
    assert math.isfinite(moved["kl"])


def test_the_summary_keeps_the_agentic_format_families_apart():
    from pivotrl_testbed.evaluate import summary

    result = {"in_domain": {"toolshop": {"success": 0.5}},
              "ood": {"next": {"accuracy": 1.0}, "reverse": {"accuracy": 0.8},
                      "plain_with_tools": {"accuracy": 0.2}}}
    s = summary(result)
    assert s["ood"] == pytest.approx(0.9) and s["agentic_ood"] == pytest.approx(0.2)
    assert "agentic_ood" not in summary({"ood": {"next": {"accuracy": 1.0}}})


def test_an_earlier_result_as_config_scores_the_next_model_the_same_way(tmp_path):
    """`evaluate --config A.json` takes A's scoring settings (budget, verifier, template kwargs,
    samples, seed), so `compare` pairs the two; compare's refusal names that fix."""
    from pivotrl.cli.evaluate import run_settings
    from pivotrl.evaluate.compare import SCORING_SETTINGS, compare_results

    settings = {"verifier": "toolcall", "verifier_config": {}, "samples": 1, "temperature": 0.0, "top_p": 1.0,
                "max_new_tokens": 48, "seed": 0, "chat_template_kwargs": {"enable_thinking": False},
                "response_format": None, "success_threshold": 1.0, "backend": "hf", "limit": None}
    a = tmp_path / "a.json"
    a.write_text(json.dumps({"model": "m", "turns_file": "t.jsonl", "settings": settings}))
    taken = run_settings(a)
    assert taken == {k: settings[k] for k in SCORING_SETTINGS} and "backend" not in taken
    b = tmp_path / "b.json"
    b.write_text(json.dumps({"model": "n", "turns_file": "t.jsonl", "settings": {**settings, "max_new_tokens": 256}}))
    with pytest.raises(ValueError, match=rf"--max-new-tokens 256 vs 48.*--config {a}"):
        compare_results([a, b], tmp_path / "c.json")
