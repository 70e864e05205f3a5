"""What a sandboxed command does outside its workspace: files in HOME and /tmp, network attempts.

A command that prints the right output while deleting the user's home (`rm -rf ~`) or sending a
file to a host (`curl -T notes.txt http://...`) must not pass for one that only prints it. The
sandbox neutralises both (HOME is a throwaway, there is no network), so without a record they
would be invisible. Each run therefore records them, from outside the sandbox, where the command
cannot reach the record:

- **HOME and TMPDIR.** Every run gets a fresh side directory on the host (`new_side_dir`): its
  `home/` is bound at /home/user (HOME), seeded with a `.bashrc` and a `.profile` (so deleting or
  editing the home shows), and its `tmp/` at /tmp (TMPDIR). After the run the host snapshots it
  (`side_effects`): every entry created, changed or removed there is an effect, keyed `~/path`
  or `/tmp/path`. Everything else outside /work is read-only to the command, so a write there
  fails (EROFS) and has no effect to record, as on a real machine where an unprivileged user
  cannot write to /usr or /etc.
- **Network.** As root, the sandbox runs in a network namespace made for the run
  (`NETNS_SETUP`): only a loopback device, with a local route for every IPv4 and IPv6 address,
  so a connection to any host or a DNS query (no resolv.conf: glibc asks 127.0.0.1:53) reaches
  that loopback at once and is refused there: nothing can leave the namespace, and nothing
  waits for a timeout. After the command ends, the wrapper outside the sandbox reads the
  namespace's loopback counters (`/proc/net/dev`) and reports them on the start-up pipe, which
  the command cannot write to (it runs with stdin /dev/null, under another user than the
  wrapper). Any packet is a network attempt: `<network>` is an effect. The sandbox has no
  capability to reset those counters. Not as root the namespace is bwrap's own (loopback only,
  no record): `network_recorded()` says which.
Effects are part of a command's outcome: the shell verifier and the terminal world compare
them, so a candidate with an effect the expert did not have scores 0.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from pivotrl.sandbox.workspace import copy_workspace, freeze_mtimes, snapshot_dir

HOME_IN_SANDBOX = "/home/user"
HOME_SEED = {".bashrc": "# ~/.bashrc\nalias ll='ls -l'\n",
             ".profile": "# ~/.profile\n[ -f ~/.bashrc ] && . ~/.bashrc\n"}
NETWORK_EFFECT = "<network>"

# Run by `unshare --net` as root, before the uid switch: the run's own network namespace.
# `ip` infers each route's family from its prefix.
NETNS_SETUP = ("ip -b - <<'EOF' || exit 125\nlink set lo up\nroute add local 0.0.0.0/0 dev lo\n"
               "route add local ::/0 dev lo\nEOF\n")
# After the sandbox exits: the loopback line of /proc/net/dev on the start-up pipe (fd 0).
NETNS_REPORT = ('rc=$?; while IFS= read -r l <&4; do case $l in *lo:*) printf "\\nnet %s\\n" "$l"'
                ' >&0;; esac; done 4< /proc/net/dev; exit $rc')

_recorded: bool | None = None


def network_recorded() -> bool:
    """Whether runs here get their own recorded network namespace (root, unshare and ip)."""
    global _recorded
    if _recorded is None:
        _recorded = (os.geteuid() == 0 and shutil.which("unshare") is not None
                     and shutil.which("ip") is not None)
    return _recorded


def netns_prefix() -> list[str]:
    """argv to put before the (uid switch +) bwrap command: the run in a new recorded netns."""
    if not network_recorded():
        return []
    return ["unshare", "--net", "--", "/bin/sh", "-c", NETNS_SETUP + '"$@"\n' + NETNS_REPORT,
            "sh"]


def network_attempted(report: str) -> bool | None:
    """Whether the loopback counters reported after the run show any packet; None without a
    report (not recorded here, or the run was killed). An unreadable report counts as an
    attempt: it cannot be proven clean."""
    # The last report line: the wrapper writes it after every sandbox process is gone, so a
    # line a command might have forged on the pipe comes before it.
    for line in reversed(report.splitlines()):
        if line.startswith("net "):
            fields = line.split(":", 1)[-1].split()
            try:
                return int(fields[1]) + int(fields[9]) > 0  # rx packets + tx packets
            except (IndexError, ValueError):
                return True
    return None


def new_side_dir(size_mb: int) -> Path:
    """A fresh HOME + TMPDIR pair for one run (the caller removes it with remove_workspace)."""
    side = copy_workspace(None, size_mb)
    (side / "tmp").mkdir(mode=0o755)
    home = side / "home"
    home.mkdir(mode=0o755)
    for name, text in HOME_SEED.items():
        (home / name).write_text(text)
        os.chmod(home / name, 0o644)
    freeze_mtimes(side)
    return side


_seed_snapshot: dict[str, str] | None = None


def side_effects(side: Path) -> dict[str, str | None]:
    """{`~/path` or `/tmp/path`: description, or None when removed} of what the run changed in
    its HOME and TMPDIR (descriptions as `snapshot_dir` writes them)."""
    global _seed_snapshot
    if _seed_snapshot is None:
        _seed_snapshot = _seed()
    now = snapshot_dir(side)
    out: dict[str, str | None] = {}
    for key in sorted(set(now) | set(_seed_snapshot)):
        if now.get(key) != _seed_snapshot.get(key):
            out[_display(key)] = now.get(key)
    return out


def _seed() -> dict[str, str]:
    out = {"home/": "<dir>", "tmp/": "<dir>"}
    out.update({f"home/{n}": t for n, t in HOME_SEED.items()})
    return out


def _display(key: str) -> str:
    top, _, rest = key.partition("/")
    return ("~/" if top == "home" else "/tmp/") + rest if rest or key.endswith("/") else key
