"""The sandbox's read-only root: every mount point in place, its own /etc, the clock shim, the
fixed /proc files and the attempt supervisor (built once per machine, in `workspace_parent()`)."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
from pathlib import Path

from pivotrl.sandbox import clock, effects, environment, watch
from pivotrl.sandbox.workspace import FIXED_MTIME, workspace_parent

SANDBOX_UID = 1000  # uid/gid the command sees (named "user" in the sandbox's /etc/passwd)

_skeleton: Path | None = None
_skeleton_lock = threading.Lock()
_ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "nsswitch.conf", "localtime",
              "alternatives", "magic", "magic.mime", "mime.types", "bash.bashrc", "inputrc")
TOP_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


def skeleton_root() -> Path:
    """A read-only root with every mount point in place: mounting onto existing directories
    leaves `/` unmodified, so `ls -la /work` shows the same `..` in every run."""
    global _skeleton
    with _skeleton_lock:
        if _skeleton is not None and _skeleton.is_dir():
            return _skeleton
        # the name changes with the host files copied in, so a stale skeleton is never used
        stamp = hashlib.sha256(repr([(n, _stamp(Path("/etc") / n)) for n in _ETC_FILES]
                                    + [clock.SHIM_SOURCE, clock.FIXED_TIME, clock.PROC_FILES, watch.SOURCE])
                               .encode()).hexdigest()[:12]
        root = Path(workspace_parent()) / f"pivotrl-sandbox-root-{os.getuid()}-v5-{stamp}"
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
    for d in ("usr", "etc", "tmp", "proc", "dev", "work", "home", "home/user",
              "opt", "opt/pivotrl", environment.ENV_DIR.lstrip("/")):  # a probe's files go there
        (root / d).mkdir(mode=0o755)
    for d in TOP_DIRS:
        host = Path("/") / d
        if host.is_symlink():
            os.symlink(os.readlink(host), root / d)
        elif host.is_dir():
            (root / d).mkdir(mode=0o755)
    etc = root / "etc"
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n"
                                f"user:x:{SANDBOX_UID}:{SANDBOX_UID}:user:"
                                f"{effects.HOME_IN_SANDBOX}:/bin/bash\n"
                                "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
    (etc / "group").write_text(f"root:x:0:\nuser:x:{SANDBOX_UID}:\nnogroup:x:65534:\n")
    (etc / "hosts").write_text("127.0.0.1 localhost\n::1 localhost\n")
    (etc / "hostname").write_text("sandbox\n")
    for name in _ETC_FILES:  # copied, not bound: a mount per file costs more than the copy
        host = Path("/etc") / name
        if host.is_symlink():
            os.symlink(os.readlink(host), etc / name)
        elif host.is_dir():
            shutil.copytree(host, etc / name, symlinks=True)
        elif host.is_file():
            shutil.copy2(host, etc / name)
            os.chmod(etc / name, 0o644)
    clock.build_shim(root)
    clock.build_proc_files(root)
    watch.build_watch(root)
    for p in [root, *root.rglob("*")]:
        os.utime(p, (FIXED_MTIME, FIXED_MTIME), follow_symlinks=False)
