"""Helpers every testbed module shares (tasks, worlds, experts, OOD): stable seeds, the split rule
and the observation encoding. Kept apart so that the world modules import no registry."""

from __future__ import annotations

import hashlib
import json
import re
import string
from typing import Any

# One task in five is held out for evaluation, decided by a hash of its id (never by row).
EVAL_PERCENT = 20
# The built-in agentic worlds, each its own module of this package (tasks.WORLD_MODULES).
WORLDS = ("toolshop", "terminal")


def stable_int(*parts: Any) -> int:
    """A seed from any values, identical across processes (Python's hash() is salted)."""
    text = "|".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def compact(obj: Any) -> str:
    """Observations are compact JSON: fewer tokens for the tiny model."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _pattern(template: str) -> re.Pattern:
    """A final-answer template ("Your city is now {city}.") as a regex: each slot one run of
    non-space characters (every slot of the testbed is a word, a number, an id or a file name)
    but `{rest}`, the rest of the text (an answer that continues with another answer), the words
    around them literal."""
    parts = []
    for literal, field, _spec, _conv in string.Formatter().parse(template):
        parts.append(re.escape(literal))
        if field is not None:
            parts.append(f"(?P<{field}>.+)" if field == "rest" else f"(?P<{field}>\\S+?)")
    return re.compile("".join(parts))


def match_answer(text: str, families: dict[str, list[str]]) -> tuple[str, int, dict[str, str]] | None:
    """(family, template index, slots) of the first template `text` is an instance of
    (whitespace runs count as one space), or None. Slots are returned exactly as written."""
    if not isinstance(text, str):
        return None
    text = " ".join(text.split())
    for family, templates in families.items():
        for index, template in enumerate(templates):
            m = _PATTERNS.setdefault(template, _pattern(template)).fullmatch(text)
            if m:
                return family, index, m.groupdict()
    return None


def read_answer(text: str, families: dict[str, list[str]]) -> tuple[str, dict[str, str]] | None:
    """(family, slots) of the first template `text` is an instance of, or None
    (`match_answer`): a world decides which slots it folds."""
    got = match_answer(text, families)
    return None if got is None else (got[0], got[2])


_PATTERNS: dict[str, re.Pattern] = {}


def sentence_end(text: str) -> str:
    """A final answer with its last sentence ended by one ".": "Done!" and "Done" read as
    "Done." (the templates end in a full stop; an exclamation or a dropped stop says no other
    thing). A "?" is kept: a question is not an answer."""
    return text.rstrip().rstrip(".!") + "." if isinstance(text, str) else text
