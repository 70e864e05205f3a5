"""Stable seeds: the one rule that turns names (a run's seed, a turn id, a step) into a 63-bit seed,
identical across processes, machines and Python versions (not Python's salted hash())."""

from __future__ import annotations

import hashlib
from typing import Any


def derive_seed(*parts: Any) -> int:
    """A stable 63-bit seed from any parts (not Python's salted hash(): stable across runs)."""
    digest = hashlib.blake2b("\x1f".join(str(p) for p in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & ((1 << 63) - 1)
