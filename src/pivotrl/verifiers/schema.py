"""Tool schemas as the `toolcall` verifier reads them: kind, string class, default, enum, list order.

`schema_index(tools)` is a lazy, cached name -> FnSpec index (a turn offers many tools but its
calls use one or two, and K samples of a turn share one tools list). Each parameter's spec is
computed once from its JSON schema:

- kind: string / integer / number / boolean / array / object / any (nullable unions unwrapped);
- string class: "exact" (enums, ids, paths, urls, e-mails, codes, names of things: by parameter
  name, `format` or description), "free" (prose: message, description, query, …), or None (decided
  from the value, `string_class`);
- default: the schema `default`, or one stated in the description ("defaults to 'units'");
- enum: the allowed values (a value in another case is the same choice when it folds to exactly
  one of them);
- unordered: an array whose order means nothing (see `_UNORDERED_NAME`).
"""

from __future__ import annotations

import re
from typing import Any

MISSING = object()  # an argument that is absent (distinct from an explicit null)


# ---------------------------------------------------------------- schema index (per tools list)

_TYPES = {"string": "string", "str": "string", "integer": "integer", "int": "integer",
          "number": "number", "float": "number", "double": "number", "boolean": "boolean",
          "bool": "boolean", "array": "array", "tuple": "array", "list": "array",
          "object": "object", "dict": "object"}
_ID_NAME = re.compile(
    r"(?:^|_)(?:id|ids|uuid|guid|key|keys|token|path|paths|file|files|filename|filenames|filepath|"
    r"dir|dirs|directory|folder|url|urls|uri|link|email|emails|username|user|login|password|"
    r"code|sku|symbol|ticker|hash|sha|branch|commit|repo|repos|handle|account|number|isbn|phone|"
    r"zip|zipcode|postcode|ip|host|hostname|port|domain|namespace|version|dest|destination|src|"
    r"source|target|receiver|recipient|sender|"
    # code: case, brackets and operators are meaning ("(1 + 2) * 3" is not "1 + 2 * 3")
    r"expression|expr|formula|equation|function|func|lambda|regex|pattern|script|command|cmd|"
    r"sql|program|snippet|selector|xpath|jsonpath)$|[a-z](?:Id|ID|Ids|Path|Url|URL|Key|Name)$")
_FREE_NAME = re.compile(
    r"(?:^|_)(?:description|desc|message|msg|content|body|text|query|prompt|note|notes|comment|"
    r"comments|reason|summary|title|subject|instruction|instructions|question|answer|feedback|"
    r"review|bio|caption|keyword|keywords|topic|details|memo|caption|statement)$", re.I)
# Arrays whose order carries no meaning: sets of recipients, tags, attendees, fields, … A
# backend stores or applies them as a set, so ["a", "b"] and ["b", "a"] are the same request.
# Everything else (steps, waypoints, coordinates, ids paired with another list, values of a
# formula) keeps its order: order is part of the call unless the name says otherwise.
_UNORDERED_NAME = re.compile(
    r"(?:^|_)(?:tags|labels|cc|bcc|recipients|attendees|participants|invitees|guests|members|"
    r"emails|categories|genres|keywords|fields|columns|attributes|permissions|scopes|roles|"
    r"features|amenities|skills|interests|ingredients|allergies|allergens|topics|"
    r"dietary_restrictions|cuisines|platforms|channels|languages|include|exclude|excludes|"
    r"includes)$", re.I)
_ORDERED_DESC = re.compile(r"\b(?:order(?:ed)?|sequence|first|priority|ranked|rank)\b", re.I)
_ID_FORMATS = {"email", "uri", "url", "uuid", "date", "date-time", "time", "hostname", "ipv4",
               "ipv6", "uri-reference", "iri"}
_ID_DESC = re.compile(r"\b(?:ID|IDs|UUID|identifier|IATA|ISO|file ?name|path|URL|e-?mail address)\b")
_ID_VALUE = re.compile(r"[\d_/@#:\\]|\.\w")
_DEFAULT_IN_DESC = re.compile(
    r"\bdefaults?(?:\s+value)?(?:\s+(?:is|to|of|will be))?\s*[:=]?\s*"
    r"(?P<v>'[^']*'|\"[^\"]*\"|`[^`]*`|[-+]?\d+(?:\.\d+)?\b|[A-Za-z_][\w.-]*)", re.I)
_NOT_A_DEFAULT = {"the", "a", "an", "if", "is", "to", "value", "values", "none", "null", "all",
                  "current", "empty", "not", "no", "this", "that", "it", "be", "set", "when",
                  "unless", "for", "of", "and", "or", "as", "in", "on", "by", "using", "will",
                  "which", "should", "may", "can", "behavior", "behaviour", "setting"}


def is_number(v: Any) -> bool:
    return (type(v) is int or type(v) is float) and not isinstance(v, bool)


class ParamSpec:
    """What the verifier needs of one parameter schema, precomputed once per tools list."""
    __slots__ = ("kind", "string_class", "default", "items", "props", "required", "enum",
                 "unordered")

    def __init__(self, kind: str, string_class: str | None, default: Any, items, props, required,
                 enum: tuple | None = None, unordered: bool = False):
        self.kind, self.string_class, self.default = kind, string_class, default
        self.items, self.props, self.required = items, props, required
        self.enum, self.unordered = enum, unordered


class FnSpec:
    __slots__ = ("props", "required")

    def __init__(self, props: dict[str, ParamSpec], required: frozenset[str]):
        self.props, self.required = props, required


def _kind(schema: dict) -> str:
    t = schema.get("type")
    if isinstance(t, list):
        t = [x for x in t if x != "null"]
        t = t[0] if len(t) == 1 else None
    if t is None:
        for key in ("anyOf", "oneOf"):
            alts = [a for a in schema.get(key) or [] if isinstance(a, dict) and a.get("type") != "null"]
            if len(alts) == 1:
                return _kind(alts[0])
        if "enum" in schema and all(isinstance(e, str) for e in schema["enum"]):
            return "string"
        return "any"
    return _TYPES.get(str(t).lower(), "any")


def _coerce_default(raw: str, kind: str, enum: list | None) -> Any:
    quoted = raw[:1] in "'\"`"
    value = raw[1:-1] if quoted else raw.rstrip(".")
    try:
        if kind == "integer":
            return int(value)
        if kind == "number":
            return float(value) if "." in value else int(value)
    except ValueError:
        return MISSING
    if kind == "boolean":
        return {"true": True, "false": False}.get(value.lower(), MISSING)
    if kind == "string":
        if enum is not None:
            return value if value in enum else MISSING
        if quoted or (value.lower() not in _NOT_A_DEFAULT and len(value) > 1):
            return value
    return MISSING


def _param(name: str, schema: Any, from_desc: bool) -> ParamSpec:
    if not isinstance(schema, dict):
        schema = {}
    kind = _kind(schema)
    enum = schema.get("enum") if isinstance(schema.get("enum"), list) else None
    string_class = None
    desc = schema.get("description") if isinstance(schema.get("description"), str) else ""
    if (enum is not None or schema.get("format") in _ID_FORMATS or _ID_NAME.search(name)
            or _ID_DESC.search(desc[:200])):
        string_class = "exact"
    elif _FREE_NAME.search(name):
        string_class = "free"
    default = schema.get("default", MISSING)
    if isinstance(default, str) and kind in ("boolean", "integer", "number"):
        coerced = _coerce_default(default, kind, None)  # BFCL-style "false" for a boolean
        default = default if coerced is MISSING else coerced
    if default is MISSING and from_desc and isinstance(schema.get("description"), str):
        m = _DEFAULT_IN_DESC.search(schema["description"])
        if m:
            default = _coerce_default(m.group("v"), kind, enum)
    items = _param(name, schema.get("items"), from_desc) if kind in ("array", "any") and \
        isinstance(schema.get("items"), dict) else None
    props, required = None, frozenset()
    if isinstance(schema.get("properties"), dict):
        props = {k: _param(k, v, from_desc) for k, v in schema["properties"].items()}
        required = frozenset(r for r in schema.get("required") or [] if isinstance(r, str))
        arrays = [k for k, p in props.items() if p.kind == "array"]
        if len(arrays) > 1:  # parallel lists (item_ids[i] -> new_item_ids[i]): order pairs them
            for k in arrays:
                props[k].unordered = False
    str_enum = tuple(e for e in enum if isinstance(e, str)) if enum is not None else None
    unordered = (kind == "array" and bool(_UNORDERED_NAME.search(name))
                 and not _ORDERED_DESC.search(desc))
    return ParamSpec(kind, string_class, default, items, props, required, str_enum or None,
                     unordered)


def _fn_spec(tool: Any, from_desc: bool) -> tuple[str, FnSpec] | None:
    if not isinstance(tool, dict):
        return None
    fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
    name = fn.get("name")
    if not isinstance(name, str):
        return None
    params = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {}
    spec = _param("", {**params, "type": "object"}, from_desc)
    return name, FnSpec(spec.props if spec.props is not None else {}, spec.required)


def build_index(tools: list, from_desc: bool = True) -> dict[str, FnSpec]:
    """Function name → FnSpec for OpenAI tool schemas (or bare {name, parameters} docs)."""
    return dict(x for x in (_fn_spec(t, from_desc) for t in tools or []) if x is not None)


class _LazyIndex:
    """Specs built on first use, one function at a time: a turn offers many tools but its
    calls use one or two, and every turn of a profile run has its own copy of the tools."""
    __slots__ = ("tools", "from_desc", "specs")

    def __init__(self, tools: list, from_desc: bool):
        self.tools, self.from_desc, self.specs = tools, from_desc, {}

    def get(self, name: str) -> FnSpec | None:
        if name in self.specs:
            return self.specs[name]
        spec = None
        for tool in self.tools or []:
            fn = tool.get("function", tool) if isinstance(tool, dict) else None
            if isinstance(fn, dict) and fn.get("name") == name:
                # Every turn of a trajectory carries its own copy of the same schemas: share
                # the built spec by content (repr is cheap next to building it).
                key = (name, repr(fn.get("parameters")), self.from_desc)
                spec = _SPEC_CACHE.get(key)
                if spec is None:
                    built = _fn_spec(tool, self.from_desc)
                    spec = built[1] if built else None
                    if len(_SPEC_CACHE) > 4096:
                        _SPEC_CACHE.clear()
                    _SPEC_CACHE[key] = spec
                break
        self.specs[name] = spec
        return spec


_INDEX_CACHE: dict[tuple[int, bool], _LazyIndex] = {}
_SPEC_CACHE: dict[tuple[str, str, bool], FnSpec | None] = {}


def schema_index(tools: list, from_desc: bool = True) -> _LazyIndex:
    """A lazy name → FnSpec index, cached by the identity of the tools list (K samples)."""
    key = (id(tools), from_desc)
    hit = _INDEX_CACHE.get(key)
    if hit is not None and hit.tools is tools:
        return hit
    if len(_INDEX_CACHE) > 4096:
        _INDEX_CACHE.clear()
    index = _INDEX_CACHE[key] = _LazyIndex(tools, from_desc)  # holds `tools`: its id stays unique
    return index


def string_class(name: str, value: str, min_words: int) -> str:
    """'exact' | 'free' | 'value' for a string with no class from its schema."""
    if _ID_NAME.search(name):
        return "exact"
    words = value.split()
    if _FREE_NAME.search(name) or len(words) >= min_words:
        return "free"
    if len(words) == 1 and len(words[0]) == len(value) and _ID_VALUE.search(value):
        return "exact"  # user_42, a/b.txt, #W123, 2024-01-02: identifiers, not prose
    return "value"
