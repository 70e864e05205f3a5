"""Output paths: no verb writes onto, or into, one of its inputs; no run writes over another's
results; one writer at a time per output.

`check_outputs` is the one rule for inputs (`pivotrl.cli.guard` applies it to the file verbs
before they open anything, `io.run_folder` to the training verbs' run folders): an output may not
be an input, hold one (a folder), or lie inside an input folder (a model folder stays as it was
given). `claim_output` is the one rule for an output file's earlier results (`profile`, `select`,
`evaluate`: a used output only with `--resume` or `--overwrite`; run folders: `io.run_folder`);
`output_lock` keeps two runs from appending to the same file.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from pivotrl.io.inputs import InputError
from pivotrl.io.records import rejects_path, sidecar_path, stats_path


class OutputPathError(InputError):
    """An output path that is an input, holds one or lies inside one, or is another output of the
    same command."""


class OutputLockedError(ValueError):
    """Another live process is writing the same output."""


class OutputExistsError(ValueError):
    """An output that holds an earlier run's results, given without --resume or --overwrite."""


# The plan and the config as used, written before a run's first step (pivotrl.io.run_plan): in a run
# folder, or beside a file output.
PLAN_FILE, CONFIG_FILE, PLAN_ENDING = "run_plan.json", "run_config.yaml", ".plan.json"


def claim_output(path: str | Path, *, resume: bool, overwrite: bool, companions: Iterable[Path] = (),
                 resumable: bool = True) -> None:
    """Make the output file `path` and its `companions` (stats, log, rejects: files the verb
    writes beside it) ready for a run. A used output (not empty) is kept for `resume` (the run
    continues it), deleted with its companions for `overwrite`, and otherwise OutputExistsError
    saying what it holds: a rerun never replaces results silently. `overwrite` also deletes the
    companions of an empty or missing output: a crashed run's stale stats must not block the
    restart. Only the main process deletes (under `accelerate launch`). `resumable=False`: the
    verb has no --resume (the message offers only --overwrite)."""
    path = Path(path)
    if resume and overwrite:
        raise ValueError("--resume and --overwrite exclude each other: continue the run, or replace it")
    if path.is_dir():
        raise OutputExistsError(f"{path} is a folder: give the path of a file to write")
    held = holding(path)
    if held is not None and not (resume or overwrite):
        again = "pass --resume to continue that run, --overwrite to replace it" if resumable \
            else "pass --overwrite to replace it"
        raise OutputExistsError(f"{path} already holds {held}: {again}, or choose another output")
    if not overwrite or os.environ.get("RANK", "0") != "0":
        return
    for p in (path, *companions):
        p.unlink(missing_ok=True)


def holding(path: Path, ignore: Iterable[str] = ()) -> str | None:
    """What a non-empty output (a file, or a folder less the entries matching `ignore`) holds, in
    words; None when it is missing or empty."""
    if path.is_dir():
        entries = sorted(p.name for p in path.iterdir() if not any(p.match(c) for c in ignore))
        if not entries:
            return None
        checkpoints = [e for e in entries if e.startswith("checkpoint-")]
        shown = (checkpoints[-3:] + [e for e in entries if e in ("metrics.jsonl", "train.log")]) or entries[:3]
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


def _places(p: Path) -> set[Path]:
    """Where a path is: as written (made absolute) and with symlinks followed. Both count for
    "inside": a link inside an output folder is deleted with it, wherever it points."""
    return {Path(os.path.abspath(p)), p.resolve()}


def _inside(inner: Path, outer: Path) -> bool:
    return any(i != o and i.is_relative_to(o) for i in _places(inner) for o in _places(outer))


def check_outputs(inputs: Iterable[str | Path | None], outputs: Iterable[str | Path | None], *,
                  input_folders: Iterable[str | Path | None] = ()) -> None:
    """Raise OutputPathError when an output would overwrite an input or another output: the
    same resolved path (symlinks followed) or, for files that exist, the same inode (hard
    links); or when an output folder holds an existing input (writing or `--overwrite` there
    could replace it); or when an output lies inside one of `input_folders` (inputs that are
    folders, such as a model: it is left exactly as it was given). None entries are ignored."""
    folders = [Path(p) for p in input_folders if p is not None]
    ins = [Path(p) for p in inputs if p is not None] + folders
    outs = [Path(p) for p in outputs if p is not None]
    seen: dict[tuple[object, ...], tuple[str, Path]] = {}
    for kind, paths in (("input", ins), ("output", outs)):
        for p in paths:
            ids = _identities(p)
            for key in ids:
                if kind == "output" and key in seen:
                    other_kind, other = seen[key]
                    raise OutputPathError(f"output {p} is the same file as {other_kind} {other}: "
                                          "refusing to overwrite it; choose another path")
            for key in ids:
                seen.setdefault(key, (kind, p))
    for out in outs:
        for given in ins:
            if given.exists() and _inside(given, out):
                raise OutputPathError(f"output folder {out} holds the input {given}: a verb never writes "
                                      "where its inputs are; choose an output folder that holds none")
            if given in folders and given.is_dir() and _inside(out, given):
                raise OutputPathError(f"output {out} is inside the input folder {given}: a verb never "
                                      "writes into its inputs; choose a path outside it")


def sidecars(out: str | Path) -> list[Path]:
    """Files verbs write next to OUT: its rejects, stats, histogram, progress log and plan."""
    return [rejects_path(out), stats_path(out), sidecar_path(out, ".hist.png"), sidecar_path(out, ".log"),
            sidecar_path(out, PLAN_ENDING)]


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
