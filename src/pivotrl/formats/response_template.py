"""Reading a family pivotrl has no reader for through the tokenizer's own `response_template`
(transformers' `tokenizer.parse_response`), under pivotrl's strictness rules.

transformers' parser is built for chat front-ends: an unclosed call is closed at the end of the
text, and text after the last call lands in the content. Here, as in every other format, each
call's open delimiter must have its close delimiter, nothing but whitespace may follow the last
close, and the content must hold no call delimiter.
"""

from __future__ import annotations

import re
from typing import Any

from pivotrl.formats.actions import InvalidAction


def _pattern(field: dict[str, Any], key: str) -> re.Pattern | None:
    if isinstance(field.get(f"{key}_pattern"), str):
        return re.compile(field[f"{key}_pattern"])
    if isinstance(field.get(key), str):
        return re.compile(re.escape(field[key]))
    return None


def response_template_reader(tokenizer: Any) -> tuple[Any, tuple[str, ...]]:
    """(split_calls, call markers) for `actions.parse_with`, from the tokenizer's response_template."""
    template = getattr(tokenizer, "response_template", None)
    if not isinstance(template, dict):
        raise ValueError("the tokenizer's response_template is not a mapping")
    fields = template.get("fields") or {}
    calls_field = fields.get("tool_calls") or {}
    open_re, close_re = _pattern(calls_field, "open"), _pattern(calls_field, "close")
    end_re = _pattern(fields.get("content") or {}, "close")  # where the model's turn ends
    literal = calls_field.get("open") if isinstance(calls_field.get("open"), str) else None

    def split(body: str, tools: list | None = None) -> tuple[str, list]:
        if end_re is not None:  # the turn's own end marker (e.g. Gemma 4's <|tool_response>)
            ends = [m for m in end_re.finditer(body) if m.end() == len(body) and m.end() > m.start()]
            body = body[:ends[0].start()].rstrip() if ends else body
        message = tokenizer.parse_response(body, prefix="", tools=tools)
        if not isinstance(message, dict):
            raise InvalidAction("response_template parse gave no message")
        content = message.get("content") or ""
        if not isinstance(content, str):
            raise InvalidAction("response_template parse gave non-text content")
        calls = []
        for call in message.get("tool_calls") or []:
            fn = call.get("function", call) if isinstance(call, dict) else None
            name = fn.get("name") if isinstance(fn, dict) else None
            args = fn.get("arguments", {}) if isinstance(fn, dict) else None
            if not isinstance(name, str) or not name.strip() or not isinstance(args, dict):
                raise InvalidAction("malformed tool call")
            calls.append((name.strip(), args))
        opens = len(open_re.findall(body)) if open_re else len(calls)
        closes = list(close_re.finditer(body)) if close_re else []
        if opens != len(calls) or (close_re is not None and len(closes) != len(calls)):
            raise InvalidAction(f"{opens} call(s) opened, {len(closes)} closed, {len(calls)} parsed")
        if calls and closes and body[closes[-1].end():].strip():
            raise InvalidAction("text after the last tool call")
        if open_re is not None and open_re.search(content):
            raise InvalidAction("tool-call delimiter in the content")
        return content.strip(), calls

    return split, (literal,) if literal else ()
