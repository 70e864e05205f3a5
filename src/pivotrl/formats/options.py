"""The model-format options every stage shares (profile, evaluate, train, the E2E baseline): the
chat template's extra variables and the tool-call format. Declared once here and embedded in each
stage's config, so a run file's keys and their help are the same everywhere, and the token budget
and parser derived from them come from one place."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from pivotrl.formats.families import FormatParser, parser_for, token_budget
from pivotrl.io.records import write_text_atomic

# Written beside a trained model: the template settings it was trained with, for `evaluate`.
SETTINGS_FILE = "template_settings.json"


class FormatOptions(BaseModel):
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Extra chat-template variables for every prompt rendered "
        "(e.g. enable_thinking: false for Qwen3/GLM, reasoning_effort: low for gpt-oss); every stage "
        "must use the ones profiling used (ours: none).")
    response_format: str | None = Field(
        None, description="Tool-call format of the model's completions (hermes, qwen-xml, glm, "
        "deepseek, harmony, response-template); None: detected from the chat template "
        "(pivotrl.formats.families).")

    def token_budget(self, tokenizer: Any) -> int:
        """The default tokens per completion for this model and template (room for reasoning)."""
        return token_budget(tokenizer, chat_kwargs=self.chat_template_kwargs,
                            response_format=self.response_format)

    def parser(self, tokenizer: Any) -> FormatParser:
        """The completion parser of this model's format."""
        return parser_for(tokenizer, chat_kwargs=self.chat_template_kwargs,
                          response_format=self.response_format)

    def format_options(self) -> dict[str, Any]:
        """These fields as keyword arguments of another config (one config feeds the next)."""
        return {name: getattr(self, name) for name in FormatOptions.model_fields}


def template_mismatch(ours: dict[str, Any], theirs: dict[str, Any], stage: str, other: str) -> str | None:
    """A warning when `stage` renders prompts or reads completions otherwise than `other` did (its
    chat-template variables or tool-call format; a missing key is the default), else None."""
    diffs = [f"{key} {theirs.get(key) or default!r} there, {ours.get(key) or default!r} here"
             for key, default in (("chat_template_kwargs", {}), ("response_format", None))
             if (ours.get(key) or default) != (theirs.get(key) or default)]
    if not diffs:
        return None
    return (f"{stage}: other template settings than {other} ({'; '.join(diffs)}): the model sees "
            "other prompts than the ones it was measured or trained on; give the same ones")


# Besides the FormatOptions: the token budget the run sampled with (None: none, as for SFT) and
# where each setting came from (`settings_from`), so `evaluate` scores the model as it was run.
RUN_SETTINGS = ("max_new_tokens", "settings_from")


def write_template_settings(folder: str | Path, options: dict[str, Any]) -> None:
    """Record a trained model's template settings (and RUN_SETTINGS) in `folder` (SETTINGS_FILE)."""
    keep = {k: options.get(k) for k in FormatOptions.model_fields}
    keep.update({k: options[k] for k in RUN_SETTINGS if options.get(k) is not None})
    write_text_atomic(Path(folder) / SETTINGS_FILE, json.dumps(keep, indent=1))


def recorded_template_settings(model: str | Path) -> dict[str, Any] | None:
    """The template settings a model folder (or its run folder, for a checkpoint-N inside one) was
    trained with; None when pivotrl did not train it."""
    path = Path(model)
    for folder in (path, path.parent):
        if (folder / SETTINGS_FILE).is_file():
            try:
                return json.loads((folder / SETTINGS_FILE).read_text())
            except ValueError:
                return None
    return None
