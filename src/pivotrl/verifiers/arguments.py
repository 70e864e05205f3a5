"""Argument values compared under a parameter spec: the rules of `toolcall`, each with why it is safe.

The principle: **a value pays only when a rule proves it means the same.** Two values are equal
when they are the same JSON value of the same JSON type, or when one of the rules below (each
granted by the JSON schema itself, never by a parameter's name or by prose in a description)
proves them the same. Anything no rule can prove is a difference: 0, or, where the user
configured it (`toolcall`'s `unproven_rule: judge`), a question for the judge. Such differences
carry `UNPROVEN` in their reason; every other difference is proven (another number, another
type, another enum case, a missing required key).

- Numbers by value, exactly: 5 == 5.0 for a `number` parameter (JSON Schema: an integer *is* a
  number, and both texts denote one value), but never by closeness: 12345678901234567 vs
  1.2345678901234568e16 is another id, 0.3 vs 0.30000000000000004 another value. A float for
  an `integer` parameter is a difference unless `int_float_equal`. Booleans are not numbers.
- A numeric string for an `integer`/`number` parameter ("2" for 2) only with `numeric_strings`
  (the user declares a backend that parses the canonical literal to that number): "02", " 2",
  "2e0" or "two" are differences even then.
- `null` is a value, not an omission: in an update call null means "remove". Omitted equals null
  only where the schema's `default` is null.
- Strings:
  - identifiers and code (by `format`, by parameter name, or by shape: one token with a digit or
    id punctuation) compare code point for code point: a file system or database does not fold
    case, whitespace or Unicode (a difference there is proven: another id, another program);
  - e-mail addresses: the domain part up to ASCII case (DNS names are case-insensitive by
    RFC 4343); the local part exactly (RFC 5321 lets the receiving host treat it as
    case-sensitive);
  - an `enum` value in another case when it folds to exactly one allowed value: the schema
    leaves one choice it can mean (a fold matching two allowed values proves nothing);
  - any other one-line string: equal after Unicode NFC and collapsing runs of whitespace; a
    string with a line break on either side (file contents, code, YAML, Markdown: line breaks
    and indentation are syntax there) only after NFC. NFC is
    canonical equivalence (the Unicode standard defines the two sequences as the same text:
    "é" as one or two code points); NFKC is not used, it merges different characters ("ﬁ" and
    "fi", "²" and "2"). Case, punctuation, look-alike letters and every word count: "Hire" is
    not "hire" (nor "fire"), "mg" is not "Mg", "-f" is not "-F", "1.5 km" is not "15 km".
    Differences in such text are `UNPROVEN` (the judge may decide), not proven.
- Arrays in order; as sets only with `uniqueItems: true` (the schema says the items are a set).
- Objects recursively with their own schema: an unknown key, a missing required key, or a key
  given on one side only are differences, except that an omitted key equals the schema's own
  `default` for it.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from pivotrl.verifiers.schema import (DEC_LITERAL, INT_LITERAL, MISSING, ParamSpec, is_number,
                                      string_class)

_SCALARS = (str, int, float, bool)
_EMAIL = re.compile(r"[^@\s]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
UNPROVEN = "(not proven equal)"
_WHITESPACE = re.compile(
    "[\t\n\v\f\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+")
_LINE_BREAK = re.compile(r"[\n\r\v\f\x1c-\x1e\x85\u2028\u2029]")


def nfc(s: str) -> str:
    return s if s.isascii() else unicodedata.normalize("NFC", s)


def text_key(s: str) -> str:
    """The form in which two texts compare: NFC (canonical equivalence), runs of whitespace as
    one space, no leading/trailing whitespace. Whitespace is Unicode's White_Space property
    (`str.split` would also split at the control characters U+001C–U+001F). Nothing else is
    folded."""
    return _WHITESPACE.sub(" ", nfc(s)).strip(" ")


def _as_int(v: int | float) -> int | None:
    if type(v) is int:
        return v
    if v.is_integer() and abs(v) <= 2 ** 53:  # beyond 2**53 a float no longer names one integer
        return int(v)
    return None


def numbers_equal(exp: int | float, cand: int | float) -> bool:
    if type(exp) is float and type(cand) is float and not (exp.is_integer() and cand.is_integer()):
        return exp == cand
    e, c = _as_int(exp), _as_int(cand)
    return e is not None and e == c


def _numeric_literal(s: str, kind: str) -> int | float | None:
    if kind == "integer" and INT_LITERAL.fullmatch(s):
        return int(s)
    if kind == "number" and DEC_LITERAL.fullmatch(s):
        return int(s) if INT_LITERAL.fullmatch(s) else float(s)
    return None


def _emails_equal(exp: str, cand: str) -> bool:
    if not (_EMAIL.fullmatch(exp) and _EMAIL.fullmatch(cand)):
        return False
    local_e, _, domain_e = exp.rpartition("@")
    local_c, _, domain_c = cand.rpartition("@")
    return local_e == local_c and domain_e.lower() == domain_c.lower()


def is_unproven(reason: str) -> bool:
    """Is this difference one that no rule could prove either way (a judge may decide)?"""
    return reason.endswith(UNPROVEN)


class ArgumentComparer:
    """Value comparison under a parameter spec; each method returns "" when equal, else the
    difference (the reason a reward is 0). A proven difference wins over an unproven one, so
    that only actions whose every difference is unproven can reach a judge."""

    def __init__(self, int_float_equal: bool, numeric_strings: bool):
        self.int_float_equal, self.numeric_strings = int_float_equal, numeric_strings

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
        if exp == cand:
            return ""
        differ = f"{name}: {cand!r} != {exp!r}"
        enum = spec.enum if spec is not None else None
        if enum is not None:
            # The schema's own list: a value it does not name, or a fold that names two, is
            # another choice (proven), not a paraphrase.
            folded = [e for e in enum if e.casefold() == cand.casefold()]
            return "" if exp in enum and folded == [exp] else differ
        if "@" in exp and _emails_equal(exp, cand):
            return ""
        cls = spec.string_class if spec is not None else None
        if cls is None:
            cls = string_class(name.rsplit(".", 1)[-1].split("[", 1)[0], exp)
        if cls == "exact":
            # Another identifier or another program: a proven difference, never for a judge.
            return f"{differ} (compared exactly)"
        multiline = _LINE_BREAK.search(exp) or _LINE_BREAK.search(cand)
        if (nfc(exp) == nfc(cand)) if multiline else (text_key(exp) == text_key(cand)):
            return ""
        return f"{differ} {UNPROVEN}"

    def array(self, spec: ParamSpec | None, name: str, exp: list, cand: list) -> str:
        if len(exp) != len(cand):
            return f"{name}: {len(cand)} items != {len(exp)}"
        items = spec.items if spec is not None else None
        if spec is not None and spec.unordered:
            return self._as_set(items, name, exp, cand)
        unproven = ""
        for i, (e, c) in enumerate(zip(exp, cand)):
            diff = self.value(items, f"{name}[{i}]", e, c)
            if diff and not is_unproven(diff):
                return diff
            unproven = unproven or diff
        return unproven

    def _as_set(self, items: ParamSpec | None, name: str, exp: list, cand: list) -> str:
        """Match items one to one (greedy: it can miss a matching, never invent one); "" when
        all match equal, UNPROVEN when they match only allowing unproven differences."""
        for allow_unproven in (False, True):
            left, missing = list(range(len(cand))), None
            for i, e in enumerate(exp):
                j = next((j for j in left if (d := self.value(items, f"{name}[{i}]", e, cand[j]))
                          == "" or (allow_unproven and is_unproven(d))), None)
                if j is None:
                    missing = e
                    break
                left.remove(j)
            if missing is None:
                return "" if not allow_unproven else f"{name}: items differ {UNPROVEN}"
        return f"{name}: {missing!r} not among the candidate's items"

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
        unproven = ""
        for key in [*exp, *(k for k in cand if k not in exp)]:  # a stable order for reasons
            spec = props.get(key) if props is not None else None
            e, c = exp.get(key, MISSING), cand.get(key, MISSING)
            if e is MISSING or c is MISSING:
                default = spec.default if spec is not None else MISSING
                if default is MISSING:
                    return f"{prefix}{key}: given on one side only and the schema states no default"
                e = default if e is MISSING else e
                c = default if c is MISSING else c
            diff = self.value(spec, prefix + key, e, c)
            if diff and not is_unproven(diff):
                return diff
            unproven = unproven or diff
        return unproven
