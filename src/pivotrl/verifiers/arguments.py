"""Argument values compared under a parameter spec: the rules of `toolcall`, each with why it is safe.

The principle: **a value pays only when a rule proves it means the same.** Strings are data:
by default a string pays only when it is the same string, code point for code point. The rules
below are granted by the JSON schema itself (never by a parameter's name or by prose in a
description) or switched on by the user for an environment that really normalises (`normalize`).
Anything no rule proves is a difference: 0, or, where the user configured it (`toolcall`'s
`unproven_rule: judge`), a question for the judge. Such differences carry `UNPROVEN` in their
reason; every other difference is proven (another number, another type, another enum value, an
identifier, a missing required key).

Always on, each granted by the schema or by JSON itself:
- Numbers exactly, and an int and a float are two values (5 and 5.0), whatever the schema
  says: a record that stores what it is given stores 5.0 (and prints "5.0") where the expert's
  stored 5, so a state compared by its text differs; Python's `range(5.0)` raises; BFCL's
  checker rejects a float for an integer. JSON Schema counts both as one `number`, so a user
  whose backend converts says so: `int_float_equal` makes them one value for `integer` and
  `number` parameters, `normalize: [bfcl]` for `number` ones (BFCL converts an int for a float
  parameter). Never by closeness: 12345678901234567 vs 1.2345678901234568e16 is another id,
  0.3 vs 0.30000000000000004 another value. Booleans are not numbers. NaN and Infinity are
  no JSON numbers (RFC 8259) and never pay; -0.0 and 0.0 are two floats (a record prints them
  apart), the integer -0 is 0.
- A numeric string for an `integer`/`number` parameter ("2" for 2) only with `numeric_strings`
  (the user declares a backend that parses the canonical literal to that number): "02", " 2",
  "2e0" or "two" are differences even then.
- `null` is a value, not an omission: in an update call null means "remove". Omitted equals null
  only where the schema's `default` is null.
- An `enum` value in another case, only when every allowed value is ASCII and the candidate's
  ASCII case fold names exactly one allowed value, the expert's: the schema lists every value the
  tool takes, so the candidate can mean no other. Unicode case folding is never used: it maps
  look-alikes onto allowed values ("ſ" long s to "s", "ß" to "ss", the Kelvin sign to "k") that
  a backend then rejects or reads as something else. Without an enum, case is data ("DEBUG" and
  "debug" as a log level, "mg" and "Mg", "-f" and "-F").
- An e-mail address in a field whose schema says `format: email`: the domain part up to ASCII
  case (DNS names are case-insensitive, RFC 4343), the local part exactly (RFC 5321 lets the
  receiving host treat it as case-sensitive). Never by the look of a value: "Logs@Host.txt" may
  be a file name.
- Arrays in order; as sets only with `uniqueItems: true` (the schema says the items are a set).
- Objects recursively with their own schema: a key the schema does not name (unless its
  `additionalProperties` allows more), a missing required key, or a key given on one side only
  are differences, except that an omitted key equals the schema's own `default` for it (the
  schema says the tool takes that value when the key is absent).

Opt-in (`normalize`, for an environment that normalises strings itself). Each is safe exactly
where the environment applies the same fold before it stores, compares or executes the value:
the two calls then reach it as one value. Each is wrong where it takes the text as given: a
padded name, a tab-delimited field, two spaces inside an SQL literal, a table named `Users`
beside one named `users` are other data there. So `whitespace`, `case` and `unicode` fold only
strings declared free text: by the schema (`contentMediaType: text/plain`) or by the user
(`toolcall`'s `free_text`: parameter paths such as `subject` or `message.body`, array items as
`items.note`) — never a string the schema makes an identifier (enum, format, id-like name or
description). A parameter's name alone never grants a fold: "table", "query" or "level" may
hold identifiers, code or case-sensitive values.
- `whitespace`: in a one-line free-text string, runs of Unicode whitespace compare as one space
  and the ends are trimmed (never in a string of whitespace only: a tab delimiter is not a
  space).
- `case`: in the same strings, ASCII letters compare without case (only A-Z/a-z: wider folds
  merge look-alikes, see above).
- `unicode`: in the same strings, Unicode NFC (canonical equivalence: "é" as one or two code
  points). NFKC is never used: it merges different characters ("ﬁ" and "fi", "²" and "2").
- `bfcl`: the string rule of BFCL's checker (`bfcl_eval`'s `ast_checker.standardize_string`,
  applied there to every string, identifiers included): drop " ,./-_*^", lower-case, read "'"
  as '"'; an int and a float as one value for a `number` parameter (BFCL converts an int for a
  float parameter and compares by value); a dotted tool name called with underscores
  ("math.factorial" as "math_factorial"), which BFCL's harness does for APIs that forbid dots.
  Safe only where BFCL's checker is the environment: it pays "SAN FRANCISCO" for "San
  Francisco" and "-f" for "F". The one exception to "free text only", as BFCL's own rule is.
Which environments normalise: BFCL's AST checker (all strings, as above). A backend that stores
or executes arguments (a database record, a file name, a shell, an e-mail's subject) does not,
and the default is for those.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable, Iterable
from typing import Any

from pivotrl.verifiers.schema import (DEC_LITERAL, INT_LITERAL, MISSING, ParamSpec, is_number,
                                      string_class)

_SCALARS = (str, int, float, bool)
_EMAIL = re.compile(r"[^@\s]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
UNPROVEN = "(not proven equal)"
NORMALIZE = ("whitespace", "case", "unicode", "bfcl")
_WHITESPACE = re.compile(
    "[\t\n\v\f\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+")
_LINE_BREAK = re.compile(r"[\n\r\v\f\x1c-\x1e\x85\u2028\u2029]")
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_BFCL_DROP = re.compile(r"[ ,./\-_*^]")
_INDEX = re.compile(r"\[\d+\]")  # items[0].note -> items.note: one declaration for every item


def nfc(s: str) -> str:
    return s if s.isascii() else unicodedata.normalize("NFC", s)


def bfcl_key(s: str) -> str:
    """BFCL's `standardize_string`, character for character (bfcl_eval ast_checker)."""
    return _BFCL_DROP.sub("", s).lower().replace("'", '"')


def text_rule(normalize: Iterable[str], one_line: bool) -> Callable[[str], str] | None:
    """The key under which two free-text strings compare with the user's `normalize` options
    (None: no text rule, strings compare as they are). Whitespace is folded only in one-line
    strings: in file contents, code, YAML or Markdown line breaks and indentation are syntax."""
    on = set(normalize) & {"whitespace", "case", "unicode"}
    if not one_line:
        on.discard("whitespace")
    if not on:
        return None

    def key(s: str) -> str:
        if "unicode" in on:
            s = nfc(s)
        if "whitespace" in on:
            s = _WHITESPACE.sub(" ", s).strip(" ")
        if "case" in on:
            s = s.translate(_ASCII_LOWER)
        return s
    return key


def _as_int(v: int | float) -> int | None:
    if type(v) is int:
        return v
    if v.is_integer() and abs(v) <= 2 ** 53:  # beyond 2**53 a float no longer names one integer
        return int(v)
    return None


def _finite(v: int | float) -> bool:
    return type(v) is int or math.isfinite(v)


def numbers_equal(exp: int | float, cand: int | float) -> bool:
    if type(exp) is float and type(cand) is float:
        return exp == cand  # one double, one value (1e20 too: no int needed to compare them)
    e, c = _as_int(exp), _as_int(cand)
    return e is not None and e == c


def _numeric_literal(s: str, kind: str) -> int | float | None:
    try:  # int() refuses more than 4300 digits: no number is proven then
        if kind == "integer" and INT_LITERAL.fullmatch(s):
            return int(s)
        if kind == "number" and DEC_LITERAL.fullmatch(s):
            return int(s) if INT_LITERAL.fullmatch(s) else float(s)
    except ValueError:
        return None
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

    def __init__(self, int_float_equal: bool = False, numeric_strings: bool = False,
                 normalize: Iterable[str] = (), free_text: Iterable[str] = ()):
        self.int_float_equal, self.numeric_strings = int_float_equal, numeric_strings
        self.free_text = frozenset(free_text)
        normalize = tuple(normalize)
        unknown = set(normalize) - set(NORMALIZE)
        if unknown:
            raise ValueError(f"unknown normalize option(s) {sorted(unknown)}; known: "
                             f"{', '.join(NORMALIZE)}")
        self.bfcl = "bfcl" in normalize
        self._line_key = text_rule(normalize, one_line=True)
        self._block_key = text_rule(normalize, one_line=False)

    def value(self, spec: ParamSpec | None, name: str, exp: Any, cand: Any) -> str:
        te = type(exp)
        if te is type(cand) and te in _SCALARS and te is not float and exp == cand:
            return ""  # the common case, before any rule (floats below: NaN, inf and -0.0)
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
            if not (_finite(exp) and _finite(cand)):
                # JSON has no NaN or Infinity (RFC 8259): other parsers reject the text, and a
                # literal such as 1e400 only becomes inf where it overflows a double.
                return f"{name}: {cand!r} vs {exp!r} (not a finite JSON number)"
            if type(exp) is float and type(cand) is float and (
                    math.copysign(1.0, exp) != math.copysign(1.0, cand)):
                # -0.0 and 0.0: a record that stores what it is given prints "-0.0" (as 5.0 vs 5)
                return f"{name}: {cand!r} is not {exp!r} (the sign of zero)"
            if type(exp) is not type(cand) and not (
                    kind == "number" and self.bfcl
                    or kind in ("integer", "number") and self.int_float_equal):
                return f"{name}: {cand!r} is not {exp!r} (an int and a float)"
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
                               spec.required if spec is not None else frozenset(), name, exp, cand,
                               spec is not None and spec.open)
        return "" if exp == cand else f"{name}: {cand!r} != {exp!r}"

    def string(self, spec: ParamSpec | None, name: str, exp: str, cand: str) -> str:
        if exp == cand:
            return ""
        differ = f"{name}: {cand!r} != {exp!r}"
        if self.bfcl and bfcl_key(exp) == bfcl_key(cand):
            return ""
        enum = spec.enum if spec is not None else None
        if enum is not None:
            # The schema's own list: a value it does not name, or a fold that names two, is
            # another choice (proven), not a paraphrase.
            folds = spec.enum_fold
            same = (folds is not None and cand.isascii() and exp in enum
                    and folds.get(cand.lower()) == exp)
            return "" if same else differ
        if spec is not None and spec.format == "email" and _emails_equal(exp, cand):
            return ""
        cls = spec.string_class if spec is not None else None
        declared = cls is None and (spec is not None and spec.free_text
                                    or _INDEX.sub("", name) in self.free_text)
        if cls is None and not declared:
            cls = string_class(name.rsplit(".", 1)[-1].split("[", 1)[0], exp)
        if cls == "exact":
            # Another identifier or another program: a proven difference, never for a judge.
            return f"{differ} (compared exactly)"
        if declared and self._line_key is not None and exp.strip() and cand.strip():
            # (a string of whitespace only is all data: a tab delimiter is not a space)
            multiline = _LINE_BREAK.search(exp) or _LINE_BREAK.search(cand)
            key = self._block_key if multiline else self._line_key
            if key is not None and key(exp) == key(cand):
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
               exp: dict, cand: dict, open: bool = False) -> str:
        prefix = f"{where}." if where else ""
        if props is not None and not open:
            for key in cand:
                if key not in props:  # not an argument the tool takes, whoever wrote it
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
