"""A demo stage is never silent for longer than the heartbeat, however long its units run."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from pivotrl_testbed.demo import completed


def test_a_stage_of_long_units_says_where_it_is_between_them():
    lines: list[str] = []
    gate = threading.Event()
    with ThreadPoolExecutor(2) as pool:
        futures = {pool.submit(lambda x=x: x if x == 0 else gate.wait(5) and x): x for x in range(3)}
        t0 = time.time()
        seen = []
        for i, fut in completed(futures, t0, lines.append, "runs", every_s=0.05):
            seen.append((i, fut.result()))
            if len(seen) == 1:  # two units still run for a few heartbeats
                threading.Timer(0.25, gate.set).start()
    assert [i for i, _ in seen] == [1, 2, 3] and sorted(r for _, r in seen) == [0, 1, 2]
    beats = [ln for ln in lines if ln.startswith("  … runs:")]
    assert beats and all("/3 done" in ln and "ETA" in ln for ln in beats)
    assert any("1/3 done" in ln and "ETA after" not in ln for ln in beats)  # a rate once one is done
