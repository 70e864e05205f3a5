"""What a sandboxed command does outside its workspace: files in HOME and /tmp, network attempts.

A command that prints the right output while deleting the user's home (`rm -rf ~`) or sending a
file to a host (`curl -T notes.txt http://...`) must not pass for one that only prints it. The
sandbox neutralises both (HOME is a throwaway, there is no network), so without a record they
would be invisible. Each run therefore records them, from outside the sandbox, where the command
cannot reach the record:

- **HOME.** Every run gets a fresh side directory on the host (`new_side_dir`): its `home/` is
  bound at /home/user (HOME), seeded with start-up files and an `~/.ssh` (`HOME_SEED`, so
  deleting or editing the home shows), its `tmp/` at /tmp (TMPDIR) and its `shm/` at /dev/shm.
  After the run the host snapshots HOME (`side_effects`): every entry created, changed or
  removed there is an effect, keyed `~/path`. /tmp and /dev/shm are scratch: fresh per run and
  thrown away with it, so what a command leaves there is no effect (a command that sorts
  through a temporary file does what one that sorts in a pipe does).
- **Attempts elsewhere.** Everything else outside /work is read-only to the command, so a
  write there fails; the attempt itself is recorded by the sandbox's supervisor
  (`pivotrl.sandbox.watch`), whether or not it succeeds.
- **Network.** As root, each run enters a network namespace of a small pool kept by this
  process (`acquire_netns`): only a loopback device, with a local route for every IPv4 and
  IPv6 address, so a connection to any host or a DNS query (no resolv.conf: glibc asks
  127.0.0.1:53) reaches that loopback at once and is refused there: nothing can leave the
  namespace, and nothing waits for a timeout. A namespace serves one run at a time; the host
  reads its loopback counters (`/proc/<holder>/net/dev`) before and after the run, and any
  packet in between is a network attempt (`<network>` is an effect). The command cannot reset
  them: the namespace belongs to the host's user namespace, where the sandbox has no
  capability. Each namespace is held by a `sh` reading a pipe from this process, so it ends
  with the process. Not as root the namespace is bwrap's own (loopback only, no record):
  `network_recorded()` says which.
Effects are part of a command's outcome: the shell verifier and the terminal world compare
them, so a candidate with an effect the expert did not have scores 0.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import threading
from pathlib import Path

from pivotrl.sandbox.workspace import copy_workspace, freeze_mtimes, snapshot_dir

HOME_IN_SANDBOX = "/home/user"
# What a user's home holds that a command must not touch (so deleting or editing it shows):
# shell start-up files and an SSH directory (fake keys).
HOME_SEED = {".bashrc": "# ~/.bashrc\nalias ll='ls -l'\n",
             ".profile": "# ~/.profile\n[ -f ~/.bashrc ] && . ~/.bashrc\n",
             ".ssh/authorized_keys": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTheSandbox user\n",
             ".ssh/id_ed25519.pub": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTheSandbox user\n",
             ".ssh/known_hosts": "example.org ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeHost\n"}
NETWORK_EFFECT = "<network>"

# The holder of a pooled namespace: set it up, say so, then wait for the pipe from this process
# to close. `ip` infers each route's family from its prefix.
_HOLDER = ("ip -b - <<'EOF' || exit 125\nlink set lo up\nroute add local 0.0.0.0/0 dev lo\n"
           "route add local ::/0 dev lo\nEOF\necho ready; read x")
_PATH_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}

_recorded: bool | None = None


def network_recorded() -> bool:
    """Whether runs here get a recorded network namespace (root, unshare, nsenter and ip)."""
    global _recorded
    if _recorded is None:
        _recorded = (os.geteuid() == 0
                     and all(shutil.which(b) for b in ("unshare", "nsenter", "ip")))
    return _recorded


class Netns:
    """One recorded network namespace, held by a `sh` in it."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(["unshare", "--net", "--", "/bin/sh", "-c", _HOLDER],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, start_new_session=True,
                                     env=_PATH_ENV, cwd="/")
        if self.proc.stdout.readline() != b"ready\n":
            self.close()
            raise OSError("could not set up a network namespace for the sandbox")
        self.owner = os.getpid()
        self.path = f"/proc/{self.proc.pid}/ns/net"
        self.inode = os.stat(self.path).st_ino

    def prefix(self) -> list[str]:
        return ["nsenter", f"--net={self.path}", "--"]

    def packets(self) -> int | None:
        """Loopback packets so far (received + sent); None when the holder is gone (its pid
        may name another process now: never read that one's counters)."""
        try:
            if os.stat(self.path).st_ino != self.inode:
                return None
            with open(f"/proc/{self.proc.pid}/net/dev", encoding="ascii") as fh:
                for line in fh:
                    name, _, rest = line.partition(":")
                    if name.strip() == "lo":
                        fields = rest.split()
                        return int(fields[1]) + int(fields[9])
        except (OSError, ValueError, IndexError):
            return None
        return None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)


_pool: list[Netns] = []
_pool_lock = threading.Lock()
_pool_pid = os.getpid()


def acquire_netns() -> Netns | None:
    """A free recorded namespace (made when none is free), or None where runs are not recorded.
    A forked child never uses its parent's namespaces: two runs at once in one namespace would
    mix their counts."""
    global _pool_pid
    if not network_recorded():
        return None
    with _pool_lock:
        if _pool_pid != os.getpid():
            _pool.clear()  # the parent's: it closes them
            _pool_pid = os.getpid()
        if _pool:
            return _pool.pop()
    return Netns()


def release_netns(ns: Netns | None, healthy: bool) -> None:
    if ns is None:
        return
    if not healthy or ns.owner != os.getpid():
        ns.close()
        return
    with _pool_lock:
        _pool.append(ns)


@atexit.register
def _close_pool() -> None:
    with _pool_lock:
        while _pool:
            _pool.pop().close()


def new_side_dir(size_mb: int) -> Path:
    """A fresh HOME + TMPDIR pair for one run (the caller removes it with remove_workspace)."""
    side = copy_workspace(None, size_mb)
    (side / "tmp").mkdir(mode=0o755)
    (side / "shm").mkdir(mode=0o755)
    home = side / "home"
    home.mkdir(mode=0o755)
    for name, text in HOME_SEED.items():
        (home / name).parent.mkdir(mode=0o700, exist_ok=True)
        (home / name).write_text(text)
        os.chmod(home / name, 0o644)
    freeze_mtimes(side)
    return side


_seed_snapshot: dict[str, str] | None = None


def side_effects(side: Path) -> dict[str, str | None]:
    """{`~/path`: description, or None when removed} of what the run changed in its HOME
    (descriptions as `snapshot_dir` writes them); /tmp and /dev/shm are scratch."""
    global _seed_snapshot
    if _seed_snapshot is None:
        _seed_snapshot = _seed()
    now = {k: v for k, v in snapshot_dir(side).items() if k.startswith("home/")}
    out: dict[str, str | None] = {}
    for key in sorted(set(now) | set(_seed_snapshot)):
        if now.get(key) != _seed_snapshot.get(key):
            out[_display(key)] = now.get(key)
    return out


def _seed() -> dict[str, str]:
    out = {"home/": "<dir>"}
    out.update({f"home/{n}": t for n, t in HOME_SEED.items()})
    out.update({f"home/{n.rsplit('/', 1)[0]}/": "<dir 0700>" for n in HOME_SEED if "/" in n})
    return out


_SHOWN_AS = {"home": "~/", "tmp": "/tmp/", "shm": "/dev/shm/"}


def _display(key: str) -> str:
    top, _, rest = key.partition("/")
    return _SHOWN_AS.get(top, f"{top}/") + rest if rest or key.endswith("/") else key
