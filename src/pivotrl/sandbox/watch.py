"""Every attempt to change something outside the workspace is seen, whether or not it succeeds.

A command that prints the right answer and then runs `rm -rf /usr`, `dd of=/dev/sda`, deletes
`~/.ssh`, connects to `/var/run/docker.sock` or sends a packet must not be paid like one that only
prints it. The sandbox makes such attempts fail (read-only binds, no devices, no network), and a
failure leaves nothing to compare; so the attempts themselves are recorded.

The mechanism is seccomp user notification, through a small supervisor (`watch.c` next to this
file, compiled once per machine into the sandbox's skeleton root like the clock shim). It runs as
pid 1 of the sandbox (bwrap `--as-pid-1`) and forks the command under a seccomp filter that is
an allow-list: only calls known to change nothing outside the process run unasked (reads,
memory, signals, process control, an open that cannot write, a socket of AF_UNIX, a sendto
without an address, an `ioctl` whose request only reads or acts on the caller's own
descriptors). Every other call asks the supervisor, which fails closed:
- a call on a path (open for writing, unlink, rename, mkdir, link, symlink, chmod, chown,
  truncate, mknod, utime, xattrs, `fchmodat2`, `setxattrat`, `file_setattr`...) or on a
  descriptor (fchmod, fchown, fsetxattr: the object it names is held open): the path is read
  from the caller's memory and resolved for the caller, one name at a time from a directory held
  open: `/proc/self` and `/proc/thread-self` name the caller, /proc's magic links (`cwd`,
  `fd/N`, so `/dev/fd/N` too) are the caller's objects, symlinks are read and followed as the
  kernel would. Where it lands outside the workspace, HOME and scratch, it is recorded (`op<TAB>
  path`) and the kernel then applies the sandbox's own rules (the call fails or succeeds exactly
  as unwatched). Where it lands inside, the supervisor makes the call itself, on what it
  resolved (`emulate`: a new file's descriptor is handed to the caller), so nothing that
  changes after it looked (a symlink flipped under /tmp, the path's memory rewritten by another
  thread, a cwd moved) can make the kernel act elsewhere unrecorded;
- a path it cannot read (memory it may not read: `memfd_secret`, a process made undumpable) or
  resolve (`<unresolved>`) is an attempt;
- a network or socket call (connect, bind, sendto with an address, sendmsg, sendmmsg, a socket of
  any family but AF_UNIX) is recorded with its address;
- any other call outside the allow-list (an unknown `ioctl` such as `FS_IOC_SETFLAGS`, SysV IPC,
  ptrace, mount, a call newer than this list) is an attempt (`other`), whatever it does.
Socket timestamps (`SO_TIMESTAMP*`, the host's real time) are refused outright. It ends with
`done<TAB>status`; a record without it (the supervisor did not finish) is itself an effect. Why
this and not the alternatives:
- an overlay mounted as root before bwrap sees only writes that *succeed*: a write to a
  root-owned file fails with EACCES before it reaches the overlay, and a connect to a missing
  socket leaves no file at all;
- ptrace (strace) sees everything, but stops the traced process at every traced call (slower),
  and needs root to trace across the sandbox's user namespace;
- an LD_PRELOAD wrapper is bypassed by a direct system call or a static binary.
The filter is in the kernel: it is inherited by every process of the command and cannot be
removed; io_uring (which would bypass it) and foreign system-call ABIs are refused. The
supervisor cannot be killed or read from inside: signals to a pid 1 without handlers are
dropped, and it is not dumpable (its /proc files belong to a user the sandbox does not have).
Known limit: a call on a path outside the workspace that the supervisor leaves to the kernel
(the record is written, the kernel refuses) is resolved twice, so a path that changes in between
can be recorded as another outside path than the one refused (still an attempt). An open that
may wait (a FIFO) is made by a helper process of the supervisor, which never blocks itself.

Not recorded, on purpose: writes inside the workspace (its files are compared), in the run's
scratch /tmp and /dev/shm (fresh per run and thrown away), in HOME (its changes are compared
from its snapshot, `pivotrl.sandbox.effects`), and to the harmless devices (/dev/null,
/dev/tty, the caller's own pipes and sockets), all as resolved for the caller: no path is
harmless by its name (a `__pycache__` outside the workspace is an attempt like any other).

`recording()` says whether attempts are recorded here (a C compiler and a kernel with seccomp
user notification, Linux >= 5.6); without it the shell verifier refuses to run unless told to
(`allow_unrecorded_effects`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

WATCH_PATH = "/opt/pivotrl/watch"  # where the skeleton holds it, as the sandbox sees it
WATCH_FD_ENV = "PIVOTRL_WATCH_FD"  # names the record pipe's descriptor to the supervisor
NETWORK_EFFECT = "<network>"
UNFINISHED = "<watch>"  # key of the effect "the supervisor did not report its end"
_SCRATCH = ("/work", "/tmp", "/dev/shm", "/home/user")
# glibc asks nscd (absent) on every user or group lookup (`ls -l`, `id`)
# (paths as the supervisor resolved them for the caller: `/dev/stdout` or `/proc/self/fd/1` is
# the caller's pipe or file, never a name taken on trust)
_HARMLESS = re.compile(r"^(/dev/(null|zero|full|tty|random|urandom|ptmx|pts/ptmx|pts/\d+)"
                       r"|(/var)?/run/nscd/socket"
                       r"|(pipe|socket|anon_inode):\[?[\w-]*\]?)$")
MAX_EFFECTS = 32  # distinct attempts kept per run (the rest counted)

# watch.c includes watch_paths.c; SOURCE (both) names the build in the skeleton's stamp
SOURCES = {name: Path(__file__).with_name(name).read_text(encoding="utf-8")
           for name in ("watch.c", "watch_paths.c")}
SOURCE = "".join(SOURCES.values())


def build_watch(skeleton: Path) -> bool:
    """Compile the supervisor into `skeleton` + WATCH_PATH; False when it cannot be built."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return False
    target = skeleton / WATCH_PATH.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in SOURCES.items():
            (Path(tmp) / name).write_text(text)
        src = Path(tmp) / "watch.c"
        try:
            subprocess.run([cc, "-O2", "-o", str(target), str(src)], check=True,
                           capture_output=True, timeout=120)
        except (OSError, subprocess.SubprocessError):
            target.unlink(missing_ok=True)
            return False
    os.chmod(target, 0o755)
    return True


def watch_built(skeleton: Path) -> bool:
    return (skeleton / WATCH_PATH.lstrip("/")).is_file()


def _unescape(text: str) -> str:
    raw = re.sub(r"\\x([0-9a-f]{2})", lambda m: chr(int(m.group(1), 16)), text)
    return raw.encode("latin-1", "replace").decode("utf-8", "replace")


def _outside(path: str) -> bool:
    if _HARMLESS.match(path):
        return False
    return not any(path == top or path.startswith(top + "/") for top in _SCRATCH)


def attempts(data: bytes) -> dict[str, str | None]:
    """{path or "<network>": "attempted OP"} of the supervisor's records, outside what is not
    recorded on purpose (module docstring); `<watch>` when its end is missing."""
    out: dict[str, str | None] = {}
    more, done = 0, False
    for line in data.decode("utf-8", "replace").splitlines():
        op, _, arg = line.partition("\t")
        if op == "done":
            done = True
            continue
        if op == "more":
            more += int(arg) if arg.isdigit() else 1
            continue
        path = _unescape(arg)
        if path.startswith("<network>"):
            out[NETWORK_EFFECT] = "attempted"
        elif path.startswith("@") or path.startswith("unix:"):
            out[f"unix socket {path}"] = f"attempted {op}"
        elif op in ("system", "other") or _outside(path):
            out[path] = f"attempted {op}"
    if len(out) > MAX_EFFECTS:
        keep = sorted(out)[:MAX_EFFECTS]
        more += len(out) - MAX_EFFECTS
        out = {k: out[k] for k in keep}
    if more:
        out["<more attempts>"] = str(more)
    if not done:
        out[UNFINISHED] = "the supervisor did not report its end"
    return out
