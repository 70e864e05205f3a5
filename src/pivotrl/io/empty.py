"""Nothing empty passes silently: the one rule every data verb (extract, profile, select, export,
verify) applies to its input and its result.

A verb that reads records and writes none (every line rejected, a Parquet file or a directory
given where JSON Lines are expected, a trajectory file given where turns are expected, a filter
that keeps nothing) raises `EmptyResultError`, naming the file, the reason and, where an empty
result can make sense (a filter that legitimately keeps nothing), the flag that allows it. The
CLI prints the message and exits 1; no traceback.
"""

from __future__ import annotations

import json
from pathlib import Path

ALLOW_EMPTY = "--allow-empty"
# Leading bytes of files that are not JSON Lines though users hand them over as data.
_MAGIC = {b"PAR1": "a Parquet file", b"\x1f\x8b": "a gzip file", b"PK\x03\x04": "a zip file"}


class EmptyResultError(ValueError):
    """A data verb would produce nothing (or cannot read its input at all)."""

    def __init__(self, path: str | Path, message: str, flag: str | None = None,
                 result: object = None):
        hint = f"; pass {flag} to accept an empty result" if flag else ""
        super().__init__(f"{path}: {message}{hint}")
        # `result`: the verb's summary (its outputs were written), for the caller to show
        self.path, self.flag, self.result = Path(path), flag, result


class TooManyRejectsError(EmptyResultError):
    """More input lines were rejected than the verb's `--max-rejects` allows (its outputs and the
    rejects file were written); the CLI treats it as an empty result: message, exit 1."""


def input_problem(path: str | Path) -> str | None:
    """Why `path` cannot be a JSON Lines input (a directory, Parquet, gzip, zip), else None."""
    path = Path(path)
    if path.is_dir():
        return "is a directory: a folder, not a JSONL file; give the .jsonl file inside it"
    try:
        with path.open("rb") as fh:
            head = fh.read(4)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    for magic, kind in _MAGIC.items():
        if head.startswith(magic):
            return (f"is {kind}, not JSON Lines (one JSON object per line); convert it first, "
                    "e.g. pandas.read_parquet(...).to_json(out, orient='records', lines=True)")
    return None


def check_input(path: str | Path) -> None:
    """Raise EmptyResultError when `path` is not something a JSONL reader can read."""
    if (problem := input_problem(path)) is not None:
        raise EmptyResultError(path, problem)


def file_kind(path: str | Path) -> str | None:
    """'trajectories', 'turns' or 'profiles' when the first non-blank line looks like one (by
    its keys); None when it looks like neither or is not a JSON object. Reads one line."""
    try:
        with Path(path).open("rb") as fh:
            for raw in fh:
                if raw.strip():
                    obj = json.loads(raw)
                    break
            else:
                return None
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    if "samples" in obj:
        return "profiles"
    if "context" in obj or "context_from" in obj or "expected" in obj:
        return "turns"
    if "messages" in obj:
        return "trajectories"
    return None


# (what the file holds, what the verb expects) -> what to do about it
_WRONG_KIND = {
    ("trajectories", "turns"): "run `pivotrl extract` on it first",
    ("trajectories", "profiles"): "run `pivotrl extract`, then `pivotrl profile` first",
    ("turns", "profiles"): "run `pivotrl profile` on it first",
    ("turns", "trajectories"): "give the trajectory file it was extracted from",
    ("profiles", "trajectories"): "give the trajectory file it was extracted from",
}


def require_some(count: int, what: str, path: str | Path, *, rejected: int = 0,
                 first_reject: object = None, expects: str | None = None,
                 reason: str = "", allow_empty: bool = False, flag: str | None = None,
                 result: object = None) -> None:
    """Raise EmptyResultError when `count` (of `what`, e.g. "turns") is 0, unless allow_empty.

    The reason is read off the input: a file of the wrong kind (`expects` "turns" but it holds
    trajectories: "run pivotrl extract first"), else the caller's `reason`, else every line
    rejected (with the first reject), or an empty file. `flag` is named only where an empty
    result can make sense (a filter keeping nothing), never for unreadable input."""
    if count > 0 or allow_empty:
        return
    kind = file_kind(path) if expects else None
    if (kind, expects) in _WRONG_KIND:
        raise EmptyResultError(path, f"0 {what}: this is a file of {kind}, not {expects}; "
                               f"{_WRONG_KIND[kind, expects]}", result=result)
    if not reason:
        if rejected:
            reason = f"all {rejected} lines were rejected (see the rejects file)"
            if first_reject is not None:
                reason += f"; first: {first_reject}"
        else:
            reason = "the file holds no records"
    raise EmptyResultError(path, f"0 {what}: {reason}", flag if not rejected else None, result)
