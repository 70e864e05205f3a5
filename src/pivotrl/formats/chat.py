"""Prompts from Turn contexts, built with the model's own chat template (tools included), and the
one tokenization rule for them.

Profiling, training and evaluation all build prompts here, so the policy sees the same text in
each stage. The rule for turning that text into token ids: the chat template's text is the whole
prompt, so it is tokenized with `add_special_tokens=False` (`prompt_token_ids`). Templates that
start with a BOS write it themselves (Llama 3, Gemma, Mistral); a tokenizer that also adds one on
encode would otherwise give a double-BOS prompt the model never saw in pre-training. The HF
sampler, the vLLM sampler and the GRPO trainer (`train.trainer.PivotGRPOTrainer`) all follow it.
"""

from __future__ import annotations

import json
from typing import Any

from pivotrl.io.records import Message, parse_arguments


def template_message(message: Message, *, keep_reasoning: bool = False) -> dict[str, Any]:
    """A Message as chat templates expect it: tool-call arguments as dicts (Qwen/Hermes templates
    iterate or `tojson` them), None fields dropped, reasoning only when asked for (as
    `reasoning_content`, and as `thinking` for gpt-oss's template, which reads that key)."""
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
        if not (message.content and message.tool_calls):  # gpt-oss's template refuses both there
            out["thinking"] = message.reasoning_content
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


def _string_arguments(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [{**c, "function": {**c["function"], "arguments": c["function"]["arguments"]
                      if isinstance(c["function"]["arguments"], str)
                      else json.dumps(c["function"]["arguments"], ensure_ascii=False)}}
                     for c in m["tool_calls"]]
            m = {**m, "tool_calls": calls}
        out.append(m)
    return out


def apply_template(tokenizer: Any, messages: list[dict[str, Any]], tools: list | None, **kwargs: Any):
    """`tokenizer.apply_chat_template`, retried with JSON-string tool-call arguments when the
    template concatenates them as text (DeepSeek-V3's raises TypeError on a dict)."""
    kwargs.setdefault("tokenize", False)
    try:
        return tokenizer.apply_chat_template(messages, tools=tools or None, **kwargs)
    except TypeError:
        if not any(m.get("tool_calls") for m in messages):
            raise
        return tokenizer.apply_chat_template(_string_arguments(messages), tools=tools or None, **kwargs)


def assistant_turn_text(tokenizer: Any, context: list[dict[str, Any]], tools: list | None,
                        message: dict[str, Any], **kwargs: Any) -> str | None:
    """`message` as the model writes it after the generation prompt of `context`: the template's
    render of context + message, less that prompt. Where the prompt ends inside an open <think>
    that the render of a finished turn writes otherwise (Nemotron 3's `<think></think>`,
    DeepSeek-V3's none), the text goes on inside the open block and closes it. None when the
    render does not extend the prompt, so the model's own part of it cannot be cut out."""
    prompt = apply_template(tokenizer, context, tools, add_generation_prompt=True, **kwargs)
    full = apply_template(tokenizer, context + [message], tools, **kwargs)
    if full.startswith(prompt):
        return full[len(prompt):]
    opened = prompt.rfind("<think>")
    if opened == -1 or prompt[opened + len("<think>"):].strip() or not full.startswith(prompt[:opened]):
        return None
    turn = full[opened:]
    return turn[len("<think>"):] if turn.startswith("<think>") else f"</think>\n\n{turn}"


def prompt_text(tokenizer: Any, context: list[Message], tools: list[dict[str, Any]] | None,
                chat_kwargs: dict[str, Any] | None = None) -> str:
    """The generation prompt for the next assistant turn after `context`. `chat_kwargs` go to the
    template (e.g. `enable_thinking`, `reasoning_effort`)."""
    return apply_template(tokenizer, template_messages(context), tools, add_generation_prompt=True,
                          **(chat_kwargs or {}))


def prompt_token_ids(tokenizer: Any, text: str) -> list[int]:
    """The prompt's token ids under the one rule (module docstring): no special tokens added."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def completion_text(tokenizer: Any, ids: list[int]) -> str:
    """Generated ids as the parser reads them: special tokens kept (gpt-oss's and DeepSeek's call
    delimiters are special tokens; dropping them would turn a call into prose), and what follows
    the first pad token dropped. End-of-turn tokens are dropped by the parser itself."""
    pad = getattr(tokenizer, "pad_token_id", None)
    eos = getattr(tokenizer, "eos_token_id", None)
    ids = list(ids)
    if pad is not None and pad != eos and pad in ids:
        ids = ids[:ids.index(pad)]
    return tokenizer.decode(ids, skip_special_tokens=False)


def load_tokenizer(model: str) -> Any:
    """The tokenizer of a run's model; one without a pad token pads with EOS (TRL's trainers need
    one, and padded positions are masked out of every loss)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
