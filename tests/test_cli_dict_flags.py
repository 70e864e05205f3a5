"""Dict-valued flags (`--chat-template-kwargs`, `--verifier-config`, `--trl-overrides`) take inline
YAML, inline JSON or a YAML file on every verb that has them, and `evaluate` / `compare` take the
run's config (`--config`) so a model is scored with the template and budget it was trained with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pivotrl.cli import app

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "trajectories.jsonl"


def run(*argv):
    return CliRunner().invoke(app, list(map(str, argv)), env={"COLUMNS": "400", "NO_COLOR": "1"})


class Captured(Exception):
    pass


@pytest.fixture(scope="module")
def turns(tmp_path_factory):
    from pivotrl.extract import extract_file

    path = tmp_path_factory.mktemp("flags") / "turns.jsonl"
    extract_file(EXAMPLE, path)
    return path


@pytest.fixture
def capture(monkeypatch):
    """Replace a library entry point with one that keeps the config it was given and stops."""
    seen = {}

    def patch(target: str, cfg_arg: int | str):
        import importlib

        module, name = target.rsplit(".", 1)

        def stop(*args, **kwargs):
            seen["cfg"] = kwargs[cfg_arg] if isinstance(cfg_arg, str) else args[cfg_arg]
            raise Captured

        monkeypatch.setattr(importlib.import_module(module), name, stop)
        return seen
    return patch


VALUES = {"chat_template_kwargs": {"enable_thinking": False, "depth": 2},
          "verifier_config": {"strict": True}, "trl_overrides": {"adam_beta2": 0.95, "optim": "adamw_torch"}}


def spellings(value: dict, tmp_path: Path) -> list[str]:
    """Inline YAML (flow style), inline JSON, and a YAML file."""
    import yaml

    yaml_file = tmp_path / "value.yaml"
    yaml_file.write_text(yaml.safe_dump(value))
    return [yaml.safe_dump(value, default_flow_style=True).strip(), json.dumps(value), str(yaml_file)]


def verb_args(verb: str, turns: Path, model: Path, tmp_path: Path) -> list:
    return {"train": ["train", "--pivots", turns, "--model", model, "--output-dir", tmp_path / "o"],
            "sft": ["sft", "--data", EXAMPLE, "--model", model, "--output-dir", tmp_path / "o"],
            "profile": ["profile", turns, "--model", model, "--out", tmp_path / "p.jsonl"],
            "evaluate": ["evaluate", "--model", model, "--turns", turns, "--out", tmp_path / "r.json"],
            "compare": ["compare", "--model", model, "--model", model, "--turns", turns,
                        "--out", tmp_path / "c.json"]}[verb]


TARGETS = {"train": ("pivotrl.train.grpo.train", 0), "sft": ("pivotrl.train.sft.train_sft", 0),
           "profile": ("pivotrl.profile.runs.profile_file", 5),
           "evaluate": ("pivotrl.evaluate.turns.evaluate_turns_file", 5),
           "compare": ("pivotrl.evaluate.compare.compare_models", 4)}
FLAGS = {"train": ("chat_template_kwargs", "verifier_config", "trl_overrides"),
         "sft": ("chat_template_kwargs", "trl_overrides"),
         "profile": ("chat_template_kwargs", "verifier_config"),
         "evaluate": ("chat_template_kwargs", "verifier_config"),
         "compare": ("chat_template_kwargs", "verifier_config")}


@pytest.mark.parametrize("verb", sorted(FLAGS))
def test_dict_flags_take_yaml_json_or_a_file(verb, turns, tiny_model_dir, tmp_path, capture):
    target, cfg_arg = TARGETS[verb]
    for field in FLAGS[verb]:
        # the verifier must accept the options it is given: `exact` takes `strict`
        extra = ["--verifier", "exact"] if field == "verifier_config" else []
        for text in spellings(VALUES[field], tmp_path):
            seen = capture(target, cfg_arg)
            flag = "--" + field.replace("_", "-")
            result = run(*verb_args(verb, turns, tiny_model_dir, tmp_path), *extra, flag, text)
            assert isinstance(result.exception, Captured), (verb, flag, text, result.output)
            assert getattr(seen["cfg"], field) == VALUES[field], (verb, flag, text)


def test_a_long_inline_mapping_is_not_taken_for_a_file_name():
    from pivotrl.io.run_config import mapping_value

    value = {f"key_{i}": i for i in range(60)}  # about 700 characters, no slash
    assert mapping_value("--trl-overrides", json.dumps(value)) == value


def test_a_dict_flag_that_is_not_a_mapping_names_the_flag(turns, tiny_model_dir, tmp_path):
    result = run(*verb_args("train", turns, tiny_model_dir, tmp_path), "--chat-template-kwargs",
                 "enable_thinking")
    assert result.exit_code == 2
    assert "--chat-template-kwargs" in result.output and "expected a mapping" in result.output


@pytest.mark.parametrize("verb", ["evaluate", "compare"])
def test_evaluate_and_compare_take_the_runs_config(verb, turns, tiny_model_dir, tmp_path, capture):
    run_yaml = tmp_path / "train.yaml"
    run_yaml.write_text("pivots: p.jsonl\nmodel: m\noutput_dir: o\nlearning_rate: 1.0e-4\n"
                        "chat_template_kwargs: {enable_thinking: false}\nmax_completion_length: 48\n"
                        "verifier: exact\nverifier_config: {strict: true}\n")
    target, cfg_arg = TARGETS[verb]
    seen = capture(target, cfg_arg)
    result = run(*verb_args(verb, turns, tiny_model_dir, tmp_path), "--config", run_yaml)
    assert isinstance(result.exception, Captured), result.output
    cfg = seen["cfg"]
    assert (cfg.chat_template_kwargs, cfg.max_new_tokens, cfg.verifier, cfg.verifier_config) == (
        {"enable_thinking": False}, 48, "exact", {"strict": True})
    assert cfg.temperature == 0.0  # evaluation keeps its own greedy sampling
    # flags win over the config
    seen = capture(target, cfg_arg)
    result = run(*verb_args(verb, turns, tiny_model_dir, tmp_path), "--config", run_yaml,
                 "--max-new-tokens", "12")
    assert seen["cfg"].max_new_tokens == 12


def test_a_misspelt_key_in_the_config_is_an_error(turns, tiny_model_dir, tmp_path):
    bad = tmp_path / "eval.yaml"
    bad.write_text("temprature: 0.5\n")
    result = run(*verb_args("evaluate", turns, tiny_model_dir, tmp_path), "--config", bad)
    assert result.exit_code == 2 and "temprature" in result.output


def test_compare_help_names_only_options_it_has():
    from typer.main import get_command

    verbs = get_command(app).commands
    for verb in ("compare", "evaluate"):
        opts = {o for p in verbs[verb].params for o in p.opts}
        assert "--config" in opts  # the config-fields panel says they override --config
        assert "--config" in run(verb, "--help").output


def test_the_result_records_the_template_and_the_budget_it_used(turns, tiny_model_dir, tmp_path):
    out = tmp_path / "r.json"
    result = run("evaluate", "--model", tiny_model_dir, "--turns", turns, "--out", out, "--limit", "2",
                 "--chat-template-kwargs", "{enable_thinking: false}")
    assert result.exit_code == 0, result.output
    settings = json.loads(out.read_text())["settings"]
    assert settings["chat_template_kwargs"] == {"enable_thinking": False}
    assert settings["max_new_tokens"] == 256  # the model's budget, as used (not null)
