"""Peak memory of one arm of a benchmark, measured in the benchmark's own process.

    with PeakMemory() as mem:
        run_the_arm()
    mem.peak_mib  # the most memory held above what was held when the arm began

On a GPU: torch's peak allocated CUDA memory (reset at the start). On a CPU: the process's
resident set sampled every 2 ms by a thread; freed heap is handed back to the system before the
arm starts (glibc `malloc_trim`), so an earlier arm's freed-but-kept memory does not hide this
arm's use. A sampled peak can miss a spike shorter than the interval: it is a lower bound.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * PAGE


def _trim() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the baseline may include freed memory
        pass


class PeakMemory:
    def __init__(self, interval_s: float = 0.002):
        import torch

        self.cuda = torch.cuda.is_available()
        self.interval_s = interval_s
        self.peak_mib = 0.0

    def __enter__(self) -> PeakMemory:
        import gc

        gc.collect()
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            self._start = torch.cuda.memory_allocated()
            return self
        _trim()
        self._start = self._peak = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._peak = max(self._peak, rss_bytes())
            time.sleep(self.interval_s)

    def __exit__(self, *exc) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
        else:
            self._stop.set()
            self._thread.join()
            peak = max(self._peak, rss_bytes())
        self.peak_mib = (peak - self._start) / 2**20
