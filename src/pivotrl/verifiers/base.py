"""The verifier protocol: score(turn, action) -> Score (the registry is `pivotrl.verifiers`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from pivotrl.io.records import Message, Turn


@dataclass(frozen=True)
class Score:
    reward: float  # in [0, 1]
    valid: bool  # False when the action could not be parsed/used at all (counted separately)
    reason: str = ""


class Verifier(Protocol):
    name: str

    def score(self, turn: Turn, action: Message | None) -> Score:
        """`action` is the parsed candidate assistant message, or None when parsing failed."""

    def score_batch(self, turns: Sequence[Turn], actions: Sequence[Message | None]) -> list[Score]:
        ...


def score_in_threads(verifier: Verifier, turns: Sequence[Turn],
                     actions: Sequence[Message | None], workers: int) -> list[Score]:
    """`score_batch` for verifiers that wait on subprocesses or HTTP: threads overlap the waits."""
    if len(turns) != len(actions):
        raise ValueError(f"{len(turns)} turns but {len(actions)} actions")
    if workers <= 1 or len(turns) <= 1:
        return [verifier.score(t, a) for t, a in zip(turns, actions)]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(verifier.score, turns, actions))
