"""The model-format options every stage shares (profile, evaluate, train, the E2E baseline): the
chat template's extra variables and the tool-call format. Declared once here and embedded in each
stage's config, so a run file's keys and their help are the same everywhere, and the token budget
and parser derived from them come from one place."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from pivotrl.formats.families import FormatParser, parser_for, token_budget


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
