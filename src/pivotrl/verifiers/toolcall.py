"""`toolcall`: schema-aware functional equivalence of tool calls.

Does the candidate *do* what the expert's action does? Rules (each a place where a false positive
would be a reward leak, so the default is to refuse when unsure):

- Call vs message: an expert call answered by a message scores 0, and vice versa. When both
  called tools, text content around the calls is ignored (the calls are the action).
- Calls are a multiset: same number of calls, and an optimal one-to-one matching (order ignored)
  in which every pair is equivalent. Otherwise 0 (partial credit only if configured).
- A pair is equivalent when the function name is the same and the arguments are equal *as
  values* under the function's schema (from the turn's `tools`):
  * key order is irrelevant; an argument the schema does not know scores 0 (unless the expert
    passed it too); a required argument the candidate dropped scores 0;
  * an omitted optional argument equals its default: the schema `default`, or (with
    `defaults_from_description`) a default stated in the description ("defaults to 'units'");
    an explicit null equals omission when the default is null or unknown; with no known
    default, omitted vs given is a difference;
  * numbers by value (an int for a `number` parameter: 5 == 5.0); a float for an `integer`
    parameter is a difference unless `int_float_equal` (BFCL, NVIDIA's comparator and typed
    executors reject it); booleans are not numbers; "5" is not 5 (a string where the schema
    says number is a different call for any typed executor);
  * enums, identifiers (parameter names like *_id, path, file, url, email, …; `format`; "ID",
    "identifier", "path", … in the description; values without spaces that contain digits or
    path/id punctuation) exactly, e-mail addresses up to case;
  * free text (parameter names like message, description, query, …, or ≥ `free_text_min_words`
    words) by similarity of normalised token sequences (1 − token edit distance / longer length)
    ≥ `free_text_threshold`; other short strings equal after case folding and dropping
    whitespace and `,./-_*^` (BFCL's normalisation: "New York, NY" == "new york ny");
  * in calls that change state (create_*, update_*, send_*, book_*, …) those short strings
    compare exactly too: a state checker sees the stored value, not a folded one;
  * arrays element-wise, in order; objects recursively with their own schema.
- When the expert sent a message, a message is never a free pass: `message_rule` decides
  (similarity to the expert's text, both being refusals, or the LLM judge).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pivotrl.actions import call_arguments
from pivotrl.records import Message, Turn, message_text
from pivotrl.verifiers.base import Score
from pivotrl.verifiers.judge import JudgeVerifier

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
    r"source|target|receiver|recipient|sender)$|[a-z](?:Id|ID|Ids|Path|Url|URL|Key|Name)$")
_FREE_NAME = re.compile(
    r"(?:^|_)(?:description|desc|message|msg|content|body|text|query|prompt|note|notes|comment|"
    r"comments|reason|summary|title|subject|instruction|instructions|question|answer|feedback|"
    r"review|bio|caption|keyword|keywords|topic|details|memo|caption|statement)$", re.I)
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
    __slots__ = ("kind", "string_class", "default", "items", "props", "required")

    def __init__(self, kind: str, string_class: str | None, default: Any, items, props, required):
        self.kind, self.string_class, self.default = kind, string_class, default
        self.items, self.props, self.required = items, props, required


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
    return ParamSpec(kind, string_class, default, items, props, required)


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


class ToolcallConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    free_text_threshold: float = Field(
        0.95, description="Min similarity (1 − token edit distance / longer length, on normalised "
                          "tokens) for free-text arguments. 0.95: texts under 20 tokens must match "
                          "exactly after normalisation (BFCL and state checkers compare text "
                          "exactly; 0.9 let 19 BFCL mutations through).")
    free_text_min_words: int = Field(
        6, description="A string argument with at least this many words is free text even if "
                       "its parameter name does not say so.")
    message_rule: Literal["similarity", "judge", "any"] = Field(
        "similarity", description="How a message is judged when the expert sent a message: "
                                  "'similarity' (text similarity or both refusals), 'judge' (the LLM "
                                  "judge verifier), 'any' (every message scores 1: NeMo-Gym's rule, "
                                  "a known reward leak, only for ablations).")
    message_threshold: float = Field(
        0.8, description="Min token similarity of two messages under message_rule='similarity'.")
    refusal_match: bool = Field(
        True, description="Under 'similarity', a refusal answering an expert refusal scores 1 "
                          "(both decline to call a tool: the functional decision is the same).")
    int_float_equal: bool = Field(
        False, description="Accept 5.0 for an *integer* parameter. Default False: BFCL's checker, "
                            "NVIDIA's comparator and typed executors (range(5.0), list[5.0]) reject "
                            "it. An int for a *number* parameter is always accepted (5 == 5.0).")
    defaults_from_description: bool = Field(
        True, description="Read defaults stated in parameter descriptions ('defaults to X') when "
                          "the schema has no `default` key (common in real tool schemas).")
    strict_strings_in_writes: bool = Field(
        True, description="In calls that change state (the function name starts with a write verb: "
                          "create, update, send, book, …) short strings compare exactly, not after "
                          "case/punctuation folding: a state checker sees the stored value.")
    partial_credit: bool = Field(
        False, description="With several calls, reward = matched pairs / max(expert, candidate) "
                           "calls instead of all-or-nothing.")
    max_action_chars: int = Field(
        32768, description="A candidate whose text + arguments exceed this many characters "
                           "scores 0 (runaway output is not an action).")
    judge: dict[str, Any] = Field(
        default_factory=dict, description="Config of the 'judge' verifier for message_rule='judge'.")


_SCALARS = (str, int, float, bool)
_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[A-Za-z]{2,}")
_PUNCT = re.compile(r"[\s,./\-_*^]+")
_WORD = re.compile(r"\w+")
_REFUSAL = re.compile(
    r"\b(cannot|can ?not|can't|can’t|unable|not able|no (?:suitable |available |relevant |"
    r"appropriate |applicable )?(?:function|tool)s?|none of the (?:available |provided |given )?"
    r"(?:function|tool)s|don't have|do not have|doesn't (?:have|support|provide)|does not "
    r"(?:have|support|provide)|not (?:possible|available|supported|applicable|relevant|suitable)|"
    r"i'm sorry|i am sorry|apologi[sz]e|unfortunately|beyond|outside (?:the |my )?scope|lack)\b",
    re.I)


def _norm_value(s: str) -> str:
    return _PUNCT.sub("", s).casefold()


def _tokens(s: str) -> list[str]:
    return _WORD.findall(s.casefold())


MAX_SIMILARITY_TOKENS = 2000  # longer texts must match after normalisation (bounded cost)


def token_similarity(a: str, b: str, at_least: float = 0.0) -> float:
    """1 − token-level Levenshtein distance / longer token count (order-aware).

    With `at_least`, the answer is exact only when it is ≥ at_least; below that any value under
    at_least may be returned (a band of width (1 − at_least)·n keeps long texts cheap)."""
    ta, tb = _tokens(a), _tokens(b)
    if ta == tb:
        return 1.0
    n = max(len(ta), len(tb))
    if not ta or not tb or n > MAX_SIMILARITY_TOKENS:
        return 0.0
    max_dist = int((1.0 - at_least) * n + 1e-9)
    if abs(len(ta) - len(tb)) > max_dist:
        return 1.0 - abs(len(ta) - len(tb)) / n  # an upper bound, already below at_least
    big = n + 1
    prev = [j if j <= max_dist else big for j in range(len(tb) + 1)]
    for i, x in enumerate(ta, 1):
        lo, hi = max(1, i - max_dist), min(len(tb), i + max_dist)
        cur = [big] * (len(tb) + 1)
        cur[0] = i if i <= max_dist else big
        for j in range(lo, hi + 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != tb[j - 1]))
        if min(cur[lo - 1:hi + 1]) > max_dist:
            return 0.0
        prev = cur
    return 1.0 - min(prev[-1], big) / n


def is_refusal(text: str) -> bool:
    return bool(_REFUSAL.search(text))


_WRITE_VERB = re.compile(
    r"^(?:create|add|update|set|send|post|write|edit|modify|delete|remove|book|reserve|cancel|"
    r"insert|put|patch|rename|move|mv|cp|copy|touch|mkdir|rm|rmdir|echo|submit|register|transfer|"
    r"pay|order|purchase|buy|sell|schedule|assign|upload|save|change|reply|comment|tweet|retweet|"
    r"exchange|return|refund|close|open|archive|enable|disable|toggle|mark|approve|reject|place|"
    r"make|apply|grant|revoke|invite|share|publish|store|record|log|enroll|subscribe|"
    r"unsubscribe|follow|unfollow|block|unblock|redeem|issue|file|raise|resolve|"
    r"fill|sort|diff|sed|tee)(?:_|$|[A-Z])", re.I)


def is_write(function_name: str) -> bool:
    """Does the call (by its name's leading verb) change state? `ns.Class.create_x` → yes."""
    return bool(_WRITE_VERB.match(function_name.rsplit(".", 1)[-1]))


class _Compare:
    """Value comparison under a parameter spec; returns "" when equal, else the difference."""

    def __init__(self, cfg: ToolcallConfig):
        self.cfg = cfg
        self.strict = False  # set per call: strings in state-changing calls compare exactly

    def value(self, spec: ParamSpec | None, name: str, exp: Any, cand: Any) -> str:
        te = type(exp)
        if te is type(cand) and te in _SCALARS and exp == cand:
            return ""  # the common case, before any rule
        kind = spec.kind if spec is not None else "any"
        if exp is None or cand is None:
            return "" if exp is cand else f"{name}: {cand!r} != {exp!r}"
        if isinstance(exp, bool) or isinstance(cand, bool):
            return "" if exp is cand else f"{name}: {cand!r} != {exp!r}"
        if is_number(exp) or is_number(cand):
            if not (is_number(exp) and is_number(cand)):
                return f"{name}: type differs ({type(cand).__name__} vs {type(exp).__name__})"
            if (kind == "integer" and not self.cfg.int_float_equal
                    and type(exp) is not type(cand)):
                return f"{name}: {cand!r} is not an integer"
            if exp == cand or (type(exp) is float or type(cand) is float) and math.isclose(
                    exp, cand, rel_tol=1e-12, abs_tol=0.0):
                return ""
            return f"{name}: {cand!r} != {exp!r}"
        if isinstance(exp, str) or isinstance(cand, str):
            if not (isinstance(exp, str) and isinstance(cand, str)):
                return f"{name}: type differs ({type(cand).__name__} vs {type(exp).__name__})"
            return self.string(spec, name, exp, cand)
        if isinstance(exp, list) or isinstance(cand, list):
            if not (isinstance(exp, list) and isinstance(cand, list)):
                return f"{name}: type differs ({type(cand).__name__} vs {type(exp).__name__})"
            if len(exp) != len(cand):
                return f"{name}: {len(cand)} items != {len(exp)}"
            items = spec.items if spec is not None else None
            for i, (e, c) in enumerate(zip(exp, cand)):
                diff = self.value(items, f"{name}[{i}]", e, c)
                if diff:
                    return diff
            return ""
        if isinstance(exp, dict) and isinstance(cand, dict):
            return self.fields(spec.props if spec is not None else None,
                               spec.required if spec is not None else frozenset(), name, exp, cand)
        return "" if exp == cand else f"{name}: {cand!r} != {exp!r}"

    def string(self, spec: ParamSpec | None, name: str, exp: str, cand: str) -> str:
        if exp == cand:
            return ""
        cls = spec.string_class if spec is not None else None
        if cls is None:
            key = name.rsplit(".", 1)[-1].split("[", 1)[0]
            cls = string_class(key, exp, self.cfg.free_text_min_words)
        if "@" in exp and _EMAIL.fullmatch(exp) and exp.casefold() == cand.casefold():
            return ""  # e-mail addresses: every real system matches them case-insensitively
        if cls == "exact" or (self.strict and cls == "value"):
            return f"{name}: {cand!r} != {exp!r} (compared exactly)"
        if _norm_value(exp) == _norm_value(cand):
            return ""
        threshold = self.cfg.free_text_threshold
        if cls == "free" and token_similarity(exp, cand, threshold) >= threshold:
            return ""
        return f"{name}: {cand!r} != {exp!r}"

    def fields(self, props: dict[str, ParamSpec] | None, required: frozenset[str], where: str,
               exp: dict, cand: dict) -> str:
        prefix = f"{where}." if where else ""
        if props is not None:
            for key in cand:
                if key not in props and key not in exp:  # the expert's own extras are compared
                    return f"unknown argument {prefix}{key}"
        for key in required:
            if key not in cand:
                return f"missing required argument {prefix}{key}"
        for key in [*exp, *(k for k in cand if k not in exp)]:  # a stable order for reasons
            spec = props.get(key) if props is not None else None
            e, c = exp.get(key, MISSING), cand.get(key, MISSING)
            if e is MISSING or c is MISSING:
                default = spec.default if spec is not None else MISSING
                if default is MISSING and (e is None or c is None) and key not in required:
                    continue  # explicit null for an optional argument with no known default
                if default is MISSING:
                    return (f"{prefix}{key}: given on one side only and no default is known")
                e = default if e is MISSING else e
                c = default if c is MISSING else c
            diff = self.value(spec, prefix + key, e, c)
            if diff:
                return diff
        return ""


def _calls(message: Message) -> tuple[list[tuple[str, dict, str | None]], int]:
    """(name, arguments, arguments text) of each call, and the size of the arguments text."""
    out, size = [], 0
    for call in message.tool_calls or []:
        raw = call.function.arguments
        if isinstance(raw, str):
            size += len(raw)
        else:
            raw = None
        out.append((call.function.name, call_arguments(call.function.arguments), raw))
    return out, size


def _perfect_matching(ok: list[list[bool]]) -> int:
    """Size of a maximum matching in the bipartite graph ok[i][j] (Kuhn's algorithm)."""
    n, m = len(ok), len(ok[0]) if ok else 0
    match_of: list[int] = [-1] * m

    def augment(i: int, seen: list[bool]) -> bool:
        for j in range(m):
            if ok[i][j] and not seen[j]:
                seen[j] = True
                if match_of[j] == -1 or augment(match_of[j], seen):
                    match_of[j] = i
                    return True
        return False

    return sum(augment(i, [False] * m) for i in range(n))


class ToolcallVerifier:
    name = "toolcall"

    def __init__(self, **config):
        self.config = ToolcallConfig(**config)
        self._cmp = _Compare(self.config)
        self._expected_cache: dict[int, tuple[Message, list[tuple[str, dict, str]]]] = {}
        self._judge = None

    def _expected(self, turn: Turn) -> list[tuple[str, dict, str]]:
        hit = self._expected_cache.get(id(turn.expected))
        if hit is not None and hit[0] is turn.expected:
            return hit[1]
        # The arguments text as parse_completion writes it: an identical candidate is equal
        # without any comparison (the usual case once the policy is good).
        calls = [(n, a, json.dumps(a, ensure_ascii=False)) for n, a, _ in _calls(turn.expected)[0]]
        if len(self._expected_cache) > 4096:
            self._expected_cache.clear()
        self._expected_cache[id(turn.expected)] = (turn.expected, calls)
        return calls

    def score(self, turn: Turn, action: Message | None) -> Score:
        if action is None:
            return Score(0.0, False, "unparseable action")
        try:
            cand, size = _calls(action)
        except (ValueError, TypeError, RecursionError) as exc:
            return Score(0.0, False, f"malformed candidate call: {exc}")
        if size == 0 and cand:  # arguments given as objects: measure them once
            size = sum(len(json.dumps(a)) for _, a, _ in cand)
        size += len(message_text(action))
        if size > self.config.max_action_chars:
            return Score(0.0, False, f"action too long ({size} characters)")
        try:
            expected = self._expected(turn)
        except (ValueError, TypeError, RecursionError) as exc:
            return Score(0.0, False, f"expert action unusable: {exc}")
        if expected and not cand:
            return Score(0.0, True, "message instead of a tool call")
        if cand and not expected:
            return Score(0.0, True, "tool call where the expert answered with a message")
        if not expected:
            return self._score_message(turn, action)
        index = schema_index(turn.tools, self.config.defaults_from_description)
        if len(cand) != len(expected) and not self.config.partial_credit:
            return Score(0.0, True, f"{len(cand)} calls where the expert made {len(expected)}")
        diffs = [["" if cn == en and cr == er else self._pair(index, en, ea, cn, ca)
                  for cn, ca, cr in cand] for en, ea, er in expected]
        if len(expected) == 1 and len(cand) == 1:
            return Score(0.0 if diffs[0][0] else 1.0, True, diffs[0][0])
        matched = _perfect_matching([[not d for d in row] for row in diffs])
        total = max(len(expected), len(cand))
        if matched == total:
            return Score(1.0, True, "")
        reason = next((d for row in diffs for d in row if d), "calls differ")
        reward = matched / total if self.config.partial_credit else 0.0
        return Score(reward, True, f"{matched}/{total} calls match; e.g. {reason}")

    def _pair(self, index, en: str, ea: dict, cn: str, ca: dict) -> str:
        # "a.b" called as "a_b" (function-calling APIs forbid dots) is the same function when
        # "a_b" is not itself a tool.
        if cn != en and not (cn == en.replace(".", "_") and index.get(cn) is None):
            return f"function {cn!r} != {en!r}"
        fn = index.get(en)
        self._cmp.strict = self.config.strict_strings_in_writes and is_write(en)
        if fn is None:
            return self._cmp.fields(None, frozenset(), "", ea, ca)
        return self._cmp.fields(fn.props, fn.required, "", ea, ca)

    def _score_message(self, turn: Turn, action: Message) -> Score:
        rule = self.config.message_rule
        if rule == "any":
            return Score(1.0, True, "any message accepted (message_rule=any)")
        if rule == "judge":
            if self._judge is None:
                self._judge = JudgeVerifier(**self.config.judge)
            return self._judge.score(turn, action)
        exp_text, cand_text = message_text(turn.expected), message_text(action)
        if not cand_text.strip():
            return Score(0.0, True, "empty message")
        if self.config.refusal_match and is_refusal(exp_text) and is_refusal(cand_text):
            return Score(1.0, True, "both decline")
        sim = token_similarity(exp_text, cand_text, self.config.message_threshold)
        if sim >= self.config.message_threshold:
            return Score(1.0, True, "")
        return Score(0.0, True, f"message similarity {sim:.2f} < {self.config.message_threshold}")

    def score_batch(self, turns: Sequence[Turn], actions: Sequence[Message | None]) -> list[Score]:
        return [self.score(t, a) for t, a in zip(turns, actions, strict=True)]
