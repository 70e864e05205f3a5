"""The train/eval split of a data set, written once by `pivotrl extract --eval-fraction F` and read
by every later stage, so that no stage trains on a held-out trajectory and evaluation scores only
held-out ones.

The split file (`TURNS.split.json`, next to the turns file) records the ids of the trajectories on
each side, with the fraction and seed that drew them. Readers apply one rule: training stages
(`train`, `sft`, the E2E baseline) drop every record of an eval trajectory and count it;
`evaluate --turns` keeps only turns of eval trajectories and counts the others. Dropping (not
refusing) is the choice because the SFT and E2E baselines read the raw trajectory file, which holds
both sides by construction.

A stage that reads a turns or pivots file finds the split on its own when it sits beside that file:
`X.split.json` for `X.jsonl`, else the one `*.split.json` in the same folder.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, Field

from pivotrl.io.records import sidecar_path, write_text_atomic

SPLIT_ENDING = ".split.json"


class Split(BaseModel):
    """Which trajectories are held out for evaluation."""

    fraction: float = Field(..., description="Share of trajectories held out (extract --eval-fraction).")
    seed: int = Field(..., description="Seed of the split (extract --seed).")
    source: str = Field("", description="The trajectory file the split was drawn from.")
    train: list[str] = Field(default_factory=list, description="Ids of the training trajectories.")
    eval: list[str] = Field(default_factory=list, description="Ids of the held-out trajectories.")

    def eval_ids(self) -> frozenset[str]:
        return frozenset(self.eval)


def split_path(out: str | Path) -> Path:
    """`turns.jsonl` → `turns.split.json`."""
    return sidecar_path(out, SPLIT_ENDING)


def write_split(out: str | Path, split: Split) -> Path:
    path = split_path(out)
    write_text_atomic(path, json.dumps(split.model_dump(), indent=1))
    return path


def read_split(path: str | Path) -> Split:
    """The split in `path`; a missing or malformed file is a ValueError naming it."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"split file {path}: no such file (`pivotrl extract --eval-fraction F --out "
                         f"TURNS` writes TURNS{SPLIT_ENDING})")
    try:
        return Split.model_validate_json(path.read_text())
    except ValueError as exc:
        raise ValueError(f"split file {path}: not a split ({str(exc).splitlines()[0]})") from None


def find_split(data: str | Path | Iterable[str | Path]) -> Path | None:
    """The split file beside a data file: `X.split.json` for `X.jsonl`, else the only
    `*.split.json` in its folder. Several candidates are an error (give `split:` explicitly)."""
    paths = [Path(data)] if isinstance(data, (str, Path)) else [Path(p) for p in data]
    found: set[Path] = set()
    for path in paths:
        own = split_path(path)
        if own.is_file():
            found.add(own)
            continue
        beside = sorted(path.parent.glob("*" + SPLIT_ENDING)) if path.parent.is_dir() else []
        if len(beside) > 1:
            raise ValueError(f"{path}: several split files beside it ({', '.join(p.name for p in beside)}); "
                             "name one with --split")
        found.update(beside)
    if len(found) > 1:
        raise ValueError(f"several split files for {', '.join(map(str, paths))}: "
                         f"{', '.join(map(str, sorted(found)))}; name one with --split")
    return next(iter(found), None)


def split_file(explicit: str | Path | None, data: str | Path | Iterable[str | Path] | None) -> Path | None:
    """The split file a stage applies: the given one, else the one found beside `data`, else None."""
    if explicit is not None:
        return Path(explicit)
    return find_split(data) if data is not None else None


def resolve_split(explicit: str | Path | None, data: str | Path | Iterable[str | Path] | None) -> Split | None:
    """The split a stage applies (`split_file`), read."""
    path = split_file(explicit, data)
    return read_split(path) if path is not None else None


def no_split_warning(verb: str, data: object) -> str:
    """What a stage that reads raw trajectories says when it has no split: it trains on all of them."""
    return (f"{verb}: no split (--split): every trajectory of {data} is trained on, including any that "
            f"`pivotrl extract --eval-fraction` held out for evaluation; pass --split TURNS{SPLIT_ENDING}")


class HeldOut:
    """Counts what a training stage drops because it belongs to an eval trajectory."""

    def __init__(self, split: Split | None):
        self.split = split
        self._eval = split.eval_ids() if split else frozenset()
        self.dropped = 0

    def keep(self, trajectory_id: str | None) -> bool:
        """False (and counted) for a record of a held-out trajectory."""
        if trajectory_id is not None and trajectory_id in self._eval:
            self.dropped += 1
            return False
        return True

    def summary(self) -> str:
        if self.split is None:
            return "none (no split given or found: every record is trained on)"
        return (f"{len(self.split.eval)} eval trajectories held out; {self.dropped} records of them dropped")
