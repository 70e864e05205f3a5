"""`atomic_path`: the one temp-file-then-rename of the code base. No dependency beyond the
standard library, so that the sandbox (run as any user, with only the standard library readable)
can use it as well as the record writers (`pivotrl.io.records`)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """`with atomic_path(out) as tmp:` write the whole file to `tmp` (any writer: text, JSONL,
    parquet); it replaces `out` only when the block ends without an exception, so readers never
    see a half file and an interrupted run leaves the previous file (or none). The one
    temp-file-then-rename in the code base."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    # mkstemp makes the file 0600; give it the permissions a plain open() would.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as fh:  # the data is on disk before the name points at it
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
