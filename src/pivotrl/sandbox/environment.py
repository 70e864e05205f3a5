"""What a sandboxed command can read of its environment, and the files that set it per run.

A run sees the clock, its user's name, the host name, the kernel release, the locale and the
workspace's path. The original run of every command sees the defaults (`DEFAULT_ENV`: the
fixed clock, user "user" on host "sandbox", the host's kernel release, C.UTF-8, /work), so the
same command prints the same thing whenever it runs. Verifiers run probes in other
environments (`pivotrl.verifiers.probes.probe_environment`), so that `echo 2024-01-01` cannot
pass for `date +%F`, nor `echo user` for `whoami`.

How each is set (`env_argv`): the clock, the files' timestamps and the kernel release are read by the preloaded shim
(`pivotrl.sandbox.clock`) from files bound at `ENV_DIR`; the user's name from a passwd and
group file bound over the skeleton's; the host name by bwrap's `--hostname` and a bound
/etc/hostname; the locale and USER by the environment; another workspace path by a tmpfs on
/work holding the workspace's mount point (read-only itself, so nothing can be written beside
the workspace).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

from pivotrl.sandbox.workspace import FIXED_MTIME

ENV_DIR = "/opt/pivotrl/env"  # where the shim reads `epoch` and `kernel`, as the sandbox sees it
WORKDIR = "/work"
_NAMES = ("ada", "alan", "grace", "linus", "ken", "dennis", "barbara", "edsger", "donald",
          "margaret", "radia", "frances", "niklaus", "leslie", "tony", "john")
_HOSTS = ("build", "node", "devbox", "runner", "worker", "ci", "lab", "edge", "db", "web")
_LOCALES = ("C.UTF-8", "C", "POSIX")


@dataclass(frozen=True)
class SandboxEnv:
    epoch: int = FIXED_MTIME  # the wall clock a command reads
    files_epoch: int = FIXED_MTIME  # every file timestamp a command reads
    user: str = "user"  # the name of uid 1000 ($USER, /etc/passwd)
    hostname: str = "sandbox"
    kernel: str = ""  # the release `uname -r` prints; "" is the host's
    lang: str = "C.UTF-8"
    workdir: str = WORKDIR  # where the workspace is mounted (the command's cwd)


DEFAULT_ENV = SandboxEnv()


def vary_environment(rng: random.Random, keep_workdir: bool = False) -> SandboxEnv:
    """An environment that differs from DEFAULT_ENV in every field (the workspace path too,
    unless `keep_workdir`), drawn from `rng`."""
    epoch = FIXED_MTIME
    while abs(epoch - FIXED_MTIME) < 86_400 * 366:  # another year, day, hour and second
        epoch = rng.randrange(1_262_304_000, 1_893_456_000)  # 2010 .. 2030
    user = rng.choice(_NAMES) + str(rng.randrange(2, 99))
    host = rng.choice(_HOSTS) + "-" + str(rng.randrange(2, 999))
    kernel = f"{rng.randrange(3, 7)}.{rng.randrange(0, 20)}.{rng.randrange(1, 200)}-probe"
    lang = rng.choice(_LOCALES[1:])
    workdir = WORKDIR if keep_workdir else f"{WORKDIR}/{rng.choice(_NAMES)}-{rng.randrange(10, 99)}"
    # files older than the clock, by days: a file's timestamp does not stand for today's date
    files_epoch = epoch - rng.randrange(2 * 86_400, 400 * 86_400)
    return SandboxEnv(epoch, files_epoch, user, host, kernel, lang, workdir)


def write_env_files(env: SandboxEnv, side: Path, passwd: str, group: str) -> Path:
    """Write the run's environment files into `side/env` (the shim's `epoch` and `kernel`,
    and passwd, group and hostname naming `env`'s user and host); returns the directory.
    `passwd` and `group` are the skeleton's, with "user" as uid 1000's name."""
    d = side / "env"
    d.mkdir(mode=0o755)
    files = {"epoch": f"{env.epoch}\n", "files": f"{env.files_epoch}\n", "kernel": env.kernel, "hostname": env.hostname + "\n",
             "passwd": passwd.replace("\nuser:", f"\n{env.user}:"),
             "group": group.replace("\nuser:", f"\n{env.user}:")}
    for name, text in files.items():
        (d / name).write_text(text)
        os.chmod(d / name, 0o444)
    return d


def env_argv(env: SandboxEnv, env_dir: Path | None) -> list[str]:
    """bwrap arguments that set `env` (after the skeleton and /etc are in place); `env_dir`
    from `write_env_files`, None for DEFAULT_ENV (nothing bound: the skeleton's files)."""
    argv = ["--hostname", env.hostname, "--setenv", "USER", env.user, "--setenv", "LANG", env.lang]
    if env_dir is not None:
        argv += ["--ro-bind", str(env_dir), ENV_DIR]
        for name in ("passwd", "group", "hostname"):
            argv += ["--ro-bind", str(env_dir / name), f"/etc/{name}"]
    return argv


def workdir_argv(env: SandboxEnv, workfd: int) -> list[str]:
    """bwrap arguments mounting the workspace (`workfd`) at `env.workdir` and entering it."""
    if env.workdir == WORKDIR:
        return ["--bind-fd", str(workfd), WORKDIR, "--chdir", WORKDIR]
    return ["--tmpfs", WORKDIR, "--bind-fd", str(workfd), env.workdir, "--remount-ro", WORKDIR,
            "--chdir", env.workdir]
