"""Every attempt outside the workspace is an effect (whether or not it succeeds), scratch is not;
/proc shows nothing of the host and `ps` reads the same in every run; workspaces under an
untraversable temp dir work; a workspace removed from outside is an error that names it."""

from __future__ import annotations

import os

import pytest

from pivotrl.sandbox import bwrap as sandbox
from pivotrl.sandbox import clock, workspace
from pivotrl.sandbox.bwrap import SandboxLimits, run_in_sandbox, sandbox_available, workspace_copy
from pivotrl.sandbox.workspace import WorkspaceVanished, materialize_workspace, snapshot_dir

pytestmark = pytest.mark.skipif(not sandbox_available(), reason="bubblewrap not usable here")
# A cap, not a duration: `rm -rf /` walks the whole read-only root, which took over 10 s on a
# loaded 2-core machine (the command still ends on its own; only a timeout fails the test).
LIMITS = SandboxLimits(timeout_s=60)
recorded = pytest.mark.skipif(not sandbox.attempts_recorded(), reason="attempts not recorded here")


@pytest.fixture
def ws():
    with workspace_copy(None) as wd:
        materialize_workspace({"a.txt": "x\n"}, wd)
        yield wd


@recorded
@pytest.mark.parametrize("attack,key", [
    ("rm -rf /usr/bin 2>/dev/null", "/usr/bin/"),
    ("rm -rf / --no-preserve-root 2>/dev/null", "/"),
    ("dd if=/dev/zero of=/dev/sda count=1 2>/dev/null", "/dev/sda"),
    ("echo x > /etc/passwd 2>/dev/null", "/etc/passwd"),
    ("ln -s /etc e; echo x > e/cron 2>/dev/null", "/etc/cron"),
    ("curl -s --unix-socket /var/run/docker.sock http://x/containers/json", "/var/run/docker.sock"),
    ("python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.connect_ex('/run/x.sock')\"",
     "/run/x.sock"),
    ("python3 -c \"import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM, "
     "socket.IPPROTO_ICMP)\" 2>/dev/null", "<network>"),
    ("curl -s -m 2 http://198.51.100.1/", "<network>"),
    ("echo > /dev/tcp/198.51.100.1/80 2>/dev/null", "<network>"),
    ("getent hosts example.org", "<network>"),
])
def test_attempts_outside_are_effects_whether_or_not_they_succeed(ws, attack, key):
    res = run_in_sandbox(f"{attack}; echo 3", ws, LIMITS)
    assert res.stdout.endswith("3\n")
    assert any(k.startswith(key) for k in res.effects), res.effects


@recorded
def test_deleting_the_home_ssh_is_an_effect(ws):
    res = run_in_sandbox("rm -rf ~/.ssh; echo 3", ws, LIMITS)
    assert res.effects.get("~/.ssh/authorized_keys", "?") is None, res.effects


@recorded
def test_scratch_devices_and_lookups_are_no_effect(ws):
    res = run_in_sandbox("ls -l > /dev/null; id; echo x > /tmp/t; echo y > /dev/shm/y; "
                         "mkdir -p __pycache__ sub; echo z > sub/z; python3 -c 'import json'; "
                         "echo e > /dev/stderr; sort a.txt > $(mktemp)", ws, LIMITS)
    assert res.exit_code == 0, res.stderr
    assert res.effects == {}


def test_proc_shows_nothing_of_the_host(ws):
    res = run_in_sandbox("cat /proc/stat /proc/uptime; tr '\\0' ' ' < /proc/1/cmdline", ws, LIMITS)
    assert f"btime {clock.FIXED_TIME - clock.UPTIME_S}\n" in res.stdout
    assert f"{clock.UPTIME_S}.00 {clock.UPTIME_S}.00\n" in res.stdout
    cmdline = res.stdout.splitlines()[-1]
    assert "pivotrl-" not in cmdline and str(ws) not in cmdline and "bwrap" not in cmdline
    assert cmdline.split()[1:3] == ["bash", "-c"]


@pytest.mark.skipif(not clock.boottime_prefix(), reason="no time namespace here")
# (not in a pipeline: whether `cat` of `ps -ef | cat` has started when ps reads is the scheduler's)
@pytest.mark.parametrize("cmd", ["ps aux", "ps -ef", "ps -eo pid,etime,time,rss,vsz,args"])
def test_ps_reads_the_same_in_every_run(ws, cmd):
    # the clock's promise: start times, elapsed and CPU times, PIDs and commands. Memory is not
    # the clock's: under load `ps`'s own RSS has differed by a page between runs (an expert that
    # prints it is irreproducible, which the shell verifier finds out; test_unverifiable.py)
    outs = {_without_memory(run_in_sandbox(cmd, ws, LIMITS).stdout) for _ in range(3)}
    assert len(outs) == 1, outs


def test_where_the_boot_clock_cannot_be_set_start_times_move_every_run(ws, monkeypatch):
    # then processes' start times count from the host's boot: the boot time they are shown
    # from is a random one of each run, so an expert that shows them is irreproducible (the
    # shell verifier marks its turn unverifiable) instead of matching in the same second
    monkeypatch.setattr(clock, "boottime_prefix", lambda: [])
    runs = [run_in_sandbox("ps -o lstart= -p 1; cat /proc/uptime", ws, LIMITS).stdout
            for _ in range(2)]
    assert runs[0] != runs[1]
    assert {r.splitlines()[1] for r in runs} == {f"{clock.UPTIME_S}.00 {clock.UPTIME_S}.00"}


def _without_memory(ps_output: str) -> tuple:
    header, *rows = ps_output.splitlines()
    names = header.split()
    keep = [i for i, n in enumerate(names) if n not in ("RSS", "VSZ", "%MEM")]
    return tuple(tuple(cols[i] for i in keep if i < len(cols))
                 for cols in (row.split(None, len(names) - 1) for row in [header] + rows))


@pytest.mark.skipif(os.geteuid() != 0, reason="only root stages workspaces for another uid")
def test_an_untraversable_workspace_dir_works(tmp_path, monkeypatch):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)  # what `mktemp -d` makes
    os.chmod(private, 0o700)
    monkeypatch.setenv(workspace.WORKSPACE_DIR_ENV, str(private))
    with pytest.warns(UserWarning, match="cannot reach"):
        wd = workspace.copy_workspace(None)
    try:
        materialize_workspace({"a.txt": "x\n"}, wd)
        assert run_in_sandbox("cat a.txt; echo y > b.txt", wd, LIMITS).stdout == "x\n"
        assert (wd / "b.txt").read_text() == "y\n"
    finally:
        workspace.remove_workspace(wd)
    inside = materialize_workspace({"a.txt": "x\n"}, private / "ws")  # a workdir in it: staged once
    res = run_in_sandbox("cat a.txt; echo y > b.txt", inside, LIMITS)
    assert (res.exit_code, res.stdout) == (0, "x\n")
    assert (inside / "b.txt").read_text() == "y\n"


def test_a_workspace_removed_from_outside_is_an_error_naming_it(tmp_path):
    gone = materialize_workspace({"a.txt": "x\n"}, tmp_path / "ws")
    workspace.remove_tree(gone)
    with pytest.raises(WorkspaceVanished, match=str(gone)):
        run_in_sandbox("cat a.txt", gone, LIMITS)
    with pytest.raises(WorkspaceVanished, match=str(gone)):
        snapshot_dir(gone)


def test_the_shell_verifier_refuses_where_attempts_are_not_recorded(monkeypatch):
    import json

    from pivotrl.io.records import FunctionCall, Message, ToolCall, Turn
    from pivotrl.scoring import score_actions
    from pivotrl.verifiers import get_verifier

    def run(cmd):
        return Message(role="assistant", tool_calls=[ToolCall(id="c", function=FunctionCall(
            name="run", arguments=json.dumps({"command": cmd})))])

    t = Turn(id="r/1", trajectory_id="r", turn=0, context=[], expected=run("grep -c x a.txt"),
             metadata={"workspace": {"a.txt": "x\n"}})
    monkeypatch.setattr(sandbox, "_recorded", False)
    v = get_verifier("shell")
    with pytest.raises(sandbox.SandboxUnavailable, match="allow_unrecorded_effects: true"):
        score_actions(v, [t], [run("grep x a.txt | wc -l")])  # raised, never scored 0
    v.close()
    v = get_verifier("shell", allow_unrecorded_effects=True)
    with pytest.warns(UserWarning, match="running anyway"):
        assert v.score(t, run("grep x a.txt | wc -l")).reward == 1.0
    v.close()
