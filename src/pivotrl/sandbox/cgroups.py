"""A cgroup per sandbox run: one memory and one process budget for the whole sandbox.

rlimits bound each process (RLIMIT_AS) or each uid (RLIMIT_NPROC); only a cgroup bounds the sum
over every process of one sandbox, page cache and tmpfs pages it writes included. The cgroup is
made as a child of the cgroup this process is in:
- cgroup v2: when that cgroup is writable and its `cgroup.subtree_control` enables `memory` and
  `pids` (a delegated subtree, e.g. a systemd unit with Delegate=yes): memory.max,
  memory.swap.max = 0, pids.max.
- cgroup v1: when the `memory` and `pids` hierarchies are mounted and writable (root):
  memory.limit_in_bytes (and memory.memsw.limit_in_bytes, so swap does not extend it), pids.max.
When neither works, `create` returns None and the caller falls back to rlimits alone.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

_PREFIX = "pivotrl-sbx"
_counter = itertools.count()
_layout: tuple[str, list[Path]] | None = None  # ("v2" | "v1" | "", parent cgroup dirs)
_layout_lock = threading.Lock()


def _mounts() -> dict[str, Path]:
    """{"v2": mount point, "memory": v1 mount point, "pids": ...} from /proc/self/mountinfo."""
    found: dict[str, Path] = {}
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            fstype, _source, *opts = right.split()
            point = Path(left.split()[4])
            if fstype == "cgroup2":
                found.setdefault("v2", point)
            elif fstype == "cgroup" and opts:
                for ctl in opts[0].split(","):
                    found.setdefault(ctl, point)
    return found


def _own_paths() -> dict[str, str]:
    """{"v2": path, "memory": path, "pids": path} of this process, from /proc/self/cgroup."""
    paths: dict[str, str] = {}
    with open("/proc/self/cgroup", encoding="utf-8") as fh:
        for line in fh:
            _, ctls, path = line.rstrip("\n").split(":", 2)
            if ctls == "":
                paths["v2"] = path
            for ctl in ctls.split(","):
                paths[ctl] = path
    return paths


def _discover() -> tuple[str, list[Path]]:
    try:
        mounts, own = _mounts(), _own_paths()
    except (OSError, ValueError):
        return "", []
    if "v2" in mounts and "v2" in own:
        parent = mounts["v2"] / own["v2"].lstrip("/")
        try:
            enabled = (parent / "cgroup.subtree_control").read_text().split()
        except OSError:
            enabled = []
        if {"memory", "pids"} <= set(enabled) and os.access(parent, os.W_OK):
            return "v2", [parent]
    if all(c in mounts and c in own for c in ("memory", "pids")):
        parents = [mounts[c] / own[c].lstrip("/") for c in ("memory", "pids")]
        if all(os.access(p, os.W_OK) for p in parents):
            return "v1", parents
    return "", []


def layout() -> str:
    """"v2", "v1", or "" when no cgroup can be made here (checked once per process)."""
    global _layout
    with _layout_lock:
        if _layout is None:
            _layout = _discover()
            _remove_stale(_layout[1])
        return _layout[0]


def _remove_stale(parents: list[Path]) -> None:
    # cgroups left by a killed process: empty ones are removed, busy ones rmdir refuses
    for parent in parents:
        with contextlib.suppress(OSError):
            for child in parent.glob(f"{_PREFIX}-*"):
                pid = child.name.split("-")[2]
                if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                    with contextlib.suppress(OSError):
                        child.rmdir()


@dataclass
class SandboxCgroup:
    version: str
    dirs: list[Path]

    @property
    def procs_files(self) -> list[str]:
        """Files a process writes its pid to, to join (every hierarchy of v1)."""
        return [str(d / "cgroup.procs") for d in self.dirs]

    @classmethod
    def create(cls, memory_bytes: int, max_pids: int) -> SandboxCgroup | None:
        """A new cgroup with these limits, or None where none can be made."""
        version = layout()
        if not version:
            return None
        name = f"{_PREFIX}-{os.getpid()}-{next(_counter)}"
        group = cls(version, [])
        try:
            for parent in _layout[1]:  # type: ignore[index]
                (parent / name).mkdir()
                group.dirs.append(parent / name)
            if version == "v2":
                d = group.dirs[0]
                _write(d / "memory.max", memory_bytes)
                _write(d / "pids.max", max_pids)
                with contextlib.suppress(OSError):  # absent without swap accounting
                    _write(d / "memory.swap.max", 0)
            else:
                mem, pids = group.dirs
                _write(mem / "memory.limit_in_bytes", memory_bytes)
                with contextlib.suppress(OSError):  # absent without swap accounting
                    _write(mem / "memory.memsw.limit_in_bytes", memory_bytes)
                _write(pids / "pids.max", max_pids)
        except OSError:
            group.destroy()
            return None
        return group

    def release(self) -> None:
        """Remove the cgroup now if it is empty, else in a background thread (the sandbox's
        processes die with its pid namespace a few milliseconds after bwrap exits; waiting for
        them would add that to every run)."""
        if not self._try_rmdir():
            threading.Thread(target=self.destroy, daemon=True).start()

    def _try_rmdir(self, kill: bool = False) -> bool:
        """Remove every empty cgroup dir; with `kill`, signal the members of those that are not."""
        left = []
        for d in self.dirs:
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                left.append(d)
                if kill:
                    _kill_members(d)
        self.dirs = left
        return not left

    def destroy(self) -> None:
        """Kill whatever is left in the cgroup and remove it."""
        for d in self.dirs:
            if self.version == "v2":
                with contextlib.suppress(OSError):
                    _write(d / "cgroup.kill", 1)
        for _ in range(50):
            if self._try_rmdir(kill=True):
                return
            time.sleep(0.01)


def _kill_members(d: Path) -> None:
    with contextlib.suppress(OSError):
        for pid in (d / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                os.kill(int(pid), signal.SIGKILL)


def _write(path: Path, value: int) -> None:
    with open(path, "w", encoding="ascii") as fh:
        fh.write(str(value))
