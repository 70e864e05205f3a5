"""Shipped example configs: each loads into its config model, and sets only what it changes (a
restated default is a second place for the same number, and drifts)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pivotrl_testbed.e2e_config import E2ERunConfig
from pivotrl.profile.loop import ProfileConfig
from pivotrl.train.config import GRPORunConfig, SFTRunConfig

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
EXAMPLES = {"profile.yaml": ProfileConfig, "train_testbed.yaml": GRPORunConfig,
            "sft_testbed.yaml": SFTRunConfig, "e2e_testbed.yaml": E2ERunConfig}


def restated_defaults(model, data: dict) -> list[str]:
    out = []
    for key, value in data.items():
        info = model.model_fields[key]
        if info.is_required():
            continue
        default = info.get_default(call_default_factory=True)
        if hasattr(default, "model_dump"):
            default = default.model_dump(mode="json")
        if value == default:
            out.append(key)
    return out


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_config_loads_and_restates_no_default(name):
    model = EXAMPLES[name]
    data = yaml.safe_load((CONFIGS / name).read_text()) or {}
    assert set(data) <= set(model.model_fields), set(data) - set(model.model_fields)
    assert restated_defaults(model, data) == []
    model.from_yaml(CONFIGS / name)  # relative paths resolve; every value validates


def test_the_check_sees_a_restated_default():
    assert restated_defaults(GRPORunConfig, {"epsilon": 0.2, "num_generations": 8}) == ["epsilon"]
    assert restated_defaults(ProfileConfig, {"k": 8}) == ["k"]


def test_precedence_defaults_then_yaml_then_flags(tmp_path):
    run = tmp_path / "run.yaml"
    run.write_text("model: m\noutput_dir: out\npivots: p.jsonl\nlearning_rate: 3.0e-4\nnum_generations: 4\n")
    cfg = GRPORunConfig.from_yaml(run, learning_rate=1e-4, max_steps=None)
    assert cfg.learning_rate == 1e-4            # the flag wins over the YAML
    assert cfg.num_generations == 4             # the YAML wins over the default
    assert cfg.epsilon == 0.2                   # the default
    assert cfg.pivots == tmp_path / "p.jsonl"   # YAML paths are relative to the YAML
    with pytest.raises(ValueError, match="learning_rat"):
        GRPORunConfig.from_yaml(run, learning_rat=1.0)  # a typo is an error, never ignored
    # no YAML at all: the required fields come from the overrides
    cfg = GRPORunConfig.from_yaml(None, model="m", output_dir="o", pivots="p.jsonl")
    assert cfg.pivots == Path("p.jsonl")


@pytest.mark.parametrize("verb, model, skip", [("profile", ProfileConfig, {"engine", "verifier_config"}),
                                               ("train", GRPORunConfig, set()),
                                               ("sft", SFTRunConfig, set()),
                                               ("e2e", E2ERunConfig, set())])
def test_every_config_field_is_a_flag_with_the_models_help(verb, model, skip):
    from typer.testing import CliRunner

    from pivotrl.cli import app

    result = CliRunner().invoke(app, [verb, "--help"], env={"COLUMNS": "400", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    for name, info in model.model_fields.items():
        if name in skip:
            continue
        assert "--" + name.replace("_", "-") in result.output, name
        assert info.description.split()[0] in result.output, name


def test_flags_override_yaml_through_the_command_line(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import pivotrl.train.grpo as grpo
    from pivotrl.cli import app

    seen = {}
    monkeypatch.setattr(grpo, "train", lambda cfg, **_: seen.setdefault("cfg", cfg) and {})
    run = tmp_path / "run.yaml"
    run.write_text("model: m\noutput_dir: out\npivots: p.jsonl\nlearning_rate: 3.0e-4\n")
    result = CliRunner().invoke(app, ["train", "--config", str(run), "--learning-rate", "1e-5",
                                      "--lora", "{enabled: true, r: 4}", "--no-shared-prefix-loss"])
    assert result.exit_code == 0, result.output
    cfg = seen["cfg"]
    assert (cfg.learning_rate, cfg.lora.enabled, cfg.lora.r, cfg.shared_prefix_loss) == (1e-5, True, 4, False)
    # a typo'd value is one line naming the field, no traceback
    result = CliRunner().invoke(app, ["train", "--config", str(run), "--num-generations", "x"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    result = CliRunner().invoke(app, ["train", "--config", str(run), "--scale-rewards", "everything"])
    assert result.exit_code == 2 and "scale_rewards" in result.output and "Traceback" not in result.output


def config_models():
    """Every config model of the library and the testbed: the pydantic models of their modules that
    a user writes (not the API bodies of `pivotrl serve`, nor the sampler's SamplingParams)."""
    import importlib
    import inspect
    import pkgutil

    from pydantic import BaseModel

    import pivotrl
    import pivotrl_testbed

    skip = ("pivotrl.cli", "pivotrl_testbed.cli", "pivotrl.sampling.vllm", "pivotrl.sampling.serve",
            "pivotrl.sampling.base")
    found = set()
    for pkg in (pivotrl, pivotrl_testbed):
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            if info.name.startswith(skip) or ".testbed." in info.name:
                continue
            try:
                module = importlib.import_module(info.name)
            except ImportError:
                continue
            found |= {c for _, c in inspect.getmembers(module, inspect.isclass)
                      if issubclass(c, BaseModel) and c.__module__ == info.name}
    return found


def test_each_options_block_is_declared_once():
    """Sampling, verifier and format options: one declaration each, embedded in every config that
    takes them; no config declares a field of a block on its own (help and bounds would drift)."""
    from pivotrl.evaluate.turns import TurnEvalConfig
    from pivotrl.formats.options import FormatOptions
    from pivotrl.sampling.options import SamplingOptions
    from pivotrl.verifiers.options import VerifierOptions

    embeds = {SamplingOptions: {ProfileConfig, TurnEvalConfig, GRPORunConfig, E2ERunConfig},
              VerifierOptions: {ProfileConfig, TurnEvalConfig, GRPORunConfig},
              FormatOptions: {ProfileConfig, TurnEvalConfig, GRPORunConfig}}
    models = config_models()
    assert {ProfileConfig, TurnEvalConfig, GRPORunConfig, SFTRunConfig, E2ERunConfig} <= models
    for block, configs in embeds.items():
        assert all(issubclass(c, block) for c in configs), block
        for model in models - {block}:
            for name, info in block.model_fields.items():
                if name in model.model_fields:
                    # re-defaulted only through io.yaml_config.field_like: the block's help, a note added
                    assert model.model_fields[name].description.startswith(info.description), (model, name)


def test_grpo_batch_follows_the_group_size_and_has_no_shadowed_default():
    base = dict(model="m", output_dir="o", pivots="p")
    assert GRPORunConfig.model_fields["per_device_train_batch_size"].default is None
    assert GRPORunConfig(**base).per_device_train_batch_size == 64
    assert GRPORunConfig(**base, num_generations=4).per_device_train_batch_size == 16
    assert GRPORunConfig(**base, num_generations=4, per_device_train_batch_size=8).per_device_train_batch_size == 8


def test_help_shows_bracketed_text_and_promises_only_what_is_written():
    """Help is rich markup: `pivotrl[vllm]` must not lose its extra; `evaluate` writes no RESULT.md."""
    from typer.testing import CliRunner

    from pivotrl.cli import app

    train = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "400", "NO_COLOR": "1"})
    assert "pip install pivotrl[vllm]" in train.output
    evaluate = CliRunner().invoke(app, ["evaluate", "--help"], env={"COLUMNS": "400", "NO_COLOR": "1"})
    assert evaluate.exit_code == 0 and ".md" not in evaluate.output


def test_the_testbed_folder_the_readme_builds_is_ignored_by_git():
    import subprocess

    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    ignored = subprocess.run(["git", "check-ignore", "-q", "testbed/base/config.json"], cwd=root)
    assert ignored.returncode == 0
