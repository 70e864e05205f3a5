"""Output paths: no verb writes onto one of its inputs, no run writes over another's results, and
one writer at a time per output.

`check_outputs` is the one rule for inputs (`pivotrl.cli.guard` applies it to every verb before
the verb opens anything); `claim_output` the one for earlier results (`train`, `sft`, `e2e` and
`profile`: a non-empty output only with `--resume` or `--overwrite`); `output_lock` keeps two runs
from appending to the same file.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from pivotrl.io.records import rejects_path, sidecar_path, stats_path


class OutputPathError(ValueError):
    """An output path that is an input, or another output, of the same command."""


class OutputLockedError(ValueError):
    """Another live process is writing the same output."""


class OutputExistsError(ValueError):
    """An output that holds an earlier run's results, given without --resume or --overwrite."""


# What a folder that a run wrote holds (any one of them): `--overwrite` deletes only such folders.
RUN_MARKERS = ("metrics.jsonl", "train.log", "config.json", "trainer_state.json", "adapter", "summary.json")
# What a run writes before its first result (its prompt rows, a dataset cache): a folder holding
# only these is a start that failed, and a new run rewrites them.
# The plan and the config as used, written before a run's first step (pivotrl.run_plan): in a run
# folder, or beside a file output.
PLAN_FILE, CONFIG_FILE, PLAN_ENDING = "run_plan.json", "run_config.yaml", ".plan.json"
RUN_CACHES = ("prompts.rank*.jsonl", ".prompt_cache", PLAN_FILE, CONFIG_FILE)


def claim_output(path: str | Path, *, resume: bool, overwrite: bool, companions: Iterable[Path] = ()) -> None:
    """Make `path` (a run folder, or an output file with its `companions`: stats, log, rejects)
    ready for a run. Empty or missing: nothing to do. Holding results: `resume` keeps them for the
    run to continue, `overwrite` deletes them first (on the main process only, under `accelerate
    launch`), and neither is OutputExistsError saying what is there: two runs never mix their
    checkpoints and metrics in one folder, and a rerun never cuts a log it did not write."""
    path = Path(path)
    held = _holding(path)
    if held is None:
        return
    if resume and overwrite:
        raise ValueError("--resume and --overwrite exclude each other: continue the run, or replace it")
    if resume:
        return
    if not overwrite:
        raise OutputExistsError(f"{path} already holds {held}: pass --resume to continue that run, "
                                "--overwrite to replace it, or choose another output")
    if path.is_dir() and not any((path / m).exists() for m in RUN_MARKERS) and not any(path.glob("checkpoint-*")):
        raise OutputExistsError(f"{path} holds {held} but no run's results (no {', '.join(RUN_MARKERS[:2])} or "
                                "checkpoint-*): --overwrite deletes only run folders; choose another output")
    if os.environ.get("RANK", "0") != "0":
        return
    if path.is_dir():
        shutil.rmtree(path)
    else:
        for p in (path, *companions):
            p.unlink(missing_ok=True)


def _holding(path: Path) -> str | None:
    """What a non-empty output holds, in words; None when it is missing or empty."""
    if path.is_dir():
        entries = sorted(p.name for p in path.iterdir() if not any(p.match(c) for c in RUN_CACHES))
        if not entries:
            return None
        checkpoints = [e for e in entries if e.startswith("checkpoint-")]
        shown = (checkpoints[-3:] + [e for e in entries if e in RUN_MARKERS[:2]]) or entries[:3]
        more = ", …" if len(entries) > len(shown) else ""
        return f"{len(entries)} entries ({', '.join(shown)}{more})"
    if path.is_file() and path.stat().st_size > 0:
        with path.open("rb") as fh:
            lines = sum(1 for _ in fh)
        return f"{lines} lines"
    return None


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
    """Files verbs write next to OUT: its rejects, stats, histogram and plan."""
    return [rejects_path(out), stats_path(out), sidecar_path(out, ".hist.png"), sidecar_path(out, PLAN_ENDING)]


@contextmanager
def output_lock(path: str | Path) -> Iterator[Path]:
    """Hold an exclusive lock on `path` for the block, on the sidecar file `<path>.lock`, with
    `filelock` (flock where the file system has it, so the kernel drops the lock when its holder
    dies and a lock file left by a killed run never blocks a resume; filelock's soft lock where
    it has not, e.g. some network file systems). A second writer fails at once
    (OutputLockedError). The lock file is removed when the block ends."""
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
        # Removed while still held, so a finished run leaves no `.lock` beside its output (a killed
        # run's stays, and blocks nothing: flock dies with its holder).
        lock.unlink(missing_ok=True)
        held.release()
