"""verl's custom reward function: `compute_score` scores a rollout with pivotrl's verifiers.

verl loads it by file path (`custom_reward_function.path`, `.name: compute_score`) and calls
`compute_score(data_source, solution_str, ground_truth, extra_info, **reward_kwargs)` once per
rollout, where `ground_truth` is `reward_model.ground_truth` and `extra_info` the row's
`extra_info` of a parquet written by `pivotrl export --format verl`. The rollout text is parsed
and scored through `pivotrl.scoring` (the one path profiling and GRPO use), so a reward in verl
is the reward pivotrl would give: the expert's own action scores 1, unparseable text 0.

reward_kwargs (verl config `custom_reward_function.reward_kwargs`): `verifier` (a registered
name, default "toolcall"), `verifier_config` (its options, as in configs/verifiers/*.yaml), and
how to read the rollout text: `model` (the policy's checkpoint or tokenizer dir: its chat template
tells the tool-call format) and/or `response_format` (hermes, qwen-xml, glm, deepseek, harmony,
…; pivotrl.formats.families). Neither given: Hermes `<tool_call>` JSON, the format `render_action` writes.
Every import is absolute: verl executes this file as a standalone module.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from pivotrl.export.verl import verl_to_turn
from pivotrl.io.records import Turn
from pivotrl.scoring import score_completion

DEFAULT_VERIFIER = "toolcall"


@lru_cache(maxsize=8)
def _parser(model: str | None, response_format: str | None):
    if model is None and response_format is None:
        from pivotrl.formats.actions import parse_completion

        return parse_completion
    from pivotrl.formats.families import parser_for_model

    return parser_for_model(model, response_format)


@lru_cache(maxsize=16)
def _verifier(name: str, config_json: str):
    from pivotrl.verifiers import get_verifier

    return get_verifier(name, **json.loads(config_json))


def turn_from_verl(ground_truth: Any, extra_info: dict[str, Any] | None) -> Turn:
    """The Turn a verl row was exported from (context and tools from extra_info; the expected
    message from ground_truth, else extra_info["expected"])."""
    # verl hands the reward function no prompt: without extra_info the context is empty.
    return verl_to_turn({"reward_model": {"ground_truth": ground_truth}, "extra_info": extra_info or {},
                         "prompt": []})


def compute_score(data_source: str, solution_str: str, ground_truth: Any,
                  extra_info: dict[str, Any] | None = None, *, verifier: str = DEFAULT_VERIFIER,
                  verifier_config: dict[str, Any] | None = None, model: str | None = None,
                  response_format: str | None = None, **_: Any) -> float:
    """The reward of `solution_str` (the decoded rollout) at the row's pivot, in [0, 1].
    `data_source` is not needed: the row itself says what the expert did."""
    del data_source
    turn = turn_from_verl(ground_truth, extra_info)
    scorer = _verifier(verifier, json.dumps(verifier_config or {}, sort_keys=True))
    parse = _parser(model, response_format)
    return float(score_completion(scorer, turn, solution_str or "", parse).reward)
