"""Tool schemas as the `toolcall` verifier reads them: kind, string class, default, enum, set.

`schema_index(tools)` is a lazy, cached name -> FnSpec index (a turn offers many tools but its
calls use one or two, and K samples of a turn share one tools list). Each parameter's spec is
computed once from its JSON schema. Only what the schema *states* grants an equivalence (the
principle is in `pivotrl.verifiers.arguments`); the parameter's name and description may only
make a comparison stricter, never looser:

- kind: string / integer / number / boolean / array / object / any (nullable unions unwrapped);
- string class: "exact" (identifiers and code: by `format`, by parameter name or description;
  compared code point for code point) or None (decided from the value, `string_class`);
- default: the schema's `default` key only (prose such as "defaults to X" in a description is
  not read: the first such phrase often describes something else);
- enum: the allowed values, and their ASCII case folds when every allowed value is ASCII (a value
  in another case is the same choice only when its fold names exactly one of them);
- format: the schema's `format` (only `format: email` grants a rule: the domain's case);
- unordered: `uniqueItems: true` (the schema says the array is a set);
- open: `additionalProperties` given as true or a schema (keys beyond `properties` are allowed;
  without it, an argument the schema does not name is not one the tool takes);
- free_text: `contentMediaType: text/plain` on a string that is not an identifier (JSON Schema's
  content vocabulary: the schema says the value is prose). Only such strings, and those the user
  names in `toolcall`'s `free_text`, get the `normalize` folds.
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
# Parameters whose strings are identifiers or code: compared code point for code point (no
# whitespace collapsing, no Unicode normalisation: "a  b.txt" and "a b.txt" are two files, and a
# file system does not normalise "é"). The name only makes a comparison stricter, never looser.
_ID_NAME = re.compile(
    r"(?:^|_)(?:id|ids|uuid|guid|key|keys|token|path|paths|file|files|filename|filenames|filepath|"
    r"dir|dirs|directory|folder|url|urls|uri|link|email|emails|username|user|login|password|"
    r"code|sku|symbol|ticker|hash|sha|branch|commit|repo|repos|handle|account|number|isbn|phone|"
    r"zip|zipcode|postcode|ip|host|hostname|port|domain|namespace|version|dest|destination|src|"
    r"source|target|receiver|recipient|sender|"
    # code: case, brackets and operators are meaning ("(1 + 2) * 3" is not "1 + 2 * 3")
    r"expression|expr|formula|equation|function|func|lambda|regex|pattern|script|command|cmd|"
    r"sql|program|snippet|selector|xpath|jsonpath)$|[a-z](?:Id|ID|Ids|Path|Url|URL|Key|Name)$")
_ID_FORMATS = {"email", "uri", "url", "uuid", "date", "date-time", "time", "hostname", "ipv4",
               "ipv6", "uri-reference", "iri"}
_ID_DESC = re.compile(r"\b(?:ID|IDs|UUID|identifier|IATA|ISO|file ?name|path|URL|e-?mail address)\b")
_ID_VALUE = re.compile(r"[\d_/@#:\\]|\.\w")
# ASCII digits only: Python's \d and int() also read "١٢" or "１２" as 12, a literal that JSON,
# JavaScript and typed backends reject (not the canonical literal of any number).
INT_LITERAL = re.compile(r"-?(?:0|[1-9][0-9]*)")
DEC_LITERAL = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?")


def is_number(v: Any) -> bool:
    return (type(v) is int or type(v) is float) and not isinstance(v, bool)


class ParamSpec:
    """What the verifier needs of one parameter schema, precomputed once per tools list."""
    __slots__ = ("kind", "string_class", "default", "items", "props", "required", "enum",
                 "enum_fold", "unordered", "format", "open", "free_text")

    def __init__(self, kind: str, string_class: str | None, default: Any, items, props, required,
                 enum: tuple | None = None, unordered: bool = False, format: str | None = None,
                 open: bool = False, free_text: bool = False):
        self.kind, self.string_class, self.default = kind, string_class, default
        self.items, self.props, self.required = items, props, required
        self.enum, self.unordered, self.format, self.open = enum, unordered, format, open
        self.free_text = free_text
        self.enum_fold = ascii_folds(enum) if enum else None


def ascii_folds(values: tuple) -> dict[str, str | None] | None:
    """ASCII-lower-cased allowed value -> the value (None where two values share a fold), or
    None when some allowed value is not ASCII (Unicode case folding merges look-alikes: "ſ" and
    "s", "ß" and "ss", the Kelvin sign and "k"; only A-Z/a-z fold one to one)."""
    if not all(v.isascii() for v in values):
        return None
    folds: dict[str, str | None] = {}
    for v in values:
        key = v.lower()
        folds[key] = None if key in folds and folds[key] != v else v
    return folds


class FnSpec:
    __slots__ = ("props", "required", "open")

    def __init__(self, props: dict[str, ParamSpec], required: frozenset[str], open: bool = False):
        self.props, self.required, self.open = props, required, open


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


def _typed_default(default: Any, kind: str) -> Any:
    """A schema default written as a string for a boolean/number parameter (BFCL writes
    "false", "10"): its canonical literal is the only value of that kind it can name; any other
    text is kept as it is (and then equals only that same string)."""
    if not isinstance(default, str) or kind not in ("boolean", "integer", "number"):
        return default
    if kind == "boolean":
        return {"true": True, "false": False}.get(default.lower(), default)
    try:  # (int() refuses more than 4300 digits: the text is kept as it is then)
        if INT_LITERAL.fullmatch(default):
            return int(default)
        if kind == "number" and DEC_LITERAL.fullmatch(default):
            return float(default)
    except ValueError:
        pass
    return default


def _param(name: str, schema: Any) -> ParamSpec:
    if not isinstance(schema, dict):
        schema = {}
    kind = _kind(schema)
    enum = schema.get("enum") if isinstance(schema.get("enum"), list) else None
    desc = schema.get("description") if isinstance(schema.get("description"), str) else ""
    fmt = schema.get("format") if isinstance(schema.get("format"), str) else None
    exact = (enum is not None or fmt in _ID_FORMATS or bool(_ID_NAME.search(name))
             or bool(_ID_DESC.search(desc[:200])))
    # `null` is a value: a `default: null` key makes omission equal null, nothing else does.
    default = _typed_default(schema.get("default", MISSING), kind)
    items = _param(name, schema.get("items")) if kind in ("array", "any") and \
        isinstance(schema.get("items"), dict) else None
    props, required = None, frozenset()
    if isinstance(schema.get("properties"), dict):
        props = {k: _param(k, v) for k, v in schema["properties"].items()}
        required = frozenset(r for r in schema.get("required") or [] if isinstance(r, str))
    str_enum = tuple(e for e in enum if isinstance(e, str)) if enum is not None else None
    # `uniqueItems: true` says the array holds distinct values with no meaning in their order
    # (a set, as JSON Schema draws it); a name like "tags" says nothing of the kind.
    unordered = kind == "array" and schema.get("uniqueItems") is True
    extra = schema.get("additionalProperties")
    free_text = not exact and kind in ("string", "any") and \
        schema.get("contentMediaType") == "text/plain"
    return ParamSpec(kind, "exact" if exact else None, default, items, props, required,
                     str_enum or None, unordered, fmt, extra is True or isinstance(extra, dict),
                     free_text)


def _fn_spec(tool: Any) -> tuple[str, FnSpec] | None:
    if not isinstance(tool, dict):
        return None
    fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
    name = fn.get("name")
    if not isinstance(name, str):
        return None
    params = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {}
    spec = _param("", {**params, "type": "object"})
    return name, FnSpec(spec.props if spec.props is not None else {}, spec.required, spec.open)


def build_index(tools: list) -> dict[str, FnSpec]:
    """Function name → FnSpec for OpenAI tool schemas (or bare {name, parameters} docs)."""
    return dict(x for x in (_fn_spec(t) for t in tools or []) if x is not None)


class _LazyIndex:
    """Specs built on first use, one function at a time: a turn offers many tools but its
    calls use one or two, and every turn of a profile run has its own copy of the tools."""
    __slots__ = ("tools", "specs")

    def __init__(self, tools: list):
        self.tools, self.specs = tools, {}

    def get(self, name: str) -> FnSpec | None:
        if name in self.specs:
            return self.specs[name]
        spec = None
        for tool in self.tools or []:
            fn = tool.get("function", tool) if isinstance(tool, dict) else None
            if isinstance(fn, dict) and fn.get("name") == name:
                # Every turn of a trajectory carries its own copy of the same schemas: share
                # the built spec by content (repr is cheap next to building it).
                key = (name, repr(fn.get("parameters")))
                spec = _SPEC_CACHE.get(key)
                if spec is None:
                    built = _fn_spec(tool)
                    spec = built[1] if built else None
                    if len(_SPEC_CACHE) > 4096:
                        _SPEC_CACHE.clear()
                    _SPEC_CACHE[key] = spec
                break
        self.specs[name] = spec
        return spec


_INDEX_CACHE: dict[int, _LazyIndex] = {}
_SPEC_CACHE: dict[tuple[str, str], FnSpec | None] = {}


def schema_index(tools: list) -> _LazyIndex:
    """A lazy name → FnSpec index, cached by the identity of the tools list (K samples)."""
    key = id(tools)
    hit = _INDEX_CACHE.get(key)
    if hit is not None and hit.tools is tools:
        return hit
    if len(_INDEX_CACHE) > 4096:
        _INDEX_CACHE.clear()
    index = _INDEX_CACHE[key] = _LazyIndex(tools)  # holds `tools`: its id stays unique
    return index


def not_offered(index: _LazyIndex, name: str, args: Any) -> str:
    """Why a call is not one the turn's tools offer ("" when it is): a tool not in the list, or
    an argument its schema does not name (unless `additionalProperties` allows more). A
    verifier asks only when the turn offers tools: such a call is a wrong action, whatever the
    expert did (the environment rejects it, or runs what it never offered)."""
    fn = index.get(name)
    if fn is None:
        return f"tool {name!r} is not offered at this turn"
    if not fn.open and isinstance(args, dict):
        unknown = next((k for k in args if k not in fn.props), None)
        if unknown is not None:
            return f"unknown argument {unknown!r} (not in the schema of {name!r})"
    return ""


def string_class(name: str, value: str) -> str | None:
    """'exact' for a string that has no class from its schema but is an identifier by its
    parameter's name or its own shape (user_42, a/b.txt, #W123, 2024-01-02), else None."""
    if _ID_NAME.search(name):
        return "exact"
    if value and not any(ch.isspace() for ch in value) and _ID_VALUE.search(value):
        return "exact"
    return None
