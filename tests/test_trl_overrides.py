"""`trl_overrides` hold only what pivotrl does not model: every field pivotrl derives for TRL's
GRPOConfig and SFTConfig is refused there, with the flag to use (one test per field, the list read
from the code that derives them); a key TRL does not have is an error naming it; each value is
checked against the TRL field's type; and what is left reaches TRL's config."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from pivotrl.train.config import GRPORunConfig, SFTRunConfig
from pivotrl.train.grpo import grpo_config, grpo_kwargs
from pivotrl.train.sft import sft_config, sft_kwargs

STEPS = 10
# The base run uses vLLM with a prompt cap, so that every field grpo_kwargs can derive is derived.
GRPO_BASE = dict(model="m", output_dir="/tmp/pivotrl-overrides", pivots="p", max_completion_length=64,
                 max_prompt_length=100, use_vllm=True)
SFT_BASE = dict(model="m", output_dir="/tmp/pivotrl-overrides", data="d")
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "trajectories.jsonl"


def derived_grpo() -> list[str]:
    return sorted(grpo_kwargs(GRPORunConfig(**GRPO_BASE), STEPS))


def derived_sft() -> list[str]:
    return sorted(sft_kwargs(SFTRunConfig(**SFT_BASE), STEPS))


def refused(config: type, base: dict, field: str, value=1) -> str:
    with pytest.raises(ValueError) as info:
        config(**base, trl_overrides={field: value})
    return str(info.value)


@pytest.mark.parametrize("field", derived_grpo())
def test_each_field_pivotrl_derives_for_grpo_is_refused_as_an_override(field):
    message = refused(GRPORunConfig, GRPO_BASE, field)
    assert repr(field) in message
    if field in GRPORunConfig.model_fields:  # the flag of the same setting
        assert "--" + field.replace("_", "-") in message


@pytest.mark.parametrize("field", derived_sft())
def test_each_field_pivotrl_derives_for_sft_is_refused_as_an_override(field):
    message = refused(SFTRunConfig, SFT_BASE, field)
    assert repr(field) in message
    if field in SFTRunConfig.model_fields:
        assert "--" + field.replace("_", "-") in message


def test_a_trl_name_for_a_pivotrl_setting_names_pivotrls_flag():
    assert "--num-epochs" in refused(GRPORunConfig, GRPO_BASE, "num_train_epochs", 2.0)
    assert "--precision" in refused(SFTRunConfig, SFT_BASE, "bf16", True)
    assert "--max-prompt-length" in refused(GRPORunConfig, GRPO_BASE, "vllm_max_model_length", 512)


def test_an_unknown_override_is_an_error_naming_it():
    assert "'betta' is not a field of TRL's GRPOConfig" in refused(GRPORunConfig, GRPO_BASE, "betta")
    with pytest.raises(ValueError, match=r"'pakking', 'seeed' are not fields of TRL's SFTConfig"):
        SFTRunConfig(**SFT_BASE, trl_overrides={"seeed": 1, "pakking": True})


def test_what_pivotrl_does_not_model_reaches_trl_with_trls_type():
    # YAML reads 3e-4 as a string; TRL's field is a float, so it becomes the float it means
    cfg = GRPORunConfig(**GRPO_BASE, trl_overrides={"adam_beta2": "3e-4", "optim": "adamw_torch"})
    assert cfg.trl_overrides == {"adam_beta2": 3e-4, "optim": "adamw_torch"}
    assert grpo_config(cfg, STEPS).adam_beta2 == 3e-4
    sft = SFTRunConfig(**SFT_BASE, trl_overrides={"adam_epsilon": "1e-6"})
    assert sft_config(sft, STEPS).adam_epsilon == 1e-6
    with pytest.raises(ValueError, match=r"adam_beta2: 'fast' is not a float"):
        GRPORunConfig(**GRPO_BASE, trl_overrides={"adam_beta2": "fast"})


def run(*argv):
    from pivotrl.cli import app

    return CliRunner().invoke(app, list(map(str, argv)), env={"COLUMNS": "400", "NO_COLOR": "1"})


@pytest.mark.parametrize("verb", ["train", "sft"])
def test_the_cli_refuses_a_second_door_with_the_flag_to_use(verb, tmp_path):
    data = ["--pivots", tmp_path / "p.jsonl"] if verb == "train" else ["--data", EXAMPLE]
    result = run(verb, *data, "--model", tmp_path / "m", "--output-dir", tmp_path / "o",
                 "--trl-overrides", "{num_generations: 4}" if verb == "train" else "{max_length: 64}")
    assert result.exit_code == 2, result.output
    assert ("--num-generations" if verb == "train" else "--max-length") in result.output
    assert "Traceback" not in result.output and not (tmp_path / "o").exists()


def test_the_cli_names_the_key_of_a_value_of_the_wrong_type(tmp_path):
    result = run("train", "--pivots", tmp_path / "p.jsonl", "--model", tmp_path / "m", "--output-dir",
                 tmp_path / "o", "--trl-overrides", "{adam_beta2: fast}")
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if "adam_beta2" in line]
    assert len(lines) == 1 and "not a float" in lines[0]
