"""Run model-written shell commands in a bubblewrap sandbox (workspaces and file-tree snapshots:
`pivotrl.sandbox.workspace`, re-exported here).

What a command inside `run_in_sandbox` sees and may do:
- `/work` is a bind of the caller's `workdir` (writable; the cwd), or of a size-limited copy
  that is copied back afterwards (disk, below). Pass a copy (`workspace_copy`) when the original
  must stay untouched.
- `/` is a read-only skeleton with every mount point in place (so `/` never changes and
  `ls -la` prints the same in every run); `/usr` (and `/bin`, `/lib*` where they are real
  directories) are read-only binds of the host's; `/etc` holds a handful of files (its own
  passwd/group/hosts plus copies of the loader cache and `alternatives`); `/tmp` (TMPDIR) and
  `/home/user` (HOME) are binds of a fresh side directory of the run (HOME's changes are
  recorded, `pivotrl.sandbox.effects`); `/proc` and `/dev` are new and minimal, and /proc's
  clock files fixed (`pivotrl.sandbox.clock`). Nothing else of the host exists: not /root, the
  host's /home or /work, sockets or keys. The command runs as uid 1000 ("user"), under a
  supervisor that is the sandbox's pid 1 and records every attempt to change something outside
  the workspace or to reach a socket or the network (`pivotrl.sandbox.watch`).
- every namespace is unshared (`--unshare-all`): no network but a private loopback, own pids;
  nested user namespaces are disabled. As root the network namespace is one made for the run
  whose every address is local, and any packet in it is recorded (`pivotrl.sandbox.effects`).
- a fixed clock: every dynamically linked program sees 2024-01-01 00:00:00 UTC as the time and
  as every file's timestamps (`pivotrl.sandbox.clock`), so time-dependent output (`date`,
  `ls -l`) is the same in every run.
- no capabilities: when we are root, bwrap runs under a throwaway uid via `setpriv` (as root it
  would keep all capabilities in the sandbox, and the kernel does not enforce RLIMIT_NPROC for
  root); the workspace is chowned to that uid for the run and back afterwards (lchown: a planted
  symlink never redirects it).
- no secrets: bwrap is started with `HOST_ENV` only, never the caller's environment; the
  command gets `--clearenv` plus PATH, HOME, LANG, TERM, USER; pid 1's command line is the
  supervisor's and the command's, nothing of the host.
- limits of the whole sandbox (`sandbox_limits_in_force()` says which hold here):
  * memory and processes: a cgroup per run (`pivotrl.sandbox.cgroups`: v2 when delegated, else v1 as
    root) caps the sum over all its processes (`total_memory_mb`, `max_processes`). Without a
    cgroup only rlimits remain: RLIMIT_AS per process (`memory_mb`) and RLIMIT_NPROC per uid, so
    the sandbox's memory is bounded by memory_mb x max_processes, not by total_memory_mb (and,
    not as root, RLIMIT_NPROC counts every process of the caller's uid, so it is set to their
    number now + max_processes). Cost (bench/bench_sandbox.py): about 2 ms CPU per run.
  * disk: as root every run writes into a size-limited tmpfs (`pivotrl.sandbox.workspace`): a
    workspace from `copy_workspace` is one; any other workdir is staged on one (`disk_mb`) and
    copied back. Without it, RLIMIT_FSIZE bounds each file, not their number.
  * per process: address space, CPU seconds, file size, open files, no cores (prlimit); a
    wall-clock timeout that kills the whole sandbox; stdout+stderr capped (the run is killed
    when the cap is passed, `truncated=True`).
Without a working bwrap `SandboxUnavailable` is raised (saying to install bubblewrap only when
a binary is missing, else quoting why bwrap could not start); a workdir removed from outside
raises `WorkspaceVanished`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import selectors
import shutil
import signal
import subprocess
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from pivotrl.sandbox import clock, effects, watch
from pivotrl.sandbox.skeleton import SANDBOX_UID, TOP_DIRS, skeleton_root
from pivotrl.sandbox.cgroups import SandboxCgroup, layout
from pivotrl.sandbox.environment import (DEFAULT_ENV, SandboxEnv, env_argv, workdir_argv,
                                         write_env_files)
from pivotrl.sandbox.workspace import (DEFAULT_DISK_MB, FIXED_MTIME, WORKSPACE_DIR_ENV,  # noqa: F401
                               chown_tree, copy_workspace, disk_quota_available, freeze_mtimes,
                               is_quota_workspace, materialize_workspace, remove_workspace,
                               replace_contents, snapshot_dir, traversable, workspace_copy,
                               workspace_parent, WorkspaceVanished)

INSTALL_HINT = ("install bubblewrap: `apt-get install -y bubblewrap` (Debian/Ubuntu), "
                "`dnf install bubblewrap` (Fedora/RHEL) or `apk add bubblewrap` (Alpine); "
                "non-root users also need unprivileged user namespaces "
                "(`sysctl kernel.unprivileged_userns_clone=1`)")
MAX_COMMAND_BYTES = 65536  # below Linux's 128 KiB limit on one exec argument
PATH_IN_SANDBOX = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The whole environment bwrap (and the setpriv / sh before it) starts with: nothing of the caller's.
HOST_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
_HOST_UID_BASE = 200_000  # root mode: throwaway host uids are drawn from [BASE, BASE + SPAN)
_HOST_UID_SPAN = 100_000


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot create its namespaces here."""


# Errors of the environment, not of an action: verifiers and scoring raise them, never score them.
BROKEN_ENVIRONMENT = (SandboxUnavailable, WorkspaceVanished)


@dataclass
class SandboxLimits:
    timeout_s: float = 5.0  # wall clock for the whole command; then every process is killed
    memory_mb: int = 256  # RLIMIT_AS per process (virtual memory)
    total_memory_mb: int = 512  # memory of the whole sandbox (cgroup; tmpfs pages included)
    max_processes: int = 64  # processes of the whole sandbox (cgroup pids.max and RLIMIT_NPROC)
    disk_mb: int = DEFAULT_DISK_MB  # tmpfs size a staged workdir gets (root; module docstring)
    max_output_bytes: int = 65536  # stdout + stderr; past this the run is killed, truncated=True
    cpu_s: int = 5  # RLIMIT_CPU per process (CPU seconds, a busy loop ends even if it forks)
    max_file_mb: int = 16  # RLIMIT_FSIZE: the largest file a command may write
    max_open_files: int = 256  # RLIMIT_NOFILE
    tmp_mb: int = 64  # size of the run's HOME + /tmp side directory (its own tmpfs as root)


@dataclass
class SandboxResult:
    exit_code: int  # the command's status; 128+N when killed by signal N; -1 when we killed it
    stdout: str
    stderr: str
    timed_out: bool
    truncated: bool
    # What the run did or tried outside /work (`pivotrl.sandbox.effects`, `.watch`): {"~/path":
    # description or None when removed, "/abs/path": "attempted OP", "<network>": "attempted"}.
    effects: dict[str, str | None] = field(default_factory=dict)


# ---------------------------------------------------------------- availability


_available: bool | None = None
_available_lock = threading.Lock()


def sandbox_available() -> bool:
    """Whether bwrap exists and can build a sandbox here (checked once per process)."""
    global _available
    with _available_lock:
        if _available is None:
            _available = _probe()
        return _available


_recorded: bool | None = None


def attempts_recorded() -> bool:
    """Whether every attempt outside the workspace is recorded here (`pivotrl.sandbox.watch`):
    checked once per process by making one."""
    global _recorded
    with _available_lock:
        if _recorded is None:
            _recorded = False
            if _probe():
                with workspace_copy(None) as wd:
                    res = _run(["sh", "-c", ": > /etc/pivotrl-probe"], wd, SandboxLimits())
                _recorded = "/etc/pivotrl-probe" in res.effects
        return _recorded


def require_recorded(allow: bool, who: str, option: str) -> None:
    """Raise SandboxUnavailable where attempts are not recorded (`attempts_recorded`), unless
    `allow` (then warn): a command that tries harm and fails would pass for one that does not."""
    if attempts_recorded():
        return
    what = (f"{who} cannot record attempts outside the workspace here (it needs a C compiler and "
            f"seccomp user notification, Linux >= 5.6: `sandbox_limits_in_force()`)")
    if not allow:
        raise SandboxUnavailable(f"{what}, so a command that tries harm and fails would be paid; "
                                 f"set {option} to run anyway")
    warnings.warn(f"{what}; running anyway ({option})", stacklevel=3)


def _probe() -> bool:
    if any(shutil.which(b) is None for b in _needed_binaries()):
        return False
    try:
        with workspace_copy(None) as wd:
            res = _run(["true"], wd, SandboxLimits(timeout_s=10))
        return res.exit_code == 0
    except (OSError, SandboxUnavailable):
        return False


def _needed_binaries() -> list[str]:
    # prlimit and setpriv come with util-linux
    return ["bwrap", "prlimit"] + (["setpriv"] if os.geteuid() == 0 else [])


def require_sandbox() -> None:
    if not sandbox_available():
        missing = [b for b in _needed_binaries() if shutil.which(b) is None]
        what = f"missing {', '.join(missing)}" if missing else "bwrap could not start a sandbox"
        raise SandboxUnavailable(f"shell actions need the bubblewrap sandbox ({what}); "
                                 f"{INSTALL_HINT}")


def _bwrap_argv(skeleton: Path, limits: SandboxLimits, nproc: int, workfd: int,
                side: Path, recfd: int, boot_fixed: bool, env: SandboxEnv = DEFAULT_ENV,
                env_dir: Path | None = None) -> list[str]:
    argv = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--as-pid-1",
            *(["--share-net"] if effects.network_recorded() else []),  # the run's own netns
            "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
            "--disable-userns", "--clearenv",
            "--setenv", "PATH", PATH_IN_SANDBOX, "--setenv", "HOME", effects.HOME_IN_SANDBOX,
            "--setenv", "TMPDIR", "/tmp", "--setenv", "TZ", "UTC",
            "--setenv", "TERM", "dumb",
            "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
            *(["--setenv", watch.WATCH_FD_ENV, str(recfd)] if recfd >= 0 else []),
            "--ro-bind", str(skeleton), "/", "--ro-bind", "/usr", "/usr"]
    for d in TOP_DIRS:
        host = Path("/") / d
        if host.is_dir() and not host.is_symlink():
            argv += ["--ro-bind", str(host), f"/{d}"]
    argv += ["--proc", "/proc", *clock.proc_binds(skeleton, None if boot_fixed else side),
             "--dev", "/dev",
             "--bind", str(side / "shm"), "/dev/shm", "--remount-ro", "/dev",
             "--bind", str(side / "tmp"), "/tmp", "--bind", str(side / "home"),
             effects.HOME_IN_SANDBOX, *env_argv(env, env_dir), *workdir_argv(env, workfd), "--",
             # The first process inside writes one byte to its stdin (the write end of a pipe
             # we read): the sandbox is up, so any `bwrap: ...` on stderr from here on is the
             # command's own text. The command's stdin is /dev/null.
             "sh", "-c", 'printf x >&0; exec "$@" </dev/null', "sh",
             "prlimit", f"--as={limits.memory_mb * 1024 * 1024}", f"--nproc={nproc}",
             f"--cpu={max(1, int(limits.cpu_s))}", f"--fsize={limits.max_file_mb * 1024 * 1024}",
             f"--nofile={limits.max_open_files}", "--core=0", "--"]
    if recfd >= 0:  # the supervisor, pid 1 (--as-pid-1), records every attempt
        argv += [watch.WATCH_PATH]
    return argv


def _cgroup_prefix(group: SandboxCgroup | None) -> list[str]:
    # The process joins the cgroup before it execs bwrap, so every sandbox process is inside
    # from its first fork (Popen(preexec_fn=...) would forbid vfork: costly under torch).
    if group is None:
        return []
    joins = "; ".join(f'echo $$ > "{f}" || exit 125' for f in group.procs_files)
    return ["/bin/sh", "-c", f'{joins}; exec "$@"', "sh"]


def sandbox_limits_in_force() -> dict[str, str]:
    """How each whole-sandbox limit is enforced on this machine (module docstring)."""
    group = layout()
    return {"memory": f"cgroup {group}" if group else "rlimit AS per process only",
            "processes": f"cgroup {group}" if group else
            ("rlimit NPROC of a throwaway uid" if os.geteuid() == 0 else
             "rlimit NPROC of the caller's uid"),
            "disk": "tmpfs quota" if disk_quota_available() else "rlimit FSIZE per file only",
            "clock": f"fixed at {clock.FIXED_TIME} (preloaded shim)"
            if clock.shim_built(skeleton_root()) else "real (no C compiler to build the shim)",
            "network": "own namespace, packets counted" if effects.network_recorded()
            else "bwrap's namespace, packets not counted",
            "attempts": "recorded (seccomp supervisor)" if attempts_recorded()
            else "NOT recorded (no C compiler, or no seccomp user notification)"}


# ---------------------------------------------------------------- running


_uid_counter = itertools.count()


def _host_uid() -> int:
    # Distinct throwaway uids keep concurrent sandboxes out of each other's RLIMIT_NPROC count.
    return _HOST_UID_BASE + (os.getpid() * 1009 + next(_uid_counter)) % _HOST_UID_SPAN


def _user_process_count(uid: int) -> int:
    n = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    n += 1
            except OSError:
                pass
    return n


def run_in_sandbox(command: str, workdir: Path | str, limits: SandboxLimits | None = None,
                   env: SandboxEnv = DEFAULT_ENV) -> SandboxResult:
    """Run `bash -c command` in the sandbox with `workdir` mounted (writable) at /work, in the
    environment `env` (`pivotrl.sandbox.environment`: probes vary it)."""
    require_sandbox()
    # Commands exec cannot take fail like a command that cannot run (model text is hostile).
    if "\x00" in command:
        return SandboxResult(126, "", "command contains a NUL byte", False, False)
    try:
        size = len(command.encode("utf-8"))
    except UnicodeEncodeError:
        return SandboxResult(126, "", "command is not valid UTF-8", False, False)
    if size > MAX_COMMAND_BYTES:
        return SandboxResult(126, "", f"command longer than {MAX_COMMAND_BYTES} bytes", False,
                             False)
    return _run(["bash", "-c", command], Path(workdir), limits or SandboxLimits(), env=env)


def _needs_stage(workdir: Path) -> bool:
    if os.geteuid() != 0:
        return False
    if not traversable(workdir.parent):  # e.g. under a 0700 directory: bwrap's uid cannot reach it
        return True
    return disk_quota_available() and not is_quota_workspace(workdir)


def _run(cmd: list[str], workdir: Path, limits: SandboxLimits, staged: bool = False,
         env: SandboxEnv = DEFAULT_ENV) -> SandboxResult:
    workdir = workdir.resolve()
    if not workdir.is_dir():
        raise WorkspaceVanished(f"sandbox workdir {workdir} is gone or not a directory (removed "
                                f"from outside while in use, e.g. by a temp cleaner?)")
    if not staged and _needs_stage(workdir):
        # run once on a size-limited copy the throwaway uid can reach, then put the result back
        stage = copy_workspace(workdir, limits.disk_mb)
        try:
            return _run(cmd, stage, limits, staged=True, env=env)
        finally:
            try:
                replace_contents(workdir, stage)
                owner = workdir.stat()
                chown_tree(workdir, owner.st_uid, owner.st_gid)
            finally:
                remove_workspace(stage)
    skeleton = skeleton_root()
    as_root = os.geteuid() == 0
    owner = workdir.stat()
    prefix: list[str] = []
    if as_root:
        uid = _host_uid()
        nproc = limits.max_processes + 4  # outer bwrap, its pid 1, sh/prlimit/bash
        # setpriv, not Popen(user=...): the latter forbids vfork, and forking a process that
        # holds torch costs ~70 ms; setpriv costs one small exec
        prefix = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        chown_tree(workdir, uid, uid)
    else:
        nproc = _user_process_count(os.getuid()) + limits.max_processes + 4
    group = SandboxCgroup.create(limits.total_memory_mb * 1024 * 1024, limits.max_processes + 4)
    side = effects.new_side_dir(limits.tmp_mb)
    env_dir = None if env == DEFAULT_ENV else write_env_files(
        env, side, (skeleton / "etc/passwd").read_text(), (skeleton / "etc/group").read_text())
    netns = effects.acquire_netns()
    packets = netns.packets() if netns else None
    workfd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)
    mark_r, mark_w = os.pipe()
    rec_r, rec_w = os.pipe() if watch.watch_built(skeleton) else (-1, -1)
    started, net, after = False, False, None
    try:
        if as_root:
            chown_tree(side, uid, uid)
        boot = clock.boottime_prefix()
        argv = (_cgroup_prefix(group) + (netns.prefix() if netns else []) + boot + prefix
                + _bwrap_argv(skeleton, limits, nproc, workfd, side, rec_w, bool(boot), env, env_dir) + cmd)
        # The output pipes belong to the uid the command runs as, so reopening them
        # (`echo x > /dev/stderr`, i.e. /proc/self/fd/2) works as it does outside a sandbox.
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        if as_root:
            for fd in (out_w, err_w, rec_w):
                if fd >= 0:
                    os.fchown(fd, uid, uid)
        try:
            proc = subprocess.Popen(argv, stdin=mark_w, stdout=out_w, stderr=err_w,
                                    pass_fds=(workfd, *([rec_w] if rec_w >= 0 else [])),
                                    start_new_session=True, cwd="/",
                                    env=HOST_ENV)
        except FileNotFoundError as exc:
            for fd in (out_r, out_w, err_r, err_w):
                os.close(fd)
            raise SandboxUnavailable(f"{exc.filename or 'bwrap'} not found; {INSTALL_HINT}") \
                from exc
        proc.stdout, proc.stderr = os.fdopen(out_r, "rb", 0), os.fdopen(err_r, "rb", 0)
        for fd in (workfd, mark_w, out_w, err_w, rec_w):
            if fd >= 0:
                os.close(fd)
        workfd = mark_w = rec_w = -1
        records = os.fdopen(rec_r, "rb", 0) if rec_r >= 0 else None
        rec_r = -1
        out, err, rec, timed_out, truncated = _collect(proc, limits, records)
        code = proc.returncode
        os.set_blocking(mark_r, False)
        with contextlib.suppress(BlockingIOError):
            started = os.read(mark_r, 1) == b"x"
        effects_seen = effects.side_effects(side)
        if records is not None and started and not timed_out and not truncated:
            effects_seen.update(watch.attempts(rec))
        if netns is not None:
            # an unreadable counter cannot prove the run stayed off the network
            after = netns.packets()
            net = packets is None or after is None or after != packets
    finally:
        effects.release_netns(netns, healthy=packets is not None and after is not None)
        remove_workspace(side)
        for fd in (workfd, mark_w, mark_r, rec_r, rec_w):
            if fd >= 0:
                os.close(fd)
        if group is not None:
            group.release()
        if as_root:
            chown_tree(workdir, owner.st_uid, owner.st_gid)
    stderr = err.decode("utf-8", "replace")
    if not started and not timed_out:
        _raise_not_started(stderr)
    if code is None or timed_out or truncated:
        code = -1
    elif code < 0:
        code = 128 - code
    if net:
        effects_seen[effects.NETWORK_EFFECT] = "attempted"
    return SandboxResult(code, out.decode("utf-8", "replace"), stderr, timed_out, truncated,
                         effects_seen)


def _raise_not_started(stderr: str) -> None:
    missing = [b for b in _needed_binaries() if shutil.which(b) is None]
    if missing:
        raise SandboxUnavailable(f"missing {', '.join(missing)}; {INSTALL_HINT}")
    raise SandboxUnavailable(f"bwrap could not start the sandbox: {stderr.strip()[-2000:]}")


def _collect(proc: subprocess.Popen, limits: SandboxLimits,
             records=None) -> tuple[bytes, bytes, bytes, bool, bool]:
    """Read the pipes until EOF, the deadline or the output cap (then kill the sandbox); the
    supervisor's records (`records`, not counted in the cap) are read alongside."""
    deadline = time.monotonic() + limits.timeout_s
    bufs = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    if records is not None:
        bufs[records] = bytearray()
    total, timed_out, truncated = 0, False, False
    sel = selectors.DefaultSelector()
    for f in bufs:
        sel.register(f, selectors.EVENT_READ)
    try:
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for key, _ in sel.select(timeout=left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                if key.fileobj is records:
                    bufs[records] += chunk[:1 << 20]
                    continue
                room = limits.max_output_bytes - total
                bufs[key.fileobj] += chunk[:max(room, 0)]
                total += len(chunk)
                if total > limits.max_output_bytes:
                    truncated = True
            if truncated:
                break
    finally:
        sel.close()
    if timed_out or truncated:
        _kill(proc)
    try:
        proc.wait(timeout=max(0.1, deadline - time.monotonic()) if not (timed_out or truncated)
                  else 5)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill(proc)
        proc.wait()
    for f in bufs:
        f.close()
    return (bytes(bufs[proc.stdout]), bytes(bufs[proc.stderr]),
            bytes(bufs.get(records, b"")), timed_out, truncated)


def _kill(proc: subprocess.Popen) -> None:
    # bwrap's pid 1 dies with its parent (--die-with-parent), and the pid namespace with it.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
