"""Prompts from Turn contexts, built with the model's own chat template (tools included).

Profiling, training and evaluation all build prompts here, so the policy sees the same text in
each stage.
"""

from __future__ import annotations

from typing import Any

from pivotrl.records import Message, parse_arguments


def template_message(message: Message, *, keep_reasoning: bool = False) -> dict[str, Any]:
    """A Message as chat templates expect it: tool-call arguments as dicts (Qwen/Hermes templates
    iterate or `tojson` them), None fields dropped, reasoning only when asked for."""
    out: dict[str, Any] = {"role": message.role, "content": message.content or ""}
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.function.name, "arguments": _args_or_raw(c.function.arguments)}}
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    if keep_reasoning and message.reasoning_content:
        out["reasoning_content"] = message.reasoning_content
    return out


def _args_or_raw(arguments: Any) -> Any:
    try:
        return parse_arguments(arguments)
    except ValueError:
        return arguments


def template_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Messages for the chat template. Reasoning that is in the messages is passed on: the Turn
    file decides (`extract --keep-reasoning` keeps earlier turns' reasoning, the default drops it),
    and the template decides whether it renders it (Qwen3's drops reasoning before the last user turn)."""
    return [template_message(m, keep_reasoning=True) for m in messages]


def prompt_text(tokenizer: Any, context: list[Message], tools: list[dict[str, Any]] | None) -> str:
    """The generation prompt for the next assistant turn after `context`."""
    return tokenizer.apply_chat_template(template_messages(context), tools=tools or None,
                                         add_generation_prompt=True, tokenize=False)
