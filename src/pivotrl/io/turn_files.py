"""Reading Turn files by shard, and rows of several files in another file's order (shard merge).

Both go through `records.read_records` / `records.parse_line`, where compact rows
(`pivotrl.io.compact_rows`) are expanded, so nothing here sees a row without its context.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pivotrl.io.compact_rows import REFERENCES, RowDecoder
from pivotrl.io.records import Reject, Turn, is_blank, parse_line, read_records
from pivotrl.io.seeds import derive_seed


def shard_of(turn_id: str, n: int) -> int:
    """Stable across runs and machines (not Python's salted hash)."""
    return derive_seed("shard", turn_id) % n


def scan_turns(path: str | Path, shard: tuple[int, int] | None = None
               ) -> Iterator[tuple[int, Turn | Reject]]:
    """(line number, Turn or Reject) in file order, streaming: bad lines and repeated ids are
    Rejects.

    shard (I, N): only the turns with shard_of(id, N) == I. Every row is still read and expanded
    (a compact row continues the row before it, whatever its shard), and each other shard's turn
    is dropped as soon as it is read. A repeated id falls in the same shard as its first copy, so
    duplicates are still caught; bad lines are reported by every shard (they have no
    trustworthy id)."""
    first: dict[str, int] = {}
    for lineno, rec in read_records(path, Turn):
        if isinstance(rec, Reject):
            yield lineno, rec
        elif shard is not None and shard_of(rec.id, shard[1]) != shard[0]:
            continue
        elif rec.id in first:
            yield lineno, Reject(str(path), lineno, f"duplicate id {rec.id!r} (first on line "
                                 f"{first[rec.id]})", "id")
        else:
            first[rec.id] = lineno
            yield lineno, rec


def read_turns(path: str | Path, shard: tuple[int, int] | None = None
               ) -> tuple[list[tuple[int, Turn]], list[Reject]]:
    """`scan_turns` collected: valid turns with their line numbers, and the Rejects. Turns of one
    trajectory read from a compact file share their messages, so the list holds about its
    trajectories' messages, not a copy of the context per turn."""
    turns, rejects = [], []
    for lineno, rec in scan_turns(path, shard):
        if isinstance(rec, Reject):
            rejects.append(rec)
        else:
            turns.append((lineno, rec))
    return turns, rejects


def scan_rows(path: str | Path) -> Iterator[tuple[str, int, int, bool]]:
    """(id, byte offset, line number, stands alone) of every non-blank line of a file we wrote,
    streaming; a line without an id raises ValueError naming it. "Stands alone": no reference
    to the row before it, so expanding can start there."""
    path = Path(path)
    with path.open("rb") as fh:
        offset = 0
        for lineno, raw in enumerate(fh, start=1):
            if not is_blank(raw.decode("utf-8", "replace").rstrip("\n")):
                try:
                    obj = json.loads(raw)
                    rid = str(obj["id"])
                except (ValueError, KeyError, TypeError):
                    raise ValueError(f"{path}:{lineno}: not a record with an id (a torn or "
                                     "foreign line)") from None
                yield rid, offset, lineno, not any(k in obj for k in REFERENCES)
            offset += len(raw)


def index_rows(path: str | Path) -> list[tuple[str, int, int, bool]]:
    """`scan_rows` collected."""
    return list(scan_rows(path))


class RowIndex(Sequence):
    """`index_rows` without the ids, in arrays: 17 bytes a row, not a tuple and a string."""

    def __init__(self, path: str | Path):
        self.offsets, self.lines, self.alone = array("q"), array("q"), bytearray()
        for _, offset, lineno, alone in scan_rows(path):
            self.offsets.append(offset)
            self.lines.append(lineno)
            self.alone.append(alone)

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, j):  # type: ignore[override]
        return "", self.offsets[j], self.lines[j], bool(self.alone[j])


class RowAccess:
    """Expanded rows of several files, asked for in any order: `get(f, i)` is row i of file f.

    Asking for rows in their file's order reads each line once (the decoder keeps the previous
    row). Asked out of order, it re-reads from the nearest earlier row that stands alone; a
    chain never leaves one trajectory (`pivotrl.io.compact_rows`), so that is at most its turns."""

    def __init__(self, paths: list[Path], index: list[Sequence[tuple[str, int, int, bool]]], model):
        self.paths, self.index, self.model = paths, index, model
        self.handles = [p.open("rb") for p in paths]
        self.decoders = [RowDecoder() for _ in paths]
        self.last = [-1] * len(paths)

    def get(self, f: int, i: int) -> Any:
        start = i
        if self.last[f] != i - 1:
            while start > 0 and not self.index[f][start][3]:
                start -= 1
            self.decoders[f] = RowDecoder()
        for j in range(start, i + 1):
            _, offset, lineno, _ = self.index[f][j]
            self.handles[f].seek(offset)
            text = self.handles[f].readline().decode("utf-8", "replace").rstrip("\n")
            rec = parse_line(str(self.paths[f]), lineno, text, self.model, None, self.decoders[f])
            if isinstance(rec, Reject):
                self.last[f] = -2  # the decoder holds no row: the next get starts afresh
                raise ValueError(str(rec))
        self.last[f] = i
        return rec

    def close(self) -> None:
        for h in self.handles:
            h.close()


class LazyTurns(Sequence):
    """The rows of a Turn file we wrote (pivots, turns, profiles) as a read-only sequence that
    holds only each row's byte offset (`RowIndex`): `turns[i]` reads and expands row i when asked
    (for a trainer's shuffled sampler), iterating streams the file once. Memory is flat in the
    number of rows' contents; a random access re-reads at most the rows of one trajectory's
    compact chain (`RowAccess`). A bad line raises ValueError naming it: a file we wrote."""

    def __init__(self, path: str | Path, model: type[Turn] = Turn, rows: array | None = None):
        self.path, self.model = Path(path), model
        self._index = RowIndex(self.path)
        self._access: RowAccess | None = None
        self._rows = rows  # the file rows this view holds, ascending (None: every row)

    def __len__(self) -> int:
        return len(self._index) if self._rows is None else len(self._rows)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        if self._access is None:
            self._access = RowAccess([self.path], [self._index], self.model)
        return self._access.get(0, i if self._rows is None else self._rows[i])

    def __iter__(self) -> Iterator[Turn]:
        records = (rec for _, rec in read_records(self.path, self.model, strict=True))
        if self._rows is None:
            yield from records
            return
        wanted = iter(self._rows)
        want = next(wanted, None)
        for row, rec in enumerate(records):
            if row == want:
                yield rec
                want = next(wanted, None)

    def where(self, keep: Callable[[Turn], bool]) -> "LazyTurns":
        """A view of the rows `keep` accepts (one streamed pass; it holds their row numbers)."""
        rows = array("q", (row for row, rec in enumerate(self) if keep(rec)))
        return LazyTurns(self.path, self.model, rows)

    def close(self) -> None:
        if self._access is not None:
            self._access.close()
            self._access = None


def iter_pivots(path: str | Path, model: type[Turn] = Turn) -> LazyTurns:
    """The pivots of a pivots file, read lazily (`LazyTurns`): what a trainer's data loader
    needs without holding every pivot and its context in memory."""
    return LazyTurns(path, model)


def chunks(items: Iterable[Turn], size: int) -> Iterator[list[Turn]]:
    """Consecutive lists of `size` turns (the last may be shorter), read lazily."""
    chunk: list[Turn] = []
    for it in items:
        chunk.append(it)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def parse_shard(spec: str | None) -> tuple[int, int] | None:
    if spec is None:
        return None
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError:
        raise ValueError(f"--shard must be I/N (e.g. 0/4), got {spec!r}") from None
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"--shard {spec!r}: need 0 ≤ I < N")
    return i, n
