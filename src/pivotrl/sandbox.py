"""Run model-written shell commands in a bubblewrap sandbox, and compare file trees.

What a command inside `run_in_sandbox` sees and may do:
- `/work` is a bind of the caller's `workdir` (writable; the cwd). Pass a copy (`workspace_copy`)
  when the original must stay untouched.
- `/` is a read-only skeleton with every mount point in place (so `/` never changes and
  `ls -la` prints the same in every run); `/usr` (and `/bin`, `/lib*` where they are real
  directories) are read-only binds of the host's; `/etc` holds a handful of files (its own
  passwd/group/hosts plus copies of the loader cache and `alternatives`); `/tmp` is a fresh
  tmpfs; `/proc` and `/dev` are new and minimal. Nothing else of the host exists: not /root,
  /home, the host's /work, sockets or keys. The command runs as uid 1000 ("user"), HOME=/tmp.
- every namespace is unshared (`--unshare-all`): no network but a private loopback, own pids;
  nested user namespaces are disabled.
- no capabilities: when we are root, bwrap runs under a throwaway uid via `setpriv` (as root it
  would keep all capabilities in the sandbox, and the kernel does not enforce RLIMIT_NPROC for
  root); the workspace is chowned to that uid for the run and back afterwards (lchown: a planted
  symlink never redirects it). A workspace under a directory that uid cannot enter (0700) is
  run on a staged copy and copied back.
- rlimits via `prlimit`: address space, processes, CPU seconds, file size, open files, no cores;
  a wall-clock timeout that kills the whole sandbox; stdout+stderr capped (the run is killed when
  the cap is passed, `truncated=True`).
- limits of the limits: RLIMIT_FSIZE bounds each file, not the number of files a command writes
  before the timeout; timestamps of files a command writes are real (two runs minutes apart
  differ in `ls -l` of new files).
There is no fallback: without a working bwrap, `SandboxUnavailable` is raised.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

INSTALL_HINT = ("install bubblewrap: `apt-get install -y bubblewrap` (Debian/Ubuntu), "
                "`dnf install bubblewrap` (Fedora/RHEL) or `apk add bubblewrap` (Alpine); "
                "non-root users also need unprivileged user namespaces "
                "(`sysctl kernel.unprivileged_userns_clone=1`)")
FIXED_MTIME = 1_704_067_200  # 2024-01-01 UTC: workspaces start with equal timestamps
MAX_COMMAND_BYTES = 65536  # below Linux's 128 KiB limit on one exec argument
SANDBOX_UID = 1000  # uid/gid the command sees (named "user" in the sandbox's /etc/passwd)
PATH_IN_SANDBOX = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Where workspace copies go (default: the temp dir). A tmpfs such as /dev/shm halves the copy
# cost, but a command may then fill RAM (RLIMIT_FSIZE bounds each file, not their number).
WORKSPACE_DIR_ENV = "PIVOTRL_WORKSPACE_DIR"
_HOST_UID_BASE = 200_000  # root mode: throwaway host uids are drawn from [BASE, BASE + SPAN)
_HOST_UID_SPAN = 100_000


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot create its namespaces here."""


@dataclass
class SandboxLimits:
    timeout_s: float = 5.0  # wall clock for the whole command; then every process is killed
    memory_mb: int = 256  # RLIMIT_AS per process (virtual memory)
    max_processes: int = 64  # RLIMIT_NPROC for the sandbox's own uid (bounds fork bombs)
    max_output_bytes: int = 65536  # stdout + stderr; past this the run is killed, truncated=True
    cpu_s: int = 5  # RLIMIT_CPU per process (CPU seconds, a busy loop ends even if it forks)
    max_file_mb: int = 16  # RLIMIT_FSIZE: the largest file a command may write
    max_open_files: int = 256  # RLIMIT_NOFILE
    tmp_mb: int = 64  # size of the fresh /tmp tmpfs


@dataclass
class SandboxResult:
    exit_code: int  # the command's status; 128+N when killed by signal N; -1 when we killed it
    stdout: str
    stderr: str
    timed_out: bool
    truncated: bool


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


# ---------------------------------------------------------------- the skeleton root


_skeleton: Path | None = None
_skeleton_lock = threading.Lock()
_ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "nsswitch.conf", "localtime",
              "alternatives", "magic", "magic.mime", "mime.types", "bash.bashrc", "inputrc")
_TOP_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


def _skeleton_root() -> Path:
    """A read-only root with every mount point in place: mounting onto existing directories
    leaves `/` unmodified, so `ls -la /work` shows the same `..` in every run."""
    global _skeleton
    with _skeleton_lock:
        if _skeleton is not None and _skeleton.is_dir():
            return _skeleton
        # the name changes with the host files copied in, so a stale skeleton is never used
        stamp = hashlib.sha256(repr([(n, _stamp(Path("/etc") / n)) for n in _ETC_FILES])
                               .encode()).hexdigest()[:12]
        root = Path(tempfile.gettempdir()) / f"pivotrl-sandbox-root-{os.getuid()}-v2-{stamp}"
        if not root.is_dir():  # built aside and renamed into place: it exists only when complete
            tmp = Path(tempfile.mkdtemp(prefix=".pivotrl-skel-", dir=root.parent))
            _build_skeleton(tmp)
            try:
                os.rename(tmp, root)
            except OSError:  # another process won the race: use its copy
                shutil.rmtree(tmp, ignore_errors=True)
        _skeleton = root
        return root


def _stamp(path: Path) -> tuple[int, int]:
    try:
        st = path.stat()
        return st.st_mtime_ns, st.st_size
    except OSError:
        return 0, 0


def _build_skeleton(root: Path) -> None:
    os.chmod(root, 0o755)
    for d in ("usr", "etc", "tmp", "proc", "dev", "work"):
        (root / d).mkdir(mode=0o755)
    for d in _TOP_DIRS:
        host = Path("/") / d
        if host.is_symlink():
            os.symlink(os.readlink(host), root / d)
        elif host.is_dir():
            (root / d).mkdir(mode=0o755)
    etc = root / "etc"
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n"
                                f"user:x:{SANDBOX_UID}:{SANDBOX_UID}:user:/work:/bin/bash\n"
                                "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
    (etc / "group").write_text(f"root:x:0:\nuser:x:{SANDBOX_UID}:\nnogroup:x:65534:\n")
    (etc / "hosts").write_text("127.0.0.1 localhost\n::1 localhost\n")
    (etc / "hostname").write_text("sandbox\n")
    for name in _ETC_FILES:  # copied, not bound: a mount per file costs more than the copy
        host = Path("/etc") / name
        if host.is_symlink():
            os.symlink(os.readlink(host), etc / name)
        elif host.is_dir():
            shutil.copytree(host, etc / name, symlinks=True, copy_function=_copy_file)
        elif host.is_file():
            shutil.copy2(host, etc / name)
            os.chmod(etc / name, 0o644)
    for p in [root, *root.rglob("*")]:
        os.utime(p, (FIXED_MTIME, FIXED_MTIME), follow_symlinks=False)


def _bwrap_argv(skeleton: Path, limits: SandboxLimits, nproc: int, workfd: int) -> list[str]:
    argv = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session",
            "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
            "--disable-userns", "--hostname", "sandbox", "--clearenv",
            "--setenv", "PATH", PATH_IN_SANDBOX, "--setenv", "HOME", "/tmp",
            "--setenv", "LANG", "C.UTF-8", "--setenv", "TERM", "dumb", "--setenv", "USER", "user",
            "--ro-bind", str(skeleton), "/", "--ro-bind", "/usr", "/usr"]
    for d in _TOP_DIRS:
        host = Path("/") / d
        if host.is_dir() and not host.is_symlink():
            argv += ["--ro-bind", str(host), f"/{d}"]
    argv += ["--proc", "/proc", "--dev", "/dev",
             "--size", str(limits.tmp_mb * 1024 * 1024), "--tmpfs", "/tmp",
             "--bind-fd", str(workfd), "/work", "--chdir", "/work", "--",
             "prlimit", f"--as={limits.memory_mb * 1024 * 1024}", f"--nproc={nproc}",
             f"--cpu={max(1, int(limits.cpu_s))}", f"--fsize={limits.max_file_mb * 1024 * 1024}",
             f"--nofile={limits.max_open_files}", "--core=0", "--"]
    return argv


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


def _chown_tree(path: Path, uid: int, gid: int) -> None:
    # lchown only: a symlink the command planted must never redirect a chown to a host file.
    os.chown(path, uid, gid, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        for name in dirnames + filenames:
            with contextlib.suppress(OSError):
                os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)


def run_in_sandbox(command: str, workdir: Path | str,
                   limits: SandboxLimits | None = None) -> SandboxResult:
    """Run `bash -c command` in the sandbox with `workdir` mounted (writable) at /work."""
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
    return _run(["bash", "-c", command], Path(workdir), limits or SandboxLimits())


def _traversable(path: Path) -> bool:
    """Whether any user may walk down to `path` (bwrap, running under a throwaway uid, must)."""
    return all(os.stat(p).st_mode & 0o001 for p in path.parents)


def _replace_contents(dst: Path, src: Path) -> None:
    for entry in list(dst.iterdir()):
        if entry.is_dir() and not entry.is_symlink():
            remove_workspace(entry)
        else:
            entry.unlink()
    shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True, copy_function=_copy_file)
    st = os.stat(src)
    os.chmod(dst, st.st_mode & 0o7777)
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))


def _run(cmd: list[str], workdir: Path, limits: SandboxLimits) -> SandboxResult:
    workdir = workdir.resolve()
    if not workdir.is_dir():
        raise FileNotFoundError(f"sandbox workdir {workdir} is not a directory")
    if os.geteuid() == 0 and not _traversable(workdir):
        # e.g. under a 0700 directory: run on a staged copy, then put the result back
        stage = copy_workspace(workdir)
        try:
            return _run(cmd, stage, limits)
        finally:
            try:
                _replace_contents(workdir, stage)
            finally:
                remove_workspace(stage)
    skeleton = _skeleton_root()
    as_root = os.geteuid() == 0
    owner = workdir.stat()
    prefix: list[str] = []
    if as_root:
        uid = _host_uid()
        nproc = limits.max_processes + 4  # outer bwrap, its pid 1, prlimit/bash
        # setpriv, not Popen(user=...): the latter forbids vfork, and forking a process that
        # holds torch costs ~70 ms; setpriv costs one small exec
        prefix = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        _chown_tree(workdir, uid, uid)
    else:
        nproc = _user_process_count(os.getuid()) + limits.max_processes + 4
    workfd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        argv = prefix + _bwrap_argv(skeleton, limits, nproc, workfd) + cmd
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, pass_fds=(workfd,),
                                    start_new_session=True, cwd="/")
        except FileNotFoundError as exc:
            raise SandboxUnavailable(f"{exc.filename or 'bwrap'} not found; {INSTALL_HINT}") \
                from exc
        os.close(workfd)
        workfd = -1
        out, err, timed_out, truncated = _collect(proc, limits)
        code = proc.returncode
    finally:
        if workfd >= 0:
            os.close(workfd)
        if as_root:
            _chown_tree(workdir, owner.st_uid, owner.st_gid)
    if code is None or timed_out or truncated:
        code = -1
    elif code < 0:
        code = 128 - code
    stderr = err.decode("utf-8", "replace")
    if code == 1 and stderr.startswith(("bwrap:", "setpriv:")):  # the sandbox failed to start
        raise SandboxUnavailable(f"bwrap failed: {stderr.strip()}; {INSTALL_HINT}")
    return SandboxResult(code, out.decode("utf-8", "replace"), stderr, timed_out, truncated)


def _collect(proc: subprocess.Popen, limits: SandboxLimits) -> tuple[bytes, bytes, bool, bool]:
    """Read both pipes until EOF, the deadline or the output cap (then kill the sandbox)."""
    deadline = time.monotonic() + limits.timeout_s
    bufs = {proc.stdout: bytearray(), proc.stderr: bytearray()}
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
    return bytes(bufs[proc.stdout]), bytes(bufs[proc.stderr]), timed_out, truncated


def _kill(proc: subprocess.Popen) -> None:
    # bwrap's pid 1 dies with its parent (--die-with-parent), and the pid namespace with it.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


# ---------------------------------------------------------------- workspaces


def _safe_relpath(rel: str) -> PurePosixPath:
    p = PurePosixPath(rel)
    if p.is_absolute() or not p.parts or ".." in p.parts or "\x00" in rel:
        raise ValueError(f"workspace path {rel!r} must be relative and stay inside the workspace")
    return p


def materialize_workspace(files: dict[str, str | None], dest: Path | str) -> Path:
    """Write `{relative path: content}` under `dest` (a path ending in "/" or content None is a
    directory), then set every timestamp to FIXED_MTIME. Raises ValueError on escaping paths."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for rel, content in sorted(files.items()):
        target = dest / _safe_relpath(rel)
        if rel.endswith("/") or content is None:
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(str(content), encoding="utf-8")
    freeze_mtimes(dest)
    return dest


def freeze_mtimes(path: Path | str, when: int = FIXED_MTIME) -> None:
    """Set every timestamp under `path` (without following symlinks) to `when`."""
    path = Path(path)
    for dirpath, dirnames, filenames in os.walk(path, topdown=False, followlinks=False):
        for name in filenames + dirnames:
            with contextlib.suppress(OSError):
                os.utime(os.path.join(dirpath, name), (when, when), follow_symlinks=False)
    os.utime(path, (when, when), follow_symlinks=False)


def copy_workspace(src: Path | str | None) -> Path:
    """A fresh temp directory (under $PIVOTRL_WORKSPACE_DIR if set) holding a copy of `src`
    (symlinks copied as links, fifos recreated, times kept); an empty one when `src` is None.
    The caller removes it (`remove_workspace`), or use `workspace_copy`."""
    dst = Path(tempfile.mkdtemp(prefix="pivotrl-ws-", dir=os.environ.get(WORKSPACE_DIR_ENV)))
    os.chmod(dst, 0o755)
    if src is not None:
        shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True, copy_function=_copy_file)
        st = os.stat(src)
        os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
    return dst


def _copy_file(src: str, dst: str) -> None:
    # Commands can leave fifos/sockets behind: fifos are recreated, other special files skipped.
    import stat as S

    mode = os.lstat(src).st_mode
    if S.S_ISFIFO(mode):
        os.mkfifo(dst, S.S_IMODE(mode))
    elif S.S_ISREG(mode):
        shutil.copy2(src, dst)


def remove_workspace(path: Path | str) -> None:
    def _retry(func, p, _exc):  # a command may have chmod-ed things unwritable
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), 0o755)
            os.chmod(p, 0o755)
            func(p)
    shutil.rmtree(path, onerror=_retry)


@contextlib.contextmanager
def workspace_copy(src: Path | str | None) -> Iterator[Path]:
    """`with workspace_copy(src) as wd:` a throwaway copy of `src`, removed afterwards."""
    dst = copy_workspace(src)
    try:
        yield dst
    finally:
        remove_workspace(dst)


# ---------------------------------------------------------------- comparing trees


def snapshot_dir(path: Path | str, inline_bytes: int = 4096) -> dict[str, str]:
    """`{relative path: description}` of every entry under `path`, never following symlinks and
    never opening anything but regular files. A file is its text when it is UTF-8 and at most
    `inline_bytes` long, else `sha256:<hex>`; executables get a `[+x] ` prefix; directories are
    `<dir>` (keys end in "/"), symlinks `<symlink> target`, anything else `<special>`."""
    root = Path(path)
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel_dir = os.path.relpath(dirpath, root)
        for name in sorted(dirnames + filenames):
            full = os.path.join(dirpath, name)
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            try:
                st = os.lstat(full)
                out.update(_describe(full, rel, st, inline_bytes))
            except OSError as exc:
                out[rel] = f"<unreadable> {exc.strerror}"
    return dict(sorted(out.items()))


def _describe(full: str, rel: str, st: os.stat_result, inline_bytes: int) -> dict[str, str]:
    import stat as S

    if S.S_ISLNK(st.st_mode):
        return {rel: f"<symlink> {os.readlink(full)}"}
    if S.S_ISDIR(st.st_mode):
        return {rel + "/": "<dir>"}
    if not S.S_ISREG(st.st_mode):
        return {rel: "<special>"}
    prefix = "[+x] " if st.st_mode & 0o111 else ""
    fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as fh:
        if st.st_size <= inline_bytes:
            data = fh.read(inline_bytes + 1)
            try:
                return {rel: prefix + data.decode("utf-8")}
            except UnicodeDecodeError:
                return {rel: prefix + "sha256:" + hashlib.sha256(data).hexdigest()}
        h = hashlib.sha256()
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
        return {rel: prefix + "sha256:" + h.hexdigest()}
