"""Progress of a long job as plain lines, `step 12/40 · 3.1 s/step · ETA 1m27s · reward 0.41`,
printed to a stream and appended to a log file. A line (not a redrawn bar) reaches a SLURM log or
a pipe whole, and the log file keeps the history after the terminal is gone. Lines come at most
every `every_s` seconds, plus the last; inside `ProgressLog.running()` they come every `every_s`
seconds even while one long unit of work (a chunk of turns, a training step) runs."""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO


def duration(seconds: float) -> str:
    """45s, 1m27s, 2h03m."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def rate_text(seconds: float, done: int, unit: str) -> str:
    """`3.1 s/step` for slow units, `12.4 turns/s` for fast ones."""
    if done <= 0:
        return f"– s/{unit}"
    per = seconds / done
    return f"{per:.1f} s/{unit}" if per >= 1 else f"{1 / max(per, 1e-9):.1f} {unit}s/s"


class ProgressLog:
    """`update(done)` writes a line when `every_s` seconds have passed since the last one (or the
    start), and always when done == total. The rate counts only work done since the
    log was opened, so a resumed job's ETA is not flattered by the steps it skipped."""

    def __init__(self, label: str, total: int | None, *, unit: str = "step", every_s: float = 30.0,
                 log_file: str | Path | None = None, stream: TextIO | None = None, start: int = 0,
                 echo: bool = True, clock=time.monotonic):
        self.label, self.total, self.unit, self.every_s = label, total, unit, every_s
        self.log_file = Path(log_file) if log_file is not None else None
        self.stream = stream if stream is not None else sys.stderr
        self.echo = echo  # False: the log file only (a live bar shows the terminal)
        self.clock = clock
        self.t0, self.start = clock(), start
        # The first line waits `every_s` too: work often arrives in chunks, and a line after the
        # first item would report the first chunk's latency as the rate.
        self.last = self.t0
        self.done, self.extra = start, ""
        self._lock = threading.Lock()

    def line(self, done: int, extra: str = "") -> str:
        elapsed = self.clock() - self.t0
        new = done - self.start
        parts = [f"{self.label} {done}/{self.total}" if self.total else f"{self.label} {done}"]
        if new > 0 or not extra:  # before the first unit, the work noted in `extra` is the progress
            parts.append(rate_text(elapsed, new, self.unit))
        if self.total and new > 0:
            parts.append(f"ETA {duration((self.total - done) * elapsed / new)}")
        parts.append(f"elapsed {duration(elapsed)}")
        if extra:
            parts.append(extra)
        return " · ".join(parts)

    def note(self, done: int, extra: str = "") -> None:
        """Record progress without writing; `running()` writes it when a line is due. Work that
        finishes in bursts (a chunk of turns at once) is noted item by item: a line written at
        the burst's first item would rate the whole chunk's time as one item's."""
        self.done, self.extra = done, extra

    def update(self, done: int, extra: str = "", force: bool = False,
               total: int | None = None) -> str | None:
        """Write a line if one is due; returns it (None when not due). `total` sets the total
        when it is known only once the job runs."""
        self.total = total if total is not None else self.total
        self.note(done, extra)
        final = self.total is not None and done >= self.total
        return self._write_if_due(force or final)

    def _write_if_due(self, force: bool = False) -> str | None:
        with self._lock:
            now = self.clock()
            if not (force or now - self.last >= self.every_s):
                return None
            self.last = now
            text = self.line(self.done, self.extra)
            if self.echo:
                self.stream.write(text + "\n")
                self.stream.flush()
            if self.log_file is not None:
                self.log_file.parent.mkdir(parents=True, exist_ok=True)
                with self.log_file.open("a") as f:
                    f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")
            return text

    @contextmanager
    def running(self, poll_s: float = 1.0):
        """A line every `every_s` seconds while the block runs, whatever the caller is doing: the
        latest `note`d progress (before any, no rate and no ETA), from a daemon thread."""
        if self.every_s <= 0:  # a line at every update already: nothing to add between them
            yield self
            return
        stop = threading.Event()

        def beat():
            while not stop.wait(min(poll_s, self.every_s)):
                self._write_if_due()

        thread = threading.Thread(target=beat, name=f"progress-{self.label}", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()


class TokenCount:
    """Tokens sampled since `t0` (a `time.perf_counter()` reading) and their rate, as a progress
    line shows them while a chunk of samples is drawn (`sample_and_score`'s `on_tokens`)."""

    def __init__(self, t0: float | None = None):
        self.t0, self.tokens = time.perf_counter() if t0 is None else t0, 0

    def add(self, k: int) -> None:
        self.tokens += k

    def text(self) -> str:
        if not self.tokens:
            return ""
        return f"{self.tokens:,} tokens sampled ({self.tokens / max(time.perf_counter() - self.t0, 1e-9):,.0f}/s)"
