"""A training run's folder (`train`, `sft`, `e2e` OUTPUT_DIR) and its record, `pivotrl_run.json`.

The record is what makes a folder a run's: the verb writes it when the run starts, with the sha256
of each input file (pivots, data or tasks, split), and adds, when the run ends, the entries the run
wrote. It decides three things:

- `--overwrite` deletes only what a run wrote: the entries the record lists, and the files a run
  writes before it ends (checkpoints, metrics, log, prompt caches: `RUN_FILES`), so a crashed run's
  leftovers go too. Anything else in the folder stays. A folder without a record is a run's only
  when it holds a run's own files (`metrics.jsonl`, `train.log`, `checkpoint-*`; a folder that
  older versions wrote); never because it holds `config.json`: every Hugging Face model folder does.
- `--resume` continues only on the inputs the run started on: a changed file is an error naming it
  (the pivots a step draws and the split that holds trajectories out would differ from the
  checkpoint's, and the run would mix two data sets without a word).
- An output folder that is, holds or lies inside an input is refused before anything is written
  (`io.outputs.check_outputs`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from pivotrl.io.inputs import InputError
from pivotrl.io.outputs import CONFIG_FILE, PLAN_FILE, OutputExistsError, check_outputs, holding
from pivotrl.io.records import write_text_atomic

RECORD = "pivotrl_run.json"
# What a run writes before it ends (a crashed run leaves these; `runs` is the tensorboard log,
# `curves.png` the learning curves redrawn at each checkpoint):
# `--overwrite` deletes them even when the record does not list them yet.
RUN_FILES = ("checkpoint-*", "metrics.jsonl", "train.log", "prompts.rank*.jsonl", ".prompt_cache",
             "*.rejects.jsonl", "runs", "curves.png", PLAN_FILE, CONFIG_FILE, RECORD)
# What a run writes before its first result: a folder holding only these is a start that failed,
# and a new run takes it over without --overwrite.
# Their temporaries count too: under several processes, one checks the folder while the main
# process writes the record (io.atomic's `.NAME.*.tmp` before its rename).
RUN_CACHES = ("prompts.rank*.jsonl", ".prompt_cache", PLAN_FILE, CONFIG_FILE, RECORD,
              *(f".{name}.*.tmp" for name in (PLAN_FILE, CONFIG_FILE, RECORD)))
# The files by which a run folder written before the record existed is known.
LEGACY_MARKERS = ("metrics.jsonl", "train.log", "checkpoint-*")

InputFiles = Mapping[str, "str | Path | Iterable[str | Path] | None"]


class InputChangedError(InputError):
    """`--resume` on an input file that is not the one the run started on."""


def claim_run_folder(path: str | Path, *, model: str | Path, inputs: Iterable[str | Path | None],
                     resume: bool, overwrite: bool, dry_run: bool = False) -> None:
    """Make `path` ready for a run, before anything is loaded. An output that is or holds the
    `model` folder or one of the input files `inputs`, or lies inside the model folder, is
    OutputPathError. Empty, missing or a failed start: nothing to do. Holding a run: `resume`
    keeps it, `overwrite` deletes what the run wrote (on the main process only), neither is
    OutputExistsError saying what is there. A folder holding no run is neither continued nor
    cleared. `dry_run`: every check, nothing deleted."""
    path = Path(path)
    check_outputs(inputs, [path], input_folders=[model])
    if resume and overwrite:
        raise ValueError("--resume and --overwrite exclude each other: continue the run, or replace it")
    held = holding(path, ignore=RUN_CACHES)
    if held is None:
        return
    # A folder holding no run is refused alike with or without the flags, so the message never
    # suggests a flag that would be refused next.
    if path.is_file() or not (_record(path) is not None or any(any(path.glob(m)) for m in LEGACY_MARKERS)):
        raise OutputExistsError(f"{path} holds {held} but no run (no {RECORD}, metrics.jsonl, train.log "
                                "or checkpoint-*): --resume continues and --overwrite deletes only what a "
                                "run wrote; choose another output")
    if not (resume or overwrite):
        raise OutputExistsError(f"{path} already holds {held}: pass --resume to continue that run, "
                                "--overwrite to replace it, or choose another output")
    if resume or dry_run:
        return
    if os.environ.get("RANK", "0") == "0":
        for entry in run_entries(path):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()


def run_entries(path: Path) -> list[Path]:
    """The entries of run folder `path` that a run wrote: those its record lists and those
    matching RUN_FILES; in a folder without a record (older versions wrote none), every entry."""
    record = _record(path)
    if record is None:
        return sorted(path.iterdir())
    wrote = set(record.get("wrote", []))
    return sorted(p for p in path.iterdir() if p.name in wrote or any(p.match(m) for m in RUN_FILES))


def start_run(path: str | Path, verb: str, inputs: InputFiles, *, resume: bool,
              dry_run: bool = False) -> None:
    """Record a starting run's input files in its folder (`inputs`: a label such as "pivots" →
    a file, a list of files or None); on `resume`, first check them against the record:
    InputChangedError naming the first file whose content (sha256) is not the run's. A folder
    without a record (a run of an older version) is recorded as it is. The main process writes;
    `dry_run` checks and writes nothing."""
    path = Path(path)
    now = {label: [_file_hash(p) for p in _as_list(files)] for label, files in inputs.items()}
    record = _record(path) if resume else None
    if record:
        _check_unchanged(record.get("inputs", {}), now)
    if dry_run or os.environ.get("RANK", "0") != "0":
        return
    if not record:
        present = sorted(p.name for p in path.iterdir()) if path.is_dir() else []
        record = {"verb": verb, "inputs": now, "present_before": present, "wrote": []}
    record["started"] = time.time()
    path.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path / RECORD, json.dumps(record, indent=1))


def finish_run(path: str | Path) -> None:
    """Add to the record what the run wrote: every entry of the folder but those present before
    it began and unchanged since. Called by the main process once the final model is saved."""
    path = Path(path)
    record = _record(path)
    if record is None:
        return
    before, started = set(record.get("present_before", [])), record.get("started", 0.0)
    wrote = set(record.get("wrote", [])) | {p.name for p in path.iterdir() if p.name != RECORD and (
        p.name not in before or p.lstat().st_mtime >= started)}
    record["wrote"] = sorted(wrote)
    write_text_atomic(path / RECORD, json.dumps(record, indent=1))


def _check_unchanged(recorded: dict[str, list[dict[str, str]]], now: dict[str, list[dict[str, str]]]) -> None:
    for label in sorted(set(recorded) | set(now)):
        old, new = recorded.get(label, []), now.get(label, [])
        for i in range(max(len(old), len(new))):
            was = old[i] if i < len(old) else None
            got = new[i] if i < len(new) else None
            if was is not None and got is not None and was["sha256"] == got["sha256"]:
                continue
            named = (got or was)["path"]
            if was is None:
                why = "the run started without it"
            elif got is None:
                why = "the run started with it and this resume does not name it"
            else:
                why = (f"sha256 {was['sha256'][:12]}… when the run started, {got['sha256'][:12]}… now"
                       + ("" if was["path"] == got["path"] else f" (started on {was['path']})"))
            raise InputChangedError(f"--resume: {label} {named} is not the file this run started on ({why}): "
                                    "resume on the same file, or start over with --overwrite or another "
                                    "output folder")


def _as_list(files) -> list[Path]:
    if files is None:
        return []
    return [Path(f) for f in files] if isinstance(files, (list, tuple)) else [Path(files)]


def _file_hash(path: Path) -> dict[str, str]:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return {"path": str(path.resolve()), "sha256": digest.hexdigest()}


def _record(path: Path) -> dict | None:
    """The folder's record; None when it has none. An unreadable one (edited by hand) reads as
    empty: the folder is still a run's, and `--overwrite` still deletes only RUN_FILES."""
    file = path / RECORD
    if not file.is_file():
        return None
    try:
        record = json.loads(file.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}
