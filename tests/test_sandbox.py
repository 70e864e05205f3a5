"""The bubblewrap sandbox: what a command can do, and above all what it cannot."""

import os
import time
from pathlib import Path

import pytest

from pivotrl.sandbox import bwrap as sandbox
from pivotrl.sandbox.bwrap import (SandboxLimits, SandboxUnavailable, copy_workspace, freeze_mtimes,
                             materialize_workspace, run_in_sandbox, sandbox_available,
                             snapshot_dir, workspace_copy)

pytestmark = pytest.mark.skipif(not sandbox_available(), reason="bubblewrap not usable here")
FAST = SandboxLimits(timeout_s=2.0, cpu_s=2)


@pytest.fixture
def ws(tmp_path):
    wd = materialize_workspace({"a.txt": "x\ny\nx\n", "sub/b.txt": "hello\n", "empty/": None},
                               tmp_path / "ws")
    return wd


def test_runs_in_workspace_and_writes_there(ws):
    res = run_in_sandbox("pwd; cat a.txt | sort | uniq -c; echo new > c.txt; id -un", ws)
    assert res.exit_code == 0 and not res.timed_out and not res.truncated
    lines = res.stdout.split("\n")
    assert lines[0] == "/work"
    assert " ".join(lines[1].split()) == "2 x"
    assert lines[-2] == "user"
    assert (ws / "c.txt").read_text() == "new\n"
    # files written inside belong to the caller again afterwards
    assert (ws / "c.txt").stat().st_uid == os.getuid()


def test_exit_code_and_stderr(ws):
    res = run_in_sandbox("echo oops >&2; exit 3", ws)
    assert res.exit_code == 3 and res.stderr == "oops\n" and res.stdout == ""


def test_no_network(ws):
    cmds = ["curl -sS -m 2 http://1.1.1.1/ >/dev/null",
            "bash -c 'echo > /dev/tcp/1.1.1.1/80'",
            "python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 80), timeout=2)'",
            "getent hosts pypi.org"]
    for cmd in cmds:
        res = run_in_sandbox(cmd, ws, FAST)
        assert res.exit_code != 0, (cmd, res)


def test_cannot_write_outside_workspace(ws, tmp_path):
    before = Path("/etc/passwd").read_bytes()
    res = run_in_sandbox("echo x > /etc/passwd; touch /root/x; touch /usr/x; mkdir /evil; "
                         "touch /bin/evil; echo done", ws, FAST)
    assert "done" in res.stdout
    assert res.stderr.count("Read-only file system") >= 3
    assert Path("/etc/passwd").read_bytes() == before
    assert not Path("/root/x").exists() and not Path("/usr/x").exists()
    assert not Path("/evil").exists() and not Path("/usr/bin/evil").exists()


def test_host_files_are_invisible(ws, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET")
    res = run_in_sandbox(f"cat {secret}; cat /root/.bashrc; ls /home; cat /etc/shadow; "
                         f"grep -r TOP-SECRET / 2>/dev/null | head -1", ws, FAST)
    assert "TOP-SECRET" not in res.stdout
    assert "No such file" in res.stderr


def test_symlink_out_of_workspace_is_harmless(ws):
    """A planted symlink must not make snapshot/chown touch the host file it points to."""
    before = os.stat("/etc/passwd")
    res = run_in_sandbox("ln -s /etc/passwd link; mkfifo fifo", ws, FAST)
    assert res.exit_code == 0
    after = os.stat("/etc/passwd")
    assert (after.st_uid, after.st_gid) == (before.st_uid, before.st_gid)
    snap = snapshot_dir(ws)
    assert snap["link"] == "<symlink> /etc/passwd" and snap["fifo"] == "<special>"


def test_fork_bomb_is_bounded(ws):
    """A fork bomb ends at the wall-clock limit, and nothing of it survives on the host. (The
    bomb's own exit code says nothing: its first shell may return before any fork fails.)"""
    token = f"bomb-{os.getpid()}-{time.monotonic_ns()}"
    t0 = time.monotonic()
    res = run_in_sandbox(f":(){{ :|:& }};:; sleep 30 # {token}", ws, FAST)
    assert time.monotonic() - t0 < 25  # bounds a hang: the bomb's sleep is 30 s
    assert res.timed_out and res.exit_code == -1
    assert _wait_until_gone(token)


def test_process_count_is_bounded(ws):
    """Each background job (one process: the file is written by a builtin, then sleep replaces
    the subshell) leaves a file; the files counted after the run are the processes the
    sandbox let the command start: at most its budget (+4 for bwrap, its pid 1, sh and bash)."""
    limits = SandboxLimits(timeout_s=4.0, cpu_s=2, max_processes=12)
    res = run_in_sandbox("for i in $(seq 60); do (: > p$i; exec sleep 20) & done; wait", ws, limits)
    assert res.timed_out  # bash keeps retrying the fork that the budget refuses
    started = len(list(ws.glob("p*")))
    assert 4 <= started <= limits.max_processes + 4, started


def _wait_until_gone(token: str, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while _processes_with(token):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _processes_with(token: str) -> int:
    n = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if token.encode() in Path(entry.path, "cmdline").read_bytes():
                    n += 1
            except OSError:
                pass
    return n


def test_timeout_kills(ws):
    t0 = time.monotonic()
    res = run_in_sandbox("sleep 100", ws, SandboxLimits(timeout_s=1.0))
    assert res.timed_out and res.exit_code == -1
    assert time.monotonic() - t0 < 50  # bounds a hang: the command sleeps 100 s


def test_background_process_dies_with_sandbox(ws):
    t0 = time.monotonic()
    res = run_in_sandbox("(sleep 100 > /dev/null 2>&1 &) ; echo started", ws, FAST)
    assert res.stdout == "started\n" and time.monotonic() - t0 < 50  # not the 100 s sleep


def test_huge_output_is_capped(ws):
    limits = SandboxLimits(timeout_s=3.0, max_output_bytes=1000)
    res = run_in_sandbox("yes", ws, limits)
    assert res.truncated and len(res.stdout.encode()) <= 1000
    res = run_in_sandbox("seq 1 10", ws, limits)
    assert not res.truncated and res.stdout.split() == [str(i) for i in range(1, 11)]


def test_memory_and_file_size_limits(ws):
    res = run_in_sandbox("python3 -c 'x = bytearray(2 * 10**9)'", ws, FAST)
    assert res.exit_code != 0 and "MemoryError" in res.stderr
    res = run_in_sandbox("head -c 20000000 /dev/zero > big", ws,
                         SandboxLimits(timeout_s=3.0, max_file_mb=1))
    assert res.exit_code != 0 and (ws / "big").stat().st_size <= 1024 * 1024


@pytest.mark.parametrize("cmd", ["echo a\x00b", "echo \ud800", "echo " + "x" * 200_000])
def test_unrunnable_commands_fail_without_crashing(ws, cmd):
    res = run_in_sandbox(cmd, ws)
    assert res.exit_code == 126 and res.stdout == ""


def test_copy_and_snapshot(ws):
    with workspace_copy(ws) as copy:
        run_in_sandbox("echo changed > a.txt; rm -r empty; chmod +x sub/b.txt", copy)
        snap = snapshot_dir(copy)
        assert snap["a.txt"] == "changed\n" and "empty/" not in snap
        assert snap["sub/b.txt"] == "[+x] hello\n"
    assert not copy.exists()
    assert snapshot_dir(ws) == {"a.txt": "x\ny\nx\n", "empty/": "<dir>", "sub/": "<dir>",
                                "sub/b.txt": "hello\n"}
    (ws / "big.bin").write_bytes(b"\xff" * 10)
    assert snapshot_dir(ws)["big.bin"].startswith("sha256:")


def test_listing_is_reproducible_across_copies(ws):
    """`ls -la` in two copies made at different times prints the same (timestamps frozen)."""
    outs = []
    for _ in range(2):
        d = copy_workspace(ws)
        freeze_mtimes(d)
        outs.append(run_in_sandbox("ls -la; ls -la sub", d).stdout)
        sandbox.remove_workspace(d)
    assert outs[0] == outs[1] and "Jan  1  2024" in outs[0]


def test_workspace_paths_cannot_escape(tmp_path):
    for bad in ("../x", "/etc/x", "a/../../x"):
        with pytest.raises(ValueError):
            materialize_workspace({bad: "x"}, tmp_path / "w")


def test_missing_bwrap_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox, "_available", None)
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    with pytest.raises(SandboxUnavailable, match="apt-get install -y bubblewrap"):
        run_in_sandbox("true", tmp_path)


# ---------------------------------------------------------------- effects, network record, clock


def test_home_changes_are_recorded_tmp_is_scratch_and_both_are_fresh_each_run(ws):
    assert run_in_sandbox("grep -c x a.txt", ws, FAST).effects == {}
    res = run_in_sandbox('echo $HOME $TMPDIR; echo s > /tmp/t; echo a >> ~/.bashrc; '
                         'rm ~/.profile; mkdir ~/.cache; echo m > /dev/shm/m', ws, FAST)
    assert res.stdout == "/home/user /tmp\n"
    # /tmp and /dev/shm are thrown away with the run: what a command leaves there is no effect
    assert res.effects == {"~/.bashrc": "# ~/.bashrc\nalias ll='ls -l'\na\n",
                           "~/.profile": None, "~/.cache/": "<dir>"}
    again = run_in_sandbox("ls -A /tmp ~", ws, FAST)  # nothing of the last run is left
    assert again.stdout.split() == ["/home/user:", ".bashrc", ".profile", ".ssh", "/tmp:"]
    assert again.effects == {}
    assert sorted(p.name for p in ws.iterdir()) == ["a.txt", "empty", "sub"]


@pytest.mark.skipif(not sandbox.effects.network_recorded(), reason="network not recorded here")
def test_network_attempts_are_recorded_and_fail_at_once(ws):
    # "At once": refused, not waited out. Each command prints its exit status (the Python one
    # its errno), which must be a refusal: curl's 28 and ETIMEDOUT (110) are time-outs.
    timeouts = {"curl": "28", "python3": "110"}
    for cmd in ["curl -s -m 3 http://198.51.100.1/", "getent hosts pypi.org",
                "python3 -c 'import socket; print(socket.socket().connect_ex((\"10.9.8.7\", 22)))'",
                "curl -s -m 3 'http://[2001:db8::7]/'", "bash -c 'echo > /dev/udp/8.8.8.8/53'"]:
        res = run_in_sandbox(cmd + "; echo rc=$?", ws, FAST)
        *printed, status = res.stdout.split()
        code = printed[-1] if cmd.startswith("python3") else status.removeprefix("rc=")
        assert not res.timed_out and code != timeouts.get(cmd.split()[0]), (cmd, res)
        assert res.effects == {"<network>": "attempted"}, (cmd, res.effects)
    assert run_in_sandbox("cat a.txt >/dev/null", ws, FAST).effects == {}


@pytest.mark.skipif("fixed" not in sandbox.sandbox_limits_in_force()["clock"],
                    reason="no C compiler: the clock is real here")
def test_the_fixed_clock_holds_whatever_the_environment(ws):
    cmds = ["date -u '+%F %T'", "env -i /usr/bin/date -u +%s", "LD_PRELOAD= date +%s",
            "touch n; stat -c '%Y %X %Z' n a.txt", "python3 -c 'import time; print(int(time.time()))'",
            "echo $EPOCHSECONDS; printf '%(%s)T\\n' -1", "ls -l --time-style=+%s a.txt | cut -d' ' -f6"]
    out = [run_in_sandbox(c, ws, FAST).stdout.split() for c in cmds]
    fixed = str(sandbox.clock.FIXED_TIME)
    assert out[0] == ["2024-01-01", "00:00:00"]
    assert all(set(words) == {fixed} for words in out[1:]), out


def test_dev_stdout_and_stderr_can_be_reopened(ws):
    # `> /dev/stderr` is `>&2` outside a sandbox: the same output and exit code inside
    res = run_in_sandbox("echo e > /dev/stderr && echo o > /dev/stdout", ws, FAST)
    assert (res.exit_code, res.stdout, res.stderr) == (0, "o\n", "e\n")
