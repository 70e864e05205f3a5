"""Argument values compared under a parameter spec: the rules of `toolcall`, each with why it is safe.

Real backends disagree on case, whitespace, list order and types, so no single blanket rule is
right; each rule below is decided by the parameter's schema and the value, and refuses when the
difference could change what the call does.

- Numbers by value, integers exactly: 5 == 5.0 for a `number` parameter (JSON has one number
  type), but an integer-valued side is compared as an exact integer, never by closeness
  (12345678901234567 vs 1.2345678901234568e16 is another id). Two non-integral floats may differ
  by rounding noise (rel 1e-12). A float for an `integer` parameter is a difference unless
  `int_float_equal`. Booleans are not numbers.
- A numeric string for an `integer`/`number` parameter ("2" for 2), with `numeric_strings`: the
  schema says the value is a number, and schema-validating backends (pydantic's lax mode,
  FastAPI, the testbed worlds) parse the canonical literal to that number. Only canonical
  literals ("2", "-3", "1.5"): "02", " 2", "2e0" or "two" are differences.
- Enums: exactly, or in another case when the value folds to exactly one allowed value (the
  schema leaves one choice it can mean; backends that match enums case-insensitively and those
  that do not both receive a value the schema names).
- Identifiers (ids, keys, paths, urls, e-mails, codes, names of files/users/repos, enums,
  dates) and code (expressions, formulas, regexes, commands, SQL): exactly; e-mail addresses up to case (mail systems match them case-insensitively).
- Short values (a city, a unit): equal as *tokens*: case folded, runs of whitespace, a comma
  or semicolon after a word and a full stop after a letter dropped (`value_tokens`). Nothing
  else is dropped (brackets and operators are meaning in "(1 + 2) * 3"): "1.5" != "15", "-5" != "5", "12/1/2024" != "1/21/2024",
  "40.7,-74.0" keeps its signs. In calls that change state (create_*, update_*, …) such values
  compare exactly (`strict`): a state checker sees the stored string.
- Free text (message, description, query, or many words): equal as tokens, or token similarity
  >= the threshold *and* the same numbers, identifiers and negations in the same order *and* no
  word replaced by another except by a one-letter typo (`messages.free_text_differs`): a long
  text may gain or lose a word or carry a typo, never be flipped ("not"), retargeted (an id)
  or reversed ("increase" for "decrease").
- Arrays in order, except parameters whose name says the order is meaningless (tags, cc,
  recipients, …; see `schema._UNORDERED_NAME`) and that have no sibling array they could be
  paired with: those compare as multisets.
- Objects recursively with their own schema; unknown keys, missing required keys, omitted
  optional keys against their default (below).
- An omitted optional argument equals its default (schema `default` or one stated in the
  description); an explicit null equals omission when no default is known; with no known
  default, omitted vs given is a difference.
"""

from __future__ import annotations

import math
import re
import unicodedata
from typing import Any

from pivotrl.verifiers.messages import free_text_differs
from pivotrl.verifiers.schema import MISSING, ParamSpec, string_class

_SCALARS = (str, int, float, bool)
_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[A-Za-z]{2,}")
_INT_LITERAL = re.compile(r"-?(?:0|[1-9]\d*)")
_DEC_LITERAL = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?")
_TRAILING = re.compile(r"(?<=\w)[,;]+$|(?<=[^\W\d])\.$")

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


def is_number(v: Any) -> bool:
    return (type(v) is int or type(v) is float) and not isinstance(v, bool)


def value_tokens(s: str) -> list[str]:
    """Case-folded whitespace tokens; a comma or semicolon after a word and a full stop after
    a letter are separators, not content ("New York, NY" == "new york ny", "St." == "St").
    Nothing else is dropped: brackets, quotes, signs, "!" and "." inside or after a digit stay."""
    out = []
    for chunk in s.casefold().split():
        tok = _TRAILING.sub("", chunk)
        if tok:
            out.append(tok)
    return out


def _as_int(v: int | float) -> int | None:
    if type(v) is int:
        return v
    if v.is_integer() and abs(v) <= 2 ** 53:  # beyond 2**53 a float no longer names one integer
        return int(v)
    return None


def numbers_equal(exp: int | float, cand: int | float) -> bool:
    if type(exp) is float and type(cand) is float and not (exp.is_integer() and cand.is_integer()):
        return exp == cand or math.isclose(exp, cand, rel_tol=1e-12, abs_tol=0.0)
    e, c = _as_int(exp), _as_int(cand)
    return e is not None and e == c


def _numeric_literal(s: str, kind: str) -> int | float | None:
    if kind == "integer" and _INT_LITERAL.fullmatch(s):
        return int(s)
    if kind == "number" and _DEC_LITERAL.fullmatch(s):
        return int(s) if _INT_LITERAL.fullmatch(s) else float(s)
    return None


class ArgumentComparer:
    """Value comparison under a parameter spec; each method returns "" when equal, else the
    difference (the reason a reward is 0)."""

    def __init__(self, int_float_equal: bool, numeric_strings: bool, free_text_threshold: float,
                 free_text_min_words: int):
        self.int_float_equal, self.numeric_strings = int_float_equal, numeric_strings
        self.threshold, self.min_words = free_text_threshold, free_text_min_words
        self.strict = False  # set per call: short strings in state-changing calls compare exactly

    def value(self, spec: ParamSpec | None, name: str, exp: Any, cand: Any) -> str:
        te = type(exp)
        if te is type(cand) and te in _SCALARS and exp == cand:
            return ""  # the common case, before any rule
        kind = spec.kind if spec is not None else "any"
        if exp is None or cand is None or isinstance(exp, bool) or isinstance(cand, bool):
            return "" if exp is cand else f"{name}: {cand!r} != {exp!r}"
        if self.numeric_strings and kind in ("integer", "number") and (
                isinstance(exp, str) or isinstance(cand, str)):
            exp = _numeric_literal(exp, kind) if isinstance(exp, str) else exp
            cand = _numeric_literal(cand, kind) if isinstance(cand, str) else cand
            if exp is None or cand is None:
                return f"{name}: not the same number"
        if is_number(exp) or is_number(cand):
            if not (is_number(exp) and is_number(cand)):
                return f"{name}: type differs ({type(cand).__name__} vs {type(exp).__name__})"
            if kind == "integer" and not self.int_float_equal and type(exp) is not type(cand):
                return f"{name}: {cand!r} is not an integer"
            return "" if numbers_equal(exp, cand) else f"{name}: {cand!r} != {exp!r}"
        if isinstance(exp, str) or isinstance(cand, str):
            if not (isinstance(exp, str) and isinstance(cand, str)):
                return f"{name}: type differs ({type(cand).__name__} vs {type(exp).__name__})"
            return self.string(spec, name, exp, cand)
        if isinstance(exp, list) or isinstance(cand, list):
            if not (isinstance(exp, list) and isinstance(cand, list)):
                return f"{name}: type differs ({type(cand).__name__} vs {type(exp).__name__})"
            return self.array(spec, name, exp, cand)
        if isinstance(exp, dict) and isinstance(cand, dict):
            return self.fields(spec.props if spec is not None else None,
                               spec.required if spec is not None else frozenset(), name, exp, cand)
        return "" if exp == cand else f"{name}: {cand!r} != {exp!r}"

    def string(self, spec: ParamSpec | None, name: str, exp: str, cand: str) -> str:
        if exp == cand or unicodedata.normalize("NFC", exp) == unicodedata.normalize("NFC", cand):
            return ""  # canonically equivalent Unicode ("é" as one or two code points): same text
        differ = f"{name}: {cand!r} != {exp!r}"
        enum = spec.enum if spec is not None else None
        if enum is not None:
            folded = [e for e in enum if e.casefold() == cand.casefold()]
            return "" if exp in enum and folded == [exp] else differ
        cls = spec.string_class if spec is not None else None
        if cls is None:
            key = name.rsplit(".", 1)[-1].split("[", 1)[0]
            cls = string_class(key, exp, self.min_words)
        if "@" in exp and _EMAIL.fullmatch(exp) and exp.casefold() == cand.casefold():
            return ""  # e-mail addresses: every real system matches them case-insensitively
        if cls == "exact" or (self.strict and cls == "value"):
            return differ + " (compared exactly)"
        if value_tokens(exp) == value_tokens(cand):
            return ""
        if cls == "free":
            reason = free_text_differs(exp, cand, self.threshold)
            return f"{name}: {reason}" if reason else ""
        return differ

    def array(self, spec: ParamSpec | None, name: str, exp: list, cand: list) -> str:
        if len(exp) != len(cand):
            return f"{name}: {len(cand)} items != {len(exp)}"
        items = spec.items if spec is not None else None
        if spec is not None and spec.unordered:
            left = list(range(len(cand)))
            for i, e in enumerate(exp):  # greedy: can only miss a match, never invent one
                j = next((j for j in left if not self.value(items, f"{name}[{i}]", e, cand[j])),
                         None)
                if j is None:
                    return f"{name}: {e!r} not among the candidate's items"
                left.remove(j)
            return ""
        for i, (e, c) in enumerate(zip(exp, cand)):
            diff = self.value(items, f"{name}[{i}]", e, c)
            if diff:
                return diff
        return ""

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
                    return f"{prefix}{key}: given on one side only and no default is known"
                e = default if e is MISSING else e
                c = default if c is MISSING else c
            diff = self.value(spec, prefix + key, e, c)
            if diff:
                return diff
        return ""
