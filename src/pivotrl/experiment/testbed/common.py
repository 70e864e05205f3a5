"""Helpers every testbed module shares (tasks, worlds, experts, OOD): stable seeds, the split rule
and the observation encoding. Kept apart so that the world modules import no registry."""

from __future__ import annotations

import hashlib
import json
from typing import Any

# One task in five is held out for evaluation, decided by a hash of its id (never by row).
EVAL_PERCENT = 20


def stable_int(*parts: Any) -> int:
    """A seed from any values, identical across processes (Python's hash() is salted)."""
    text = "|".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def compact(obj: Any) -> str:
    """Observations are compact JSON: fewer tokens for the tiny model."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
