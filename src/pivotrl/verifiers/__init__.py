"""Verifiers: is a sampled action functionally what the expert did? (one module per verifier).

This package is the registry: built-ins are registered here by name, and any package can add its
own with `register`. The verifier modules themselves never import the registry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pivotrl.verifiers.base import Score, Verifier
from pivotrl.verifiers.exact import ExactVerifier
from pivotrl.verifiers.judge import JudgeVerifier
from pivotrl.verifiers.shell import ShellVerifier
from pivotrl.verifiers.state import StateVerifier
from pivotrl.verifiers.toolcall import ToolcallVerifier

__all__ = ["Score", "Verifier", "available", "get_verifier", "register"]

VerifierFactory = Callable[..., Verifier]
_REGISTRY: dict[str, VerifierFactory] = {
    "exact": ExactVerifier, "toolcall": ToolcallVerifier, "state": StateVerifier,
    "shell": ShellVerifier, "judge": JudgeVerifier,
}


def register(name: str) -> Callable[[VerifierFactory], VerifierFactory]:
    """Class decorator: make a verifier buildable by name (`get_verifier`, `--verifier NAME`)."""
    def deco(factory: VerifierFactory) -> VerifierFactory:
        _REGISTRY[name] = factory
        return factory
    return deco


class UnknownVerifierError(KeyError, ValueError):
    """A verifier name nobody registered: a user's mistake (ValueError), one line at the CLI."""

    def __str__(self) -> str:  # KeyError would print the message quoted
        return str(self.args[0])


def get_verifier(name: str, **config: Any) -> Verifier:
    """Build a registered verifier; `config` are its documented options (YAML keys)."""
    if name not in _REGISTRY:
        raise UnknownVerifierError(f"unknown verifier {name!r}; known: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name](**config)


def available() -> list[str]:
    return sorted(_REGISTRY)
