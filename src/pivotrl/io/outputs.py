"""Output paths: no verb writes onto one of its inputs, and one writer at a time per output.

`check_outputs` is the one rule (`pivotrl.cli.guard` applies it to every verb before the verb
opens anything), and `output_lock` keeps two runs from appending to the same file.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from pivotrl.io.records import rejects_path, sidecar_path, stats_path


class OutputPathError(ValueError):
    """An output path that is an input, or another output, of the same command."""


class OutputLockedError(ValueError):
    """Another live process is writing the same output."""


def _identities(p: Path) -> set[tuple[object, ...]]:
    ids: set[tuple[object, ...]] = {("path", str(p.resolve()))}  # symlinks followed
    try:
        st = p.stat()
        ids.add(("inode", st.st_dev, st.st_ino))  # hard links
    except OSError:
        pass
    return ids


def check_outputs(inputs: Iterable[str | Path | None],
                  outputs: Iterable[str | Path | None]) -> None:
    """Raise OutputPathError when an output would overwrite an input or another output: the
    same resolved path (symlinks followed) or, for files that exist, the same inode (hard
    links). None entries are ignored."""
    seen: dict[tuple[object, ...], tuple[str, Path]] = {}
    for kind, paths in (("input", inputs), ("output", outputs)):
        for raw in paths:
            if raw is None:
                continue
            p = Path(raw)
            ids = _identities(p)
            for key in ids:
                if kind == "output" and key in seen:
                    other_kind, other = seen[key]
                    raise OutputPathError(f"output {p} is the same file as {other_kind} {other}: "
                                          "refusing to overwrite it; choose another path")
            for key in ids:
                seen.setdefault(key, (kind, p))


def sidecars(out: str | Path) -> list[Path]:
    """Files verbs write next to OUT: its rejects, stats and histogram."""
    return [rejects_path(out), stats_path(out), sidecar_path(out, ".hist.png")]


@contextmanager
def output_lock(path: str | Path) -> Iterator[Path]:
    """Hold an exclusive lock on `path` for the block, on the sidecar file `<path>.lock`, with
    `filelock` (flock where the file system has it, so the kernel drops the lock when its holder
    dies and a lock file left by a killed run never blocks a resume; filelock's soft lock where
    it has not, e.g. some network file systems). A second writer fails at once
    (OutputLockedError)."""
    from filelock import FileLock, Timeout

    lock = Path(path).with_name(Path(path).name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    held = FileLock(lock, timeout=0)
    try:
        held.acquire()
    except Timeout:
        raise OutputLockedError(f"{path} is being written by another run (lock {lock} is "
                                "held); wait for it to finish or choose another --out") from None
    try:
        yield lock
    finally:
        held.release()
