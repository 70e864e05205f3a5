"""Whole-sandbox limits, secrets, deep trees and honest errors of the bubblewrap sandbox."""

import os
from pathlib import Path

import pytest

from pivotrl.sandbox import bwrap as sandbox
from pivotrl.sandbox.bwrap import (SandboxLimits, SandboxUnavailable, copy_workspace,
                             materialize_workspace, remove_workspace, run_in_sandbox,
                             sandbox_available, snapshot_dir, workspace_copy)


def _in_force(what: str) -> bool:
    """Whether this machine enforces a whole-sandbox `what` limit (root: cgroup, tmpfs)."""
    if not hasattr(sandbox, "sandbox_limits_in_force"):
        return os.geteuid() == 0  # code without the report: run the test, it must fail there
    return not sandbox.sandbox_limits_in_force()[what].startswith("rlimit")


pytestmark = pytest.mark.skipif(not sandbox_available(), reason="bubblewrap not usable here")


@pytest.fixture
def ws(tmp_path):
    return materialize_workspace({"a.txt": "hello\n"}, tmp_path / "ws")


def test_host_environment_never_reaches_the_sandbox(ws, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_SECRET_token_123")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-SECRET-456")
    res = run_in_sandbox("cat /proc/1/environ /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; env",
                         ws)
    assert res.exit_code == 0
    assert "SECRET" not in res.stdout + res.stderr
    assert "PATH=" in res.stdout  # the read itself worked


@pytest.mark.skipif(not _in_force("memory"), reason="no writable cgroup here")
def test_memory_is_limited_for_the_whole_sandbox(ws):
    """Four processes of 80 MB each: every one is under RLIMIT_AS (256 MB), their sum is over
    the sandbox's 200 MB, so at least one is killed."""
    hold = "python3 -c 'import time; x = b\"x\" * (80 << 20); time.sleep(1.5); print(\"held\")'"
    res = run_in_sandbox(f"for i in 1 2 3 4; do {hold} & done; wait", ws,
                         SandboxLimits(timeout_s=20, total_memory_mb=200))
    assert not res.timed_out
    assert res.stdout.count("held") < 4
    alone = run_in_sandbox(hold, ws, SandboxLimits(timeout_s=20, total_memory_mb=200))
    assert alone.stdout == "held\n"  # one process alone fits: the limit is the sum


@pytest.mark.skipif(not _in_force("disk"), reason="no tmpfs quota here (needs root)")
@pytest.mark.parametrize("on_copy", [True, False])
def test_disk_writes_are_bounded(ws, on_copy):
    """Ten files of 15 MB: each is under RLIMIT_FSIZE (16 MB), together over the 64 MB quota.
    Holds on a copy_workspace workspace and on a plain directory (staged)."""
    cmd = "for i in $(seq 10); do head -c 15000000 /dev/zero > f$i || echo FULL; done"
    if on_copy:
        with workspace_copy(ws) as wd:
            res = run_in_sandbox(cmd, wd)
            used = sum(p.stat().st_size for p in wd.iterdir())
    else:
        res = run_in_sandbox(cmd, ws)
        used = sum(p.stat().st_size for p in ws.iterdir())
    assert "FULL" in res.stdout and "No space left" in res.stderr
    assert used <= 64 * 1024 * 1024


DEEP = ("deep=$(printf 'd/%.0s' $(seq 1500)); mkdir -p $deep && echo x > $deep/f; "
        "cd /work; mkdir -p locked/inner; touch locked/inner/f; chmod 000 locked/inner locked")


@pytest.mark.parametrize("on_copy", [True, False])
def test_deep_and_locked_trees_are_walked_and_removed(tmp_path, on_copy):
    src = materialize_workspace({"a.txt": "x\n"}, tmp_path / "src")
    wd = copy_workspace(src) if on_copy else src
    res = run_in_sandbox(DEEP, wd, SandboxLimits(timeout_s=30))
    assert res.exit_code == 0, res.stderr
    snap = snapshot_dir(wd)
    assert "/".join(["d"] * 1500) + "/f" in snap
    assert snap["locked/"] == "<dir 0000>"
    assert (wd / "a.txt").stat().st_uid == os.getuid()  # ownership given back
    remove_workspace(wd)
    assert not wd.exists()


def test_command_writing_bwrap_text_is_not_a_missing_sandbox(ws):
    res = run_in_sandbox("echo 'bwrap: Creating new namespace failed' >&2; exit 1", ws)
    assert res.exit_code == 1 and res.stderr.startswith("bwrap:")


def test_a_sandbox_that_cannot_start_says_why_not_install(ws, monkeypatch):
    real = sandbox._bwrap_argv
    monkeypatch.setattr(sandbox, "_bwrap_argv",
                        lambda *a: real(*a)[:1] + ["--no-such-option"] + real(*a)[1:])
    with pytest.raises(SandboxUnavailable) as err:
        run_in_sandbox("true", ws)
    assert "no-such-option" in str(err.value) and "apt-get" not in str(err.value)


def test_snapshot_sees_permissions_and_hard_links(ws):
    with workspace_copy(ws) as good, workspace_copy(ws) as bad:
        run_in_sandbox("cp a.txt b.txt", good)
        run_in_sandbox("ln a.txt b.txt", bad)
        assert snapshot_dir(good) != snapshot_dir(bad)
        assert snapshot_dir(bad)["b.txt"] == "[link a.txt] hello\n"
    with workspace_copy(ws) as good, workspace_copy(ws) as bad:
        run_in_sandbox("sort a.txt > out", good)
        run_in_sandbox("sort a.txt > out; chmod 000 out", bad)
        assert snapshot_dir(bad)["out"] == "[mode 0000] hello\n"
        assert snapshot_dir(good)["out"] == "hello\n"


@pytest.mark.skipif(not _in_force("disk"), reason="no tmpfs quota here (needs root)")
def test_workspaces_of_a_killed_process_are_unmounted_and_removed():
    import subprocess
    import sys

    from pivotrl.sandbox import workspace

    code = ("import os; from pivotrl.sandbox.workspace import copy_workspace; "
            "print(copy_workspace(None), flush=True); os._exit(0)")  # dies without cleanup
    left = Path(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               check=True).stdout.strip())
    assert os.path.ismount(left)
    workspace._remove_stale_mounts()
    assert not left.exists()
