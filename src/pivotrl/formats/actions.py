"""Completion text ⇄ assistant message: the rules every parser shares, and the Hermes/JSON reader.

`parse_with(text, split_calls)` holds the shared rules; each model family's call format is a
`split_calls` reader (this module's JSON one, the others in `pivotrl.formats.call_syntax`), and
`pivotrl.formats.families.parser_for(tokenizer)` picks the model's own. Profiling, training, evaluation
and `pivotrl verify` all parse through it.

Formats read here (`parse_completion`):
- Hermes/Qwen: `<tool_call>{"name": …, "arguments": {…} | "<json>"}</tool_call>`, one or many,
  with free text before/between them (kept as `content`);
- a bare JSON object or list of objects with `name` + `arguments` (or `parameters`), also
  after Mistral's `[TOOL_CALLS]` or Llama 3's `<|python_tag|>` marker, also
  `{"type": "function", "function": {…}}` and OpenAI message shapes `{"role": "assistant",
  "tool_calls": […]}`, optionally in one ```json fenced block;
- `<think>…</think>` blocks, dropped from the action (a lone leading `…</think>` too, for chat
  templates that open the think block in the prompt).

Anything else that looks like a call but is not one is an *invalid* action (reward 0, counted,
with the reason): a permissive parser is a reward leak (docs/DESIGN.md). In particular the action must
be cleanly terminated: after the last `</tool_call>` only whitespace and end-of-turn markers.
Model text is hostile: `parse_completion` never raises.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pivotrl.io.records import (FunctionCall, Message, ToolCall, loads_unique, message_text,
                                parse_arguments)

# Past this many characters a completion is not an action but a runaway generation.
MAX_COMPLETION_CHARS = 65_536
END_MARKERS = ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end|>", "<|eom_id|>", "</s>",
               "<|end_of_text|>", "<eos>", "<end_of_turn>")
_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_CALL_PREFIXES = ("[TOOL_CALLS]", "<|python_tag|>")
# The opening of a JSON call object (or a list of them), as Llama 3 / Mistral / bare-JSON write it.
_CALL_START = re.compile(r'\[?\s*\{\s*"(?:name|function|type)"\s*:')
_FENCE = re.compile(r"\A```(?:json|JSON)?\s*\n?(.*?)\n?```\Z", re.S)


@dataclass(frozen=True)
class ParsedAction:
    message: Message | None  # the assistant message, None when invalid
    valid: bool
    reason: str = ""  # why it is invalid ("" when valid)


class _Invalid(Exception):
    pass


InvalidAction = _Invalid  # raised by a format's call reader: the action is invalid, with this reason


def _defaults(cls) -> dict[str, Any] | None:
    fields = cls.model_fields
    if any(f.default_factory is not None for f in fields.values()):
        return None
    return {name: f.default for name, f in fields.items()}


_DEFAULTS = {cls: _defaults(cls) for cls in (Message, ToolCall, FunctionCall)}


def _construct(cls, **values):
    """`cls.model_construct(**values)` without its per-call overhead (half the parse time):
    the values are already valid, built by this module."""
    defaults = _DEFAULTS[cls]
    if defaults is None:
        return cls.model_construct(**values)
    obj = cls.__new__(cls)
    object.__setattr__(obj, "__dict__", {**defaults, **values})
    object.__setattr__(obj, "__pydantic_fields_set__", set(values))
    object.__setattr__(obj, "__pydantic_extra__", {})
    object.__setattr__(obj, "__pydantic_private__", None)
    return obj


def _strip_end(text: str, markers: tuple[str, ...] = END_MARKERS) -> str:
    """Drop trailing whitespace and end-of-turn markers (any number, in any order)."""
    while True:
        stripped = text.rstrip()
        if not stripped.endswith(markers):  # one C call for the common case
            return stripped
        for marker in markers:
            if stripped.endswith(marker):
                stripped = stripped[: -len(marker)]
                break
        else:
            return stripped
        text = stripped


def _drop_think(text: str, opens_in_prompt: bool = False, call_openers: tuple[str, ...] = ()) -> str:
    """The action without its reasoning. `opens_in_prompt`: the generation prompt ends inside an
    open <think> (Qwen3.5-think, Nemotron 3, DeepSeek), so the reasoning must be closed before
    any action: text with no </think> was cut while thinking, unless it starts right away with a
    call (`call_openers`): no reasoning at all, as the families' own response templates read it."""
    close = text.find(_THINK_CLOSE)
    open_ = text.find(_THINK_OPEN)
    if close != -1 and (open_ == -1 or close < open_):
        text = text[close + len(_THINK_CLOSE):]  # the template opened <think> in the prompt
    elif opens_in_prompt and close == -1 and not (call_openers and text.lstrip().startswith(call_openers)):
        raise _Invalid("cut inside the thinking block (no </think>; raise max_new_tokens)")
    while True:
        open_ = text.find(_THINK_OPEN)
        if open_ == -1:
            break
        close = text.find(_THINK_CLOSE, open_)
        if close == -1:
            raise _Invalid("cut inside the thinking block (unterminated <think>; raise max_new_tokens)")
        text = text[:open_] + text[close + len(_THINK_CLOSE):]
    if _THINK_CLOSE in text:
        raise _Invalid("stray </think>")
    return text


def _call_from_obj(obj: Any) -> tuple[str, dict[str, Any]]:
    """(name, arguments) of one call object, in any of the accepted shapes."""
    if not isinstance(obj, dict):
        raise _Invalid(f"tool call is a JSON {type(obj).__name__}, not an object")
    if isinstance(obj.get("function"), dict):  # {"type": "function", "function": {...}}
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        raise _Invalid("tool call without a name")
    if name != name.strip():  # " f" is no tool's name: a backend looks it up as written
        raise _Invalid(f"tool name {name!r} has surrounding whitespace")
    if "arguments" in obj:
        args = obj["arguments"]
    else:
        args = obj.get("parameters", {})
    if isinstance(args, str):
        try:
            args = loads_unique(args) if args.strip() else {}
        except (ValueError, RecursionError) as exc:
            raise _Invalid(f"arguments of {name!r} are not valid JSON: {exc}") from None
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise _Invalid(f"arguments of {name!r} are a JSON {type(args).__name__}, not an object")
    return name, args


def _load_json(body: str, what: str) -> Any:
    try:
        return loads_unique(body)
    except (ValueError, RecursionError) as exc:
        raise _Invalid(f"{what} is not valid JSON: {exc}") from None


def _calls_from_value(value: Any) -> list[tuple[str, dict[str, Any]]]:
    items = value if isinstance(value, list) else [value]
    if not items:
        raise _Invalid("empty list of tool calls")
    return [_call_from_obj(item) for item in items]


def _extend_block(text: str, open_: int, close: int, first_error: Exception) -> tuple[Any, int]:
    for _ in range(8):  # bounded: hostile text with many closing tags stays cheap
        close = text.find(_CLOSE, close + len(_CLOSE))
        if close == -1:
            break
        try:
            return loads_unique(text[open_ + len(_OPEN):close].strip()), close
        except (ValueError, RecursionError):
            continue
    raise _Invalid(f"<tool_call> block is not valid JSON: {first_error}")


def _parse_tagged(text: str) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    content: list[str] = []
    calls: list[tuple[str, dict[str, Any]]] = []
    pos = 0
    while True:
        open_ = text.find(_OPEN, pos)
        if open_ == -1:
            break
        between = text[pos:open_]
        if _CLOSE in between:
            raise _Invalid("</tool_call> without <tool_call>")
        content.append(between)
        close = text.find(_CLOSE, open_)
        if close == -1:
            raise _Invalid("unclosed <tool_call>")
        body = text[open_ + len(_OPEN):close].strip()
        try:
            value = loads_unique(body)
        except (ValueError, RecursionError) as exc:
            # A JSON string may itself contain "</tool_call>": try the next closing tag.
            value, close = _extend_block(text, open_, close, exc)
        calls.extend(_calls_from_value(value))
        pos = close + len(_CLOSE)
    if text[pos:].strip():
        raise _Invalid("text after the last </tool_call>")
    return "".join(content).strip(), calls


def _parse_bare(text: str) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """Whole text is JSON (maybe fenced): calls, an OpenAI message, or just a JSON answer."""
    if _CLOSE in text:
        raise _Invalid("</tool_call> without <tool_call>")
    body, marker = text, ""
    for prefix in _CALL_PREFIXES:  # Mistral's and Llama 3's markers before a JSON call
        if body.startswith(prefix):
            body, marker = body[len(prefix):].strip(), prefix
            break
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1).strip()
    value = None
    if body and body[0] in "[{":
        try:
            value = loads_unique(body)
        except (ValueError, RecursionError) as exc:
            if _CALL_START.match(body):  # a JSON call cut short or broken: never a message
                raise _Invalid(f"tool call is not valid JSON: {exc}") from None
            value = None  # prose that starts with a brace: a message
    if isinstance(value, dict) and value.get("role") == "assistant":
        raw_calls = value.get("tool_calls") or []
        content = value.get("content")
        content = content.strip() if isinstance(content, str) else ""
        return content, _calls_from_value(raw_calls) if raw_calls else []
    looks_like_call = (isinstance(value, dict) and ("name" in value or "function" in value)) or (
        isinstance(value, list) and value and all(isinstance(v, dict) and ("name" in v or "function" in v)
                                                  for v in value))
    if looks_like_call:
        return "", _calls_from_value(value)
    if marker:
        raise _Invalid(f"no valid tool call after {marker}")
    return text, []  # prose, or a JSON answer sent as a message


# Tool-call markers of the other formats pivotrl reads (Qwen3.5/Nemotron XML, GLM, DeepSeek,
# gpt-oss harmony). Text that holds one was meant as a call in that format: read as JSON/Hermes it
# would become a plain message and could be paid as one, so it is invalid instead.
FOREIGN_CALL_MARKERS = ("<function=", "<parameter=", "<arg_key>", "<arg_value>", "<｜tool▁",
                        "to=functions.", "<|channel|>", "<|call|>")

CallSplitter = Callable[[str], "tuple[str, list[tuple[str, dict[str, Any]]]]"]


def split_json_calls(body: str) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """Hermes `<tool_call>{json}</tool_call>` blocks, or a bare JSON call / list / message."""
    if _OPEN in body:
        return _parse_tagged(body)
    return _parse_bare(body)


def parse_with(text: str, split_calls: CallSplitter = split_json_calls, *,
               think: bool = True, think_opens_in_prompt: bool = False,
               call_openers: tuple[str, ...] = (_OPEN,),
               end_markers: tuple[str, ...] = END_MARKERS,
               forbidden: tuple[str, ...] = FOREIGN_CALL_MARKERS,
               type_args: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None,
               max_chars: int = MAX_COMPLETION_CHARS) -> ParsedAction:
    """Completion text → assistant message with one format's call reader (`split_calls` returns
    (content, [(name, arguments)]) or raises `InvalidAction`). The rules every format shares:
    length cap, end-of-turn markers and <think> blocks dropped (`think`), no marker of
    `forbidden` left in the content (a call that did not parse is never a message), at least
    some content or a call, and never an exception."""
    try:
        if not isinstance(text, str):
            raise _Invalid(f"completion is {type(text).__name__}, not text")
        if len(text) > max_chars:
            raise _Invalid(f"completion too long ({len(text)} > {max_chars} characters)")
        body = _strip_end(text, end_markers)
        if think:
            body = _strip_end(_drop_think(body, think_opens_in_prompt, call_openers), end_markers)
        body = body.strip()
        if not body:
            raise _Invalid("empty completion")
        content, calls = split_calls(body)
        if not calls and not content:
            raise _Invalid("empty completion")
        for marker in forbidden:
            if marker in content:
                raise _Invalid(f"tool-call marker {marker!r} outside a well-formed call")
        tool_calls = []
        for i, (name, args) in enumerate(calls):
            if type_args is not None:
                args = type_args(name, args)
            arguments = json.dumps(args, ensure_ascii=False)
            _remember(arguments, args)
            tool_calls.append(_construct(ToolCall, id=f"call_{i}", type="function", function=_construct(
                FunctionCall, name=name, arguments=arguments)))
        message = _construct(Message, role="assistant", content=content or None,
                             tool_calls=tool_calls or None)
        return ParsedAction(message, True)
    except _Invalid as exc:
        return ParsedAction(None, False, str(exc))
    except Exception as exc:  # noqa: BLE001 - hostile text must never crash a run
        return ParsedAction(None, False, f"unparseable completion: {type(exc).__name__}")


def parse_completion(text: str, max_chars: int = MAX_COMPLETION_CHARS) -> ParsedAction:
    """Completion text → assistant message (tool-call arguments as JSON strings, ids call_0…), in
    the Hermes/JSON formats; `pivotrl.formats.families.parser_for(tokenizer)` picks a model's own format."""
    return parse_with(text, split_json_calls, max_chars=max_chars)


_ARGS_CACHE: dict[str, dict[str, Any]] = {}


def _remember(arguments: str, args: dict[str, Any]) -> None:
    if len(_ARGS_CACHE) >= 16384:
        _ARGS_CACHE.clear()
    _ARGS_CACHE[arguments] = args


def call_arguments(arguments: str | dict[str, Any] | None) -> dict[str, Any]:
    """A tool call's arguments as a dict; parsed once when `parse_completion` just produced
    the string (verifiers read them K times a turn). Treat the result as read-only.
    Raises ValueError when they are not a JSON object or a key appears twice (`parse_arguments`)."""
    hit = _ARGS_CACHE.get(arguments) if isinstance(arguments, str) else None
    return hit if hit is not None else parse_arguments(arguments)


def render_action(message: Message) -> str:
    """Canonical Hermes text of an assistant message: content, then one block per call."""
    parts = []
    text = message_text(message).strip()
    if text:
        parts.append(text)
    for call in message.tool_calls or []:
        args = parse_arguments(call.function.arguments)
        body = json.dumps({"name": call.function.name, "arguments": args}, ensure_ascii=False)
        body = body.replace("<", "\\u003c")  # "<" only occurs inside JSON strings: tags stay unambiguous
        parts.append(f"{_OPEN}\n{body}\n{_CLOSE}")
    return "\n".join(parts)
