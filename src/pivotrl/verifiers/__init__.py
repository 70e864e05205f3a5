"""Verifiers: is a sampled action functionally what the expert did? (one module per verifier)."""

from pivotrl.verifiers.base import Score, Verifier, available, get_verifier, register

# Importing each module registers its verifier.
from pivotrl.verifiers import exact, toolcall, state, shell, judge  # noqa: E402,F401

__all__ = ["Score", "Verifier", "available", "get_verifier", "register"]
