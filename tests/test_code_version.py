"""A demo's results name the code that made them: the commit, and whether its tree was clean."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from pivotrl_testbed import demo
from pivotrl_testbed.report_md import code_line, wall_time_line

ROOT = Path(__file__).resolve().parents[1]


def test_the_commit_is_this_checkouts(tmp_path):
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                          text=True)
    got = demo.code_version()
    if head.returncode != 0:  # an installed copy outside git: nothing to name, said so
        assert got == {"commit": None, "clean_tree": None}
        return
    assert got["commit"] == head.stdout.strip() and len(got["commit"]) == 40
    assert isinstance(got["clean_tree"], bool)
    runs = demo.record_invocation(tmp_path, 1.0, trained=1, jobs=2, code=got)
    runs = demo.record_invocation(tmp_path, 2.0, trained=0, jobs=2, code=got)
    saved = json.loads((tmp_path / "invocations.json").read_text())
    assert saved == runs and [r["commit"] for r in saved] == [got["commit"]] * 2


def test_the_report_line_names_each_invocations_commit():
    runs = [{"wall_seconds": 60, "commit": "a" * 40, "clean_tree": True},
            {"wall_seconds": 120, "commit": "b" * 40, "clean_tree": False}]
    line = wall_time_line({"wall_seconds": 120, "invocations": runs})
    assert "commit aaaaaaaaaa" in line and "commit bbbbbbbbbb (uncommitted changes)" in line
    assert code_line({"commit": None}) == "not a git checkout"
