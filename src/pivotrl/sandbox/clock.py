"""A fixed clock inside the sandbox: every command sees the same time, whenever it runs.

Two runs of `date`, `ls -l` or `find -newer` minutes apart must print the same thing, or the
expert's own time-dependent command would not match itself once the clock moved on (the
expert's outcome is cached per turn; candidates run later). Debian's libfaketime does not hold
here: in its absolute mode `ls -l` and `stat` still show the kernel's times of new files (statx
is not intercepted) and bash's `$EPOCHSECONDS` / `printf %(...)T` read the real clock.

So the sandbox's `/etc/ld.so.preload` loads a small shim (C source below, compiled once per
machine with the system C compiler into the skeleton root) into every dynamically linked
program. It makes the wall clock read `FIXED_TIME` (2024-01-01 00:00:00 UTC, the time every
workspace file is stamped with; TZ=UTC in the sandbox) and every file timestamp that a stat
call returns read the same, frozen (time does not advance during a run: two `date` calls in
one command agree). Monotonic clocks, sleeps and timeouts stay real. A verifier's probe runs read
another clock, file time and kernel release (`uname`) from files bound at
`pivotrl.sandbox.environment.ENV_DIR`; the original run has none there and reads these defaults. /etc/ld.so.preload is
read by the dynamic loader whatever the environment says, so `env -i` or `unset LD_PRELOAD`
do not escape it. A direct system call for the wall clock (`clock_gettime(CLOCK_REALTIME)`,
`gettimeofday`, `time`) is refused by the supervisor's filter (`pivotrl.sandbox.watch`). Known
hole: a statically linked program (none in Debian's coreutils, bash, grep, sed, findutils,
python) reads the real clock from the vDSO, which no system call filter sees.

The shim also makes every program's stderr line-buffered, so concurrent writers (the processes
of a pipeline) never splice their messages mid-line; callers that need a deterministic picture
sort the lines (`testbed.terminal.observation`).

Without a C compiler the shim is not built and the clock is real (`clock_status()` says so).

The kernel's own clocks are hidden the same way: `/proc/stat` (boot time), `/proc/uptime` and
`/proc/loadavg` are fixed files bound over the sandbox's procfs (`proc_binds`), so boot time +
uptime never gives the real time and `uptime`, `ps` and `top` read the same numbers in every
run. Processes' start times (`/proc/<pid>/stat`) count from boot: the sandbox gets a time namespace
whose boot clock reads 10 ms when the run starts (`boottime_prefix`; not as root, with a user
namespace of its own), so `ps` shows every process started at the fixed boot time, with no
CPU use over the fixed uptime, in every run. Memory columns (RSS, VSZ) are the processes' own,
not the clock's: they can differ by a page from run to run.

Socket timestamps (`SO_TIMESTAMP*`) would read the host's real time: the supervisor's filter
refuses them (`pivotrl.sandbox.watch`).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

from pivotrl.io.atomic import atomic_path
from pivotrl.sandbox.environment import ENV_DIR
from pivotrl.sandbox.workspace import FIXED_MTIME, workspace_parent

FIXED_TIME = FIXED_MTIME  # 2024-01-01 00:00:00 UTC
SHIM_PATH = "/opt/pivotrl/fixedclock.so"  # where the skeleton holds it, as the sandbox sees it

SHIM_SOURCE = r"""
#define _GNU_SOURCE
#define _LARGEFILE64_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

/* A probe's run reads its own clock and kernel release from files bound at __ENV_DIR__
   (pivotrl.sandbox.environment); the original run has none there and reads the defaults. */
static int env_file(const char *name, char *buf, size_t size) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", "__ENV_DIR__", name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, size - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    return 1;
}
static time_t env_time(const char *name, time_t *cache) {
    char buf[32];
    if (*cache == -1) *cache = env_file(name, buf, sizeof buf) ? (time_t)atoll(buf) : (time_t)__FIXED__;
    return *cache;
}
static time_t now_cache = -1, files_cache = -1;
#define FIXED (env_time("epoch", &now_cache))
#define FILES (env_time("files", &files_cache))  /* every file's timestamps */

#define REAL(ret, name, args) static ret (*real) args; \
    if (!real) real = (ret (*) args)dlsym(RTLD_NEXT, name); \
    if (!real) { errno = ENOSYS; return -1; }
#define FIX_TS(ts) do { (ts).tv_sec = FIXED; (ts).tv_nsec = 0; } while (0)
#define FIX_FT(ts) do { (ts).tv_sec = FILES; (ts).tv_nsec = 0; } while (0)
#define FIX_ST(st) do { FIX_FT((st)->st_atim); FIX_FT((st)->st_mtim); FIX_FT((st)->st_ctim); } while (0)

int uname(struct utsname *u) {
    REAL(int, "uname", (struct utsname *));
    int rc = real(u);
    char buf[sizeof u->release];
    if (rc == 0 && env_file("kernel", buf, sizeof buf) && buf[0]) strcpy(u->release, buf);
    return rc;
}
static int wall(clockid_t c) {
    return c == CLOCK_REALTIME || c == CLOCK_REALTIME_COARSE || c == CLOCK_TAI;
}
int clock_gettime(clockid_t c, struct timespec *ts) {
    if (wall(c)) { if (ts) FIX_TS(*ts); return 0; }
    REAL(int, "clock_gettime", (clockid_t, struct timespec *));
    return real(c, ts);
}
int gettimeofday(struct timeval *tv, void *tz) {
    if (tv) { tv->tv_sec = FIXED; tv->tv_usec = 0; }
    if (tz) memset(tz, 0, 2 * sizeof(int));
    return 0;
}
time_t time(time_t *t) { if (t) *t = FIXED; return FIXED; }
int timespec_get(struct timespec *ts, int base) {
    if (base != TIME_UTC) return 0;
    FIX_TS(*ts); return base;
}

#define STAT1(name, T, A) int name(A a, T *st) { \
    REAL(int, #name, (A, T *)); int rc = real(a, st); if (rc == 0) FIX_ST(st); return rc; }
#define STATAT(name, T) int name(int d, const char *p, T *st, int f) { \
    REAL(int, #name, (int, const char *, T *, int)); \
    int rc = real(d, p, st, f); if (rc == 0) FIX_ST(st); return rc; }
#define XSTAT(name, T, A) int name(int v, A a, T *st) { \
    REAL(int, #name, (int, A, T *)); int rc = real(v, a, st); if (rc == 0) FIX_ST(st); return rc; }
#define XSTATAT(name, T) int name(int v, int d, const char *p, T *st, int f) { \
    REAL(int, #name, (int, int, const char *, T *, int)); \
    int rc = real(v, d, p, st, f); if (rc == 0) FIX_ST(st); return rc; }

STAT1(stat, struct stat, const char *)
STAT1(lstat, struct stat, const char *)
STAT1(fstat, struct stat, int)
STAT1(stat64, struct stat64, const char *)
STAT1(lstat64, struct stat64, const char *)
STAT1(fstat64, struct stat64, int)
STATAT(fstatat, struct stat)
STATAT(fstatat64, struct stat64)
XSTAT(__xstat, struct stat, const char *)
XSTAT(__lxstat, struct stat, const char *)
XSTAT(__fxstat, struct stat, int)
XSTAT(__xstat64, struct stat64, const char *)
XSTAT(__lxstat64, struct stat64, const char *)
XSTAT(__fxstat64, struct stat64, int)
XSTATAT(__fxstatat, struct stat)
XSTATAT(__fxstatat64, struct stat64)

#define FIX_SX(ts) do { (ts).tv_sec = FILES; (ts).tv_nsec = 0; } while (0)
int statx(int d, const char *p, int f, unsigned int mask, struct statx *sx) {
    REAL(int, "statx", (int, const char *, int, unsigned int, struct statx *));
    int rc = real(d, p, f, mask, sx);
    if (rc == 0) { FIX_SX(sx->stx_atime); FIX_SX(sx->stx_btime); FIX_SX(sx->stx_ctime);
                   FIX_SX(sx->stx_mtime); }
    return rc;
}

/* stderr a line at a time (one write per line, as `stdbuf -eL` sets it): the processes of a
   pipeline share one stderr pipe, and unbuffered stdio writes a message in pieces ("cat: ",
   then the rest), so two failing processes would splice their lines mid-line. Whole lines are
   atomic pipe writes; only their order is left to the scheduler. */
__attribute__((constructor)) static void line_buffered_stderr(void) {
    setvbuf(stderr, NULL, _IOLBF, BUFSIZ);
}
"""


def build_shim(skeleton: Path) -> bool:
    """Compile the shim into `skeleton` + SHIM_PATH and list it in the skeleton's
    /etc/ld.so.preload; False (and nothing written) when there is no C compiler or it fails."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return False
    target = skeleton / SHIM_PATH.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "fixedclock.c"
        src.write_text(SHIM_SOURCE.replace("__FIXED__", str(FIXED_TIME))
                       .replace("__ENV_DIR__", ENV_DIR))
        try:
            subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(target), str(src), "-ldl"],
                           check=True, capture_output=True, timeout=120)
        except (OSError, subprocess.SubprocessError):
            target.unlink(missing_ok=True)
            return False
    os.chmod(target, 0o755)
    (skeleton / "etc" / "ld.so.preload").write_text(SHIM_PATH + "\n")
    return True


PROC_DIR = "/opt/pivotrl/proc"  # the fixed /proc files, as the sandbox sees the skeleton
UPTIME_S = 86_400  # the uptime every run reads: booted one day before the fixed time
PROC_FILES = {
    "stat": "cpu  0 0 0 0 0 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\nintr 0\nctxt 0\n"
            f"btime {FIXED_TIME - UPTIME_S}\nprocesses 1\nprocs_running 1\nprocs_blocked 0\n"
            "softirq 0\n",
    "uptime": f"{UPTIME_S}.00 {UPTIME_S}.00\n",
    "loadavg": "0.00 0.00 0.00 1/1 1\n",
}


def build_proc_files(skeleton: Path) -> None:
    target = skeleton / PROC_DIR.lstrip("/")
    target.mkdir(parents=True, exist_ok=True)
    for name, text in PROC_FILES.items():
        (target / name).write_text(text)
        os.chmod(target / name, 0o444)


def proc_binds(skeleton: Path, side: Path | None = None) -> list[str]:
    """bwrap arguments binding the fixed files over the new procfs. With `side` (a directory of
    the run's own, used where the boot clock cannot be set, `boottime_prefix` == []) the boot
    time in /proc/stat is a random one of this run instead: processes' start times then count
    from the host's real boot clock, and a command that shows them (`ps`) must read
    differently in every run, so the shell verifier finds its turn irreproducible
    (unverifiable) rather than guess from two runs that happened in the same second."""
    out = []
    for name in PROC_FILES:
        host = skeleton / PROC_DIR.lstrip("/") / name
        if side is not None and name == "stat":
            host = side / "proc-stat"
            btime = FIXED_TIME - UPTIME_S - 1 - secrets.randbelow(10**6)
            host.write_text(PROC_FILES["stat"].replace(f"btime {FIXED_TIME - UPTIME_S}\n",
                                                       f"btime {btime}\n"))
        out += ["--ro-bind", str(host), f"/proc/{name}"]
    return out


# Starts COMMAND in a new time namespace whose boot clock reads 10 ms: every process of a run
# (which takes well under a second to start them) then starts in second 0 of the fixed boot.
# The offset takes nanoseconds (`unshare --boottime` takes whole seconds, so the clock's
# sub-second part would decide between two start seconds). Not as root the namespace comes
# with a user namespace of its own that maps the caller's ids to themselves.
TIMENS_SOURCE = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int put(const char *file, const char *text) {
    int fd = open(file, O_WRONLY | O_CLOEXEC);
    int ok = fd >= 0 && write(fd, text, strlen(text)) == (ssize_t)strlen(text);
    if (fd >= 0) close(fd);
    return ok ? 0 : -1;
}

int main(int argc, char **argv) {
    char text[64];
    unsigned uid = getuid(), gid = getgid();
    if (argc < 2) return 125;
    if (unshare(CLONE_NEWTIME | (uid ? CLONE_NEWUSER : 0)) < 0) { perror("timens: unshare"); return 125; }
    if (uid) {
        snprintf(text, sizeof text, "%u %u 1\n", uid, uid);
        if (put("/proc/self/setgroups", "deny") < 0 || put("/proc/self/uid_map", text) < 0) return 125;
        snprintf(text, sizeof text, "%u %u 1\n", gid, gid);
        if (put("/proc/self/gid_map", text) < 0) return 125;
    }
    struct timespec now;
    clock_gettime(CLOCK_BOOTTIME, &now);
    long long off = -((long long)now.tv_sec * 1000000000LL + now.tv_nsec) + 10000000LL;
    long long sec = off / 1000000000LL, nsec = off % 1000000000LL;
    if (nsec < 0) { nsec += 1000000000LL; sec -= 1; }
    snprintf(text, sizeof text, "boottime %lld %lld\n", sec, nsec);
    if (put("/proc/self/timens_offsets", text) < 0) { perror("timens: offsets"); return 125; }
    execvp(argv[1], argv + 1);
    perror("timens: exec");
    return 127;
}
"""
_timens: str | None = None


def _timens_helper() -> str:
    """The helper above, compiled once per machine and user ("" without a C compiler)."""
    global _timens
    if _timens is None:
        _timens = ""
        cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
        stamp = hashlib.sha256(TIMENS_SOURCE.encode()).hexdigest()[:12]
        target = Path(workspace_parent()) / f"pivotrl-timens-{os.getuid()}-{stamp}"
        if target.is_file():
            _timens = str(target)
        elif cc is not None:
            with tempfile.TemporaryDirectory() as tmp:
                src = Path(tmp) / "timens.c"
                src.write_text(TIMENS_SOURCE)
                try:
                    with atomic_path(target) as out:  # whole or absent, whoever builds it
                        subprocess.run([cc, "-O2", "-o", str(out), str(src)], check=True,
                                       capture_output=True, timeout=120)
                        os.chmod(out, 0o755)
                    _timens = str(target)
                except (OSError, subprocess.SubprocessError):
                    pass
    return _timens


_timens_works: bool | None = None


def boottime_prefix() -> list[str]:
    """A command prefix that starts the sandbox in a time namespace whose boot clock starts at
    the run, so processes' start times read the same in every run (module docstring); [] where
    that cannot be done here (no C compiler, or the kernel refuses the namespaces)."""
    global _timens_works
    helper = _timens_helper()
    if not helper:
        return []
    if _timens_works is None:
        try:
            _timens_works = subprocess.run([helper, "true"], capture_output=True,
                                           timeout=30).returncode == 0
        except (OSError, subprocess.SubprocessError):
            _timens_works = False
    return [helper] if _timens_works else []


def shim_built(skeleton: Path) -> bool:
    return (skeleton / "etc" / "ld.so.preload").is_file()
