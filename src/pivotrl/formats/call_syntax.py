"""Readers of the tool-call formats other than Hermes/JSON (`pivotrl.formats.actions.split_json_calls`).

Each reader takes the completion body (end-of-turn markers and reasoning already dropped by
`actions.parse_with`) and returns (content, [(name, arguments)]) or raises `InvalidAction`.
They are strict in the same way as the JSON reader: every call block must be complete and
well formed, nothing but whitespace may follow the last call (the model must stop there), and
a block that does not parse is never read as a message.

- `split_xml_calls`: Qwen3.5/3.6/3.8 and Nemotron 3, `<tool_call>\\n<function=NAME>\\n
  <parameter=K>\\nV\\n</parameter>…</function>\\n</tool_call>`;
- `split_glm_calls`: GLM-4.5, `<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>…
  </tool_call>`;
- `split_deepseek_calls`: DeepSeek-V3, `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>
  NAME\\n```json\\n{…}\\n```<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>` (and V3.1's `NAME<｜tool▁sep｜>{…}`);
- `split_harmony`: gpt-oss's harmony messages after `<|start|>assistant`: analysis (reasoning,
  dropped), commentary `to=functions.NAME` (a call, JSON arguments), final (the message).

XML and GLM templates write a string argument as raw text and anything else as JSON, so `"7"`
and `7` render the same. `ArgumentTyper` undoes that with the tool's JSON schema: raw text for a
string parameter, JSON for the others (the toolcall verifier is type-strict: "7" is not 7).
"""

from __future__ import annotations

import re
from typing import Any

from pivotrl.formats.actions import InvalidAction, loads_unique

_WS = re.compile(r"\s*")


def _after_ws(text: str, pos: int) -> int:
    return _WS.match(text, pos).end()


def _no_duplicate(args: dict[str, Any], key: str, name: str) -> None:
    if key in args:
        raise InvalidAction(f"argument {key!r} of {name!r} given twice")


def _calls_region(body: str, open_tag: str) -> tuple[str, int]:
    """(content before the first call, where the first call starts)."""
    first = body.find(open_tag)
    return (body, -1) if first == -1 else (body[:first].strip(), first)


# ---------------------------------------------------------------- Qwen3.5 / Nemotron 3 XML, GLM-4.5

_XML_CALL = re.compile(r"<tool_call>\s*<function=([^>\n]+)>(.*?)</function>\s*</tool_call>", re.S)
# The template writes "<parameter=K>\n" + value + "\n</parameter>\n": exactly one newline each side
# belongs to the format, any other whitespace to the value.
_XML_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)
_GLM_CALL = re.compile(r"<tool_call>([^\n<]+)(.*?)</tool_call>", re.S)
_GLM_ARG = re.compile(r"<arg_key>([^<]+)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)


def _split_tagged(body: str, call_re: re.Pattern, arg_re: re.Pattern, shape: str
                  ) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """Content, then <tool_call> blocks back to back: each block matches `call_re` (name, inner
    text) and its inner text is nothing but `arg_re` matches (key, raw value) and whitespace."""
    content, pos = _calls_region(body, "<tool_call>")
    if pos == -1:
        return content, []
    calls = []
    while pos < len(body):
        m = call_re.match(body, pos)
        if m is None:
            raise InvalidAction(f"<tool_call> block is not {shape}")
        name, inner = m.group(1).strip(), m.group(2)
        if not name:
            raise InvalidAction("tool call without a name")
        args: dict[str, Any] = {}
        at = _after_ws(inner, 0)
        while at < len(inner):
            a = arg_re.match(inner, at)
            if a is None:
                raise InvalidAction(f"call {name!r}: text outside its argument blocks")
            key = a.group(1).strip()
            _no_duplicate(args, key, name)
            args[key] = RawValue(a.group(2))
            at = _after_ws(inner, a.end())
        calls.append((name, args))
        pos = _after_ws(body, m.end())
        if pos < len(body) and not body.startswith("<tool_call>", pos):
            raise InvalidAction("text after the last </tool_call>")
    return content, calls


def split_xml_calls(body: str) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    return _split_tagged(body, _XML_CALL, _XML_PARAM,
                         "<function=NAME><parameter=K>V</parameter>…</function></tool_call>")


def split_glm_calls(body: str) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    return _split_tagged(body, _GLM_CALL, _GLM_ARG,
                         "NAME<arg_key>K</arg_key><arg_value>V</arg_value>…</tool_call>")


# ---------------------------------------------------------------- DeepSeek-V3

_DS_BEGIN, _DS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
_DS_CALL = re.compile(r"<｜tool▁call▁begin｜>(.*?)<｜tool▁sep｜>(.*?)<｜tool▁call▁end｜>", re.S)
_DS_FENCED = re.compile(r"([^\n]+)\n```(?:json)?\n(.*)\n```\Z", re.S)


def _json_object(raw: str, name: str) -> dict[str, Any]:
    try:
        args = loads_unique(raw) if raw.strip() else {}
    except (ValueError, RecursionError) as exc:
        raise InvalidAction(f"arguments of {name!r} are not valid JSON: {exc}") from None
    if not isinstance(args, dict):
        raise InvalidAction(f"arguments of {name!r} are a JSON {type(args).__name__}, not an object")
    return args


def split_deepseek_calls(body: str) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    content, pos = _calls_region(body, _DS_BEGIN)
    if pos == -1:
        return content, []
    end = body.find(_DS_END, pos)
    if end == -1:
        raise InvalidAction("unclosed <｜tool▁calls▁begin｜>")
    if body[end + len(_DS_END):].strip():
        raise InvalidAction("text after <｜tool▁calls▁end｜>")
    region, calls = body[pos + len(_DS_BEGIN):end], []
    at = _after_ws(region, 0)
    while at < len(region):
        m = _DS_CALL.match(region, at)
        if m is None:
            raise InvalidAction("malformed <｜tool▁call▁begin｜> block")
        head, rest = m.group(1).strip(), m.group(2)
        fenced = _DS_FENCED.match(rest.strip("\n")) if head == "function" else None
        if fenced is not None:  # V3: type, then NAME and a ```json fence
            name, raw = fenced.group(1).strip(), fenced.group(2)
        elif head == "function":
            raise InvalidAction("DeepSeek call without a ```json block of arguments")
        else:  # V3.1: NAME<｜tool▁sep｜>{json}
            name, raw = head, rest
        if not name:
            raise InvalidAction("tool call without a name")
        calls.append((name, _json_object(raw, name)))
        at = _after_ws(region, m.end())
    if not calls:
        raise InvalidAction("empty <｜tool▁calls▁begin｜> block")
    return content, calls


# ---------------------------------------------------------------- gpt-oss harmony

_H_HEAD = re.compile(r"(?:<\|start\|>assistant)?([^<]*)<\|channel\|>([^<]*)"
                     r"(?:<\|constrain\|>([^<]*))?<\|message\|>")
_H_ENDS = ("<|end|>", "<|call|>", "<|return|>")
_H_RECIPIENT = re.compile(r"\bto=(\S+)")


def _harmony_message(text: str, pos: int) -> tuple[str, str, str, str | None, int]:
    """(channel, recipient, body, terminator or None at end of text, next position)."""
    m = _H_HEAD.match(text, pos)
    if m is None:
        raise InvalidAction("text outside harmony messages (was it decoded without its special tokens?)")
    head = f"{m.group(1)} {m.group(2)}"
    channel = (m.group(2).split() or [""])[0]
    recipient = _H_RECIPIENT.search(head)
    ends = [(text.find(t, m.end()), t) for t in _H_ENDS]
    ends = [(i, t) for i, t in ends if i != -1]
    if not ends:
        return channel, recipient.group(1) if recipient else "", text[m.end():], None, len(text)
    i, term = min(ends)
    return channel, recipient.group(1) if recipient else "", text[m.end():i], term, i + len(term)


def split_harmony(body: str) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """Messages until the action: a final message, or calls (the model stops at <|call|>)."""
    content: list[str] = []
    calls: list[tuple[str, dict[str, Any]]] = []
    pos = _after_ws(body, 0)
    while pos < len(body):
        if calls:
            raise InvalidAction("text after a tool call's <|call|>")
        channel, recipient, text, term, pos = _harmony_message(body, pos)
        if channel == "analysis":
            if recipient:
                raise InvalidAction(f"call to a built-in tool {recipient!r}")
            if term is None:
                raise InvalidAction("cut inside the analysis channel (raise max_new_tokens)")
        elif recipient:
            if not recipient.startswith("functions.") or channel != "commentary":
                raise InvalidAction(f"call to {recipient!r} on channel {channel!r}, not a function")
            if term not in (None, "<|call|>"):
                raise InvalidAction(f"tool call ended by {term}, not <|call|>")
            name = recipient[len("functions."):]
            calls.append((name, _json_object(text, name)))
        elif channel in ("final", "commentary"):
            content.append(text.strip())
            if channel == "final" and _after_ws(body, pos) < len(body):
                raise InvalidAction("text after the final message")
        else:
            raise InvalidAction(f"unknown harmony channel {channel!r}")
        pos = _after_ws(body, pos)
    return "\n".join(c for c in content if c), calls


# ---------------------------------------------------------------- argument types

class RawValue(str):
    """An argument value written as raw text by an XML-style template (typed by `ArgumentTyper`)."""


def _param_types(tools: list | None) -> dict[str, dict[str, tuple[str, ...]]]:
    out: dict[str, dict[str, tuple[str, ...]]] = {}
    for tool in tools or []:
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            continue
        params = fn.get("parameters")
        props = params.get("properties") if isinstance(params, dict) else None
        out[fn["name"]] = {k: _types(v) for k, v in (props or {}).items() if isinstance(k, str)}
    return out


def _types(schema: Any) -> tuple[str, ...]:
    if not isinstance(schema, dict):
        return ()
    t = schema.get("type")
    types = [t] if isinstance(t, str) else [x for x in t or [] if isinstance(x, str)]
    for alt in schema.get("anyOf") or schema.get("oneOf") or []:
        types.extend(_types(alt))
    if not types and isinstance(schema.get("enum"), list) and schema["enum"]:
        types = ["string"] if all(isinstance(e, str) for e in schema["enum"]) else []
    return tuple(types)


def type_value(raw: str, types: tuple[str, ...]) -> Any:
    """A raw-text argument as the template wrote it, read back with the parameter's type. Safe
    because the template wrote strings raw and everything else as JSON: for a string parameter
    the text is the value; for others JSON is the only way the value could have been written;
    with no schema (an unknown tool or parameter) a JSON scalar or container is read as JSON."""
    if "string" in types and not (raw == "null" and "null" in types):
        return str(raw)
    try:
        return loads_unique(raw)
    except (ValueError, RecursionError):
        return str(raw)  # a string where the schema wants another type: the verifier refuses it


class ArgumentTyper:
    """Types the RawValue arguments of a parsed call with the turn's tool schemas."""

    def __init__(self, tools: list | None):
        self.types = _param_types(tools)

    def __call__(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        schema = self.types.get(name, {})
        return {k: type_value(v, schema.get(k, ())) if isinstance(v, RawValue) else v
                for k, v in args.items()}
