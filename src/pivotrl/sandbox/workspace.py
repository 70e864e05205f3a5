"""Workspaces of the sandbox: make, copy, snapshot and remove file trees on the host side.

Every walk here is iterative (an explicit stack, never recursion), because a command may leave a
tree thousands of levels deep; and every walk uses lstat and never follows a symlink, because a
command may plant links to host files.

Disk quota: when we are root and the kernel has the new mount API (Linux >= 5.2), a workspace
made by `copy_workspace` is its own tmpfs of `disk_mb` MiB (and `WORKSPACE_INODES` inodes),
mounted on its temp directory: a command that fills it gets ENOSPC, and removing it is one lazy
unmount, whatever the depth or the permissions left inside. Otherwise a workspace is a plain
directory and a command's writes are bounded only per file (RLIMIT_FSIZE) and by the timeout.

Where workspaces go (`workspace_parent`): $PIVOTRL_WORKSPACE_DIR, else the temp dir. As root the
sandbox runs under a throwaway uid that must walk down to its workspace, so a parent any user
cannot traverse (a 0700 folder, what `mktemp -d` makes, or anything under root's home) is
replaced by the first traversable one of /tmp, /var/tmp and /dev/shm, with one warning that
names both: each workspace there is its own tmpfs, so the choice costs no disk.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shutil
import stat as S
import tempfile
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

FIXED_MTIME = 1_704_067_200  # 2024-01-01 UTC: workspaces start with equal timestamps
# Where workspace directories go (default: the temp dir).
WORKSPACE_DIR_ENV = "PIVOTRL_WORKSPACE_DIR"
DEFAULT_DISK_MB = 64  # tmpfs size of a workspace (a limit: only written pages use memory)
WORKSPACE_INODES = 65_536  # files + directories a workspace may hold (each costs kernel memory)
FILE_MODE, EXEC_MODE, DIR_MODE = 0o644, 0o755, 0o755  # modes materialize_workspace sets

_quota_mounts: set[str] = set()  # workspaces that are our own tmpfs mounts
_FALLBACK_PARENTS = ("/tmp", "/var/tmp", "/dev/shm")


class WorkspaceVanished(RuntimeError):
    """A workspace was removed from outside while in use (e.g. by a temp cleaner): an error of
    the run, never a verdict on an action."""


def traversable(path: Path | str) -> bool:
    """Whether any user may walk down to `path`: every directory on the way is o+x."""
    path = Path(path).resolve()
    try:
        return all(os.stat(p).st_mode & 0o001 for p in (path, *path.parents))
    except OSError:
        return False


_parent: tuple[str, str] | None = None  # (configured, chosen)


def workspace_parent() -> str:
    """The directory workspaces (and the sandbox's skeleton root) are made in (module
    docstring)."""
    global _parent
    configured = os.environ.get(WORKSPACE_DIR_ENV) or tempfile.gettempdir()
    if _parent is not None and _parent[0] == configured:
        return _parent[1]
    chosen = configured
    if os.geteuid() == 0 and not traversable(configured):
        chosen = next((p for p in _FALLBACK_PARENTS if os.path.isdir(p) and traversable(p)), "")
        if not chosen:
            raise OSError(f"the sandbox's uid cannot reach {configured} (not o+x all the way) "
                          f"and none of {', '.join(_FALLBACK_PARENTS)} is traversable; set "
                          f"{WORKSPACE_DIR_ENV} to a directory every user can traverse")
        warnings.warn(f"workspaces go to {chosen}: the sandbox's uid cannot reach {configured} "
                      f"(not o+x all the way; set {WORKSPACE_DIR_ENV} to choose)", stacklevel=2)
    _parent = (configured, chosen)
    return chosen
_quota_lock = threading.Lock()


# ---------------------------------------------------------------- size-limited tmpfs mounts


_libc = None
_quota_supported: bool | None = None


def _syscall(*args) -> int:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    return _libc.syscall(*args)


# The new mount API has the same syscall numbers on every architecture (added after 5.0).
_FSOPEN, _FSCONFIG, _FSMOUNT, _MOVE_MOUNT = 430, 431, 432, 429
_FSCONFIG_SET_STRING, _FSCONFIG_CMD_CREATE = 1, 6
_MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV = 0x2, 0x4
_MOVE_MOUNT_F_EMPTY_PATH, _AT_FDCWD, _MNT_DETACH = 0x4, -100, 2


def _mount_tmpfs(path: Path, size_bytes: int) -> bool:
    """Mount a fresh tmpfs of `size_bytes` on `path` (root only); False when it cannot be done."""
    global _quota_supported
    if os.geteuid() != 0 or _quota_supported is False:
        return False
    ok = _mount_tmpfs_at(path, size_bytes)
    if _quota_supported is None:  # the first try decides for this process
        _quota_supported = ok
        if ok:
            _remove_stale_mounts()
    return ok


def _mount_tmpfs_at(path: Path, size_bytes: int) -> bool:
    fs = _syscall(_FSOPEN, b"tmpfs", 1)  # FSOPEN_CLOEXEC
    if fs < 0:
        return False
    try:
        opts = {b"size": str(size_bytes).encode(), b"nr_inodes": str(WORKSPACE_INODES).encode(),
                b"mode": b"0755"}
        for key, val in opts.items():
            if _syscall(_FSCONFIG, fs, _FSCONFIG_SET_STRING, key, val, 0) < 0:
                return False
        if _syscall(_FSCONFIG, fs, _FSCONFIG_CMD_CREATE, None, None, 0) < 0:
            return False
        mnt = _syscall(_FSMOUNT, fs, 1, _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV)  # FSMOUNT_CLOEXEC
        if mnt < 0:
            return False
        try:
            return _syscall(_MOVE_MOUNT, mnt, b"", _AT_FDCWD, os.fsencode(path),
                            _MOVE_MOUNT_F_EMPTY_PATH) == 0
        finally:
            os.close(mnt)
    finally:
        os.close(fs)


def _remove_stale_mounts() -> None:
    """Unmount workspaces of processes that died before removing them (the pid is in the
    name); a live process's workspaces are left alone."""
    points: list[str] = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo", encoding="utf-8") as fh:
        points = [line.split()[4] for line in fh]
    for point in points:
        name = os.path.basename(point)
        pid = name.split("-")[2] if name.startswith("pivotrl-ws-") else ""
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            if _libc.umount2(os.fsencode(point), _MNT_DETACH) == 0:
                with contextlib.suppress(OSError):
                    remove_tree(point)


def disk_quota_available() -> bool:
    """Whether `copy_workspace` gives each workspace its own size-limited tmpfs here."""
    if _quota_supported is None:
        with contextlib.suppress(OSError):
            remove_workspace(copy_workspace(None))
    return bool(_quota_supported)


def is_quota_workspace(path: Path | str) -> bool:
    with _quota_lock:
        return str(Path(path)) in _quota_mounts


# ---------------------------------------------------------------- walking


def iter_tree(root: Path | str) -> Iterator[tuple[str, str, os.stat_result | OSError]]:
    """(relative path, full path, lstat or the error) of every entry under `root`, parents
    before children; iterative, never follows symlinks. A directory that cannot be listed
    is yielded, then its error as its own `(rel, full, OSError)` under the same key."""
    root = str(root)
    stack = [("", root)]
    while stack:
        rel_dir, full_dir = stack.pop()
        try:
            with os.scandir(full_dir) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            if rel_dir:
                yield rel_dir, full_dir, exc
            continue
        subdirs = []
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as exc:
                yield rel, entry.path, exc
                continue
            yield rel, entry.path, st
            if S.S_ISDIR(st.st_mode):
                subdirs.append((rel, entry.path))
        stack.extend(reversed(subdirs))


def chown_tree(path: Path | str, uid: int, gid: int) -> None:
    # lchown only: a symlink the command planted must never redirect a chown to a host file.
    os.chown(path, uid, gid, follow_symlinks=False)
    for _, full, st in iter_tree(path):
        if not isinstance(st, OSError):
            with contextlib.suppress(OSError):
                os.chown(full, uid, gid, follow_symlinks=False)


def freeze_mtimes(path: Path | str, when: int = FIXED_MTIME) -> None:
    """Set every timestamp under `path` (without following symlinks) to `when`."""
    for _, full, st in iter_tree(path):
        if not isinstance(st, OSError):
            with contextlib.suppress(OSError):
                os.utime(full, (when, when), follow_symlinks=False)
    os.utime(path, (when, when), follow_symlinks=False)


def rename_entries(root: Path | str, new_name) -> None:
    """Rename entries under `root` in place: `new_name(name, index)` (index: the entry's place
    among its directory's files, then directories, each sorted) gives the new name, or None to
    keep it. Deepest directories first, so a directory's entries are renamed before it is;
    never follows a symlink; an entry that cannot be renamed is left as it is."""
    for dirpath, dirs, files in sorted(os.walk(root, followlinks=False), reverse=True):
        for i, name in enumerate(sorted(files) + sorted(dirs)):
            new = new_name(name, i)
            if new is not None and new != name:
                with contextlib.suppress(OSError):
                    os.rename(os.path.join(dirpath, name), os.path.join(dirpath, new))


# ---------------------------------------------------------------- making and copying


def _safe_relpath(rel: str) -> PurePosixPath:
    p = PurePosixPath(rel)
    if p.is_absolute() or not p.parts or ".." in p.parts or "\x00" in rel:
        raise ValueError(f"workspace path {rel!r} must be relative and stay inside the workspace")
    return p


def materialize_workspace(files: dict[str, str | None], dest: Path | str) -> Path:
    """Write `{relative path: content}` under `dest` (a path ending in "/" or content None is a
    directory) with modes 0644 / 0755 whatever the umask, then set every timestamp to
    FIXED_MTIME. Raises ValueError on escaping paths."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for rel, content in sorted(files.items()):
        target = dest / _safe_relpath(rel)
        if rel.endswith("/") or content is None:
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(str(content), encoding="utf-8")
            os.chmod(target, FILE_MODE)
    for _, full, st in iter_tree(dest):
        if not isinstance(st, OSError) and S.S_ISDIR(st.st_mode):
            os.chmod(full, DIR_MODE)
    freeze_mtimes(dest)
    return dest


def copy_tree(src: Path | str, dst: Path | str) -> None:
    """Copy the contents of `src` into the existing directory `dst`: symlinks as links, fifos
    recreated, other special files skipped; modes and times kept. Iterative."""
    src, dst = str(src), str(dst)
    dirs: list[tuple[str, os.stat_result]] = []
    for rel, full, st in iter_tree(src):
        if isinstance(st, OSError):
            raise st
        target = os.path.join(dst, rel)
        if S.S_ISDIR(st.st_mode):
            os.mkdir(target, 0o700)
            dirs.append((target, st))
        elif S.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(full), target)
        elif S.S_ISREG(st.st_mode):
            shutil.copy2(full, target, follow_symlinks=False)
        elif S.S_ISFIFO(st.st_mode):
            os.mkfifo(target, S.S_IMODE(st.st_mode))
    # directories last, deepest first: writing into a directory changes its mtime
    for target, st in reversed(dirs):
        os.chmod(target, S.S_IMODE(st.st_mode))
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    st = os.stat(src)
    os.chmod(dst, S.S_IMODE(st.st_mode))
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))


def copy_workspace(src: Path | str | None, disk_mb: int = DEFAULT_DISK_MB) -> Path:
    """A fresh temp directory (under $PIVOTRL_WORKSPACE_DIR if set) holding a copy of `src`
    (see `copy_tree`); an empty one when `src` is None. As root it is a tmpfs of `disk_mb` MiB
    (module docstring). The caller removes it (`remove_workspace`), or use `workspace_copy`."""
    dst = Path(tempfile.mkdtemp(prefix=f"pivotrl-ws-{os.getpid()}-", dir=workspace_parent()))
    os.chmod(dst, 0o755)
    if _mount_tmpfs(dst, disk_mb * 1024 * 1024):
        with _quota_lock:
            _quota_mounts.add(str(dst))
    try:
        if src is not None:
            copy_tree(src, dst)
    except BaseException:
        remove_workspace(dst)
        raise
    return dst


def remove_workspace(path: Path | str) -> None:
    """Remove a workspace, whatever a command left in it (any depth, any permissions)."""
    path = str(Path(path))
    with _quota_lock:
        mounted = path in _quota_mounts
        _quota_mounts.discard(path)
    if mounted:
        _libc.umount2(os.fsencode(path), _MNT_DETACH)
    remove_tree(path)


def remove_tree(path: Path | str) -> None:
    """Delete a tree without recursion and without long paths: each subdirectory's children
    are moved up into the top directory (rename between directory fds) until it is flat."""
    try:
        if not S.S_ISDIR(os.lstat(path).st_mode):
            os.unlink(path)
            return
    except FileNotFoundError:
        return
    with contextlib.suppress(OSError):  # a command may have chmod-ed it 000
        os.chmod(path, 0o700)
    top = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    counter = 0
    try:
        while names := os.listdir(top):
            for name in names:
                if not _is_dir(name, top):
                    os.unlink(name, dir_fd=top)
                    continue
                with contextlib.suppress(OSError):  # a command may have chmod-ed it 000
                    os.chmod(name, 0o700, dir_fd=top)
                sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=top)
                try:
                    for child in os.listdir(sub):
                        if not _is_dir(child, sub):
                            os.unlink(child, dir_fd=sub)
                            continue
                        with contextlib.suppress(OSError):
                            os.chmod(child, 0o700, dir_fd=sub)
                        counter = _move_up(child, sub, top, counter)
                finally:
                    os.close(sub)
                os.rmdir(name, dir_fd=top)
    finally:
        os.close(top)
    os.rmdir(path)


def _is_dir(name: str, dir_fd: int) -> bool:
    return S.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)


def _move_up(name: str, src_fd: int, top_fd: int, counter: int) -> int:
    while True:  # a free name in the top directory (the command chose the existing ones)
        counter += 1
        try:
            os.rename(name, f".pivotrl-rm-{counter}", src_dir_fd=src_fd, dst_dir_fd=top_fd)
            return counter
        except OSError as exc:
            if exc.errno not in (17, 39):  # EEXIST, ENOTEMPTY
                raise


@contextlib.contextmanager
def workspace_copy(src: Path | str | None, disk_mb: int = DEFAULT_DISK_MB) -> Iterator[Path]:
    """`with workspace_copy(src) as wd:` a throwaway copy of `src`, removed afterwards."""
    dst = copy_workspace(src, disk_mb)
    try:
        yield dst
    finally:
        remove_workspace(dst)


def replace_contents(dst: Path | str, src: Path | str) -> None:
    """Make `dst` hold exactly a copy of `src` (its entries removed, `src` copied in)."""
    dst = Path(dst)
    for name in os.listdir(dst):
        remove_tree(dst / name)
    copy_tree(src, dst)


# ---------------------------------------------------------------- comparing trees


def snapshot_dir(path: Path | str, inline_bytes: int = 4096, details: bool = False) -> dict[str, str]:
    """`{relative path: description}` of every entry under `path`, never following symlinks and
    never opening anything but regular files.

    A file is its text when it is UTF-8 and at most `inline_bytes` long, else `sha256:<hex>`,
    after prefixes for what else a command can change: `[+x] ` for mode 0755, `[mode 0NNN] ` for
    any mode but 0644/0755, and `[link FIRST] ` for a hard link (FIRST: the first path, sorted,
    of that inode in the tree), so a hard link never passes for a copy. Directories are `<dir>`
    (keys end in "/"; `<dir 0NNN>` for a mode other than 0755), symlinks `<symlink> target`,
    anything else `<special>`, an entry that cannot be read `<unreadable> reason`.

    With `details` (what verifiers compare: everything a command can change that the contents
    do not show), also: the workspace root itself as "./" when its mode is not 0755 or it has
    extended attributes (`chmod 000 .`), `[xattr name=value ...] ` on any entry that has
    extended attributes, and `[touched] ` on a regular file whose modification time is not
    FIXED_MTIME (every workspace is frozen at it before a run, so the file was written or
    touched: `touch f` on an existing f is not `[ -e f ] || : > f`; `cat a > b` and `cp a b`
    both write b). Directories' times are left out: making and removing a scratch file moves
    them without changing anything a later command sees."""
    if not os.path.isdir(path):
        raise WorkspaceVanished(f"workspace {path} is gone (removed from outside while in use, "
                                f"e.g. by a temp cleaner)")
    out: dict[str, str] = {}
    links: dict[tuple[int, int], list[str]] = {}  # inode -> keys of its hard links
    for rel, full, st in iter_tree(path):
        if isinstance(st, OSError):
            out[rel] = f"<unreadable> {st.strerror}"
            continue
        try:
            key, value = _describe(full, rel, st, inline_bytes)
        except OSError as exc:
            key, value = rel, f"<unreadable> {exc.strerror}"
        out[key] = value
        if S.S_ISREG(st.st_mode) and st.st_nlink > 1:
            links.setdefault((st.st_dev, st.st_ino), []).append(key)
        if details:
            extra = _xattrs(full) + ("[touched] " if S.S_ISREG(st.st_mode)
                                     and st.st_mtime_ns != FIXED_MTIME * 10**9 else "")
            out[key] = extra + out[key]
    for keys in links.values():
        for key in keys:
            out[key] = f"[link {min(keys)}] {out[key]}"
    if details:
        st = os.lstat(path)
        root = _xattrs(str(path)) + ("" if S.S_IMODE(st.st_mode) == DIR_MODE
                                     else f"<dir {S.S_IMODE(st.st_mode):04o}>")
        if root:
            out["./"] = root
    return dict(sorted(out.items()))


def _xattrs(full: str) -> str:
    """`[xattr name=value ...] ` of an entry's extended attributes ("" when none or unreadable:
    a symlink cannot hold user attributes)."""
    try:
        names = sorted(os.listxattr(full, follow_symlinks=False))
    except OSError:
        return ""
    if not names:
        return ""
    parts = []
    for name in names:
        try:
            value = os.getxattr(full, name, follow_symlinks=False)
        except OSError:
            value = b"?"
        parts.append(f"{name}={value.hex()}")
    return f"[xattr {' '.join(parts)}] "


def _describe(full: str, rel: str, st: os.stat_result, inline_bytes: int) -> tuple[str, str]:
    mode = S.S_IMODE(st.st_mode)
    if S.S_ISLNK(st.st_mode):
        return rel, f"<symlink> {os.readlink(full)}"
    if S.S_ISDIR(st.st_mode):
        return rel + "/", "<dir>" if mode == DIR_MODE else f"<dir {mode:04o}>"
    if not S.S_ISREG(st.st_mode):
        return rel, "<special>"
    prefix = {FILE_MODE: "", EXEC_MODE: "[+x] "}.get(mode, f"[mode {mode:04o}] ")
    fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as fh:
        if st.st_size <= inline_bytes:
            data = fh.read(inline_bytes + 1)
            try:
                return rel, prefix + data.decode("utf-8")
            except UnicodeDecodeError:
                return rel, prefix + "sha256:" + hashlib.sha256(data).hexdigest()
        h = hashlib.sha256()
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
        return rel, prefix + "sha256:" + h.hexdigest()
