"""The recorder fails closed: every attempt outside the workspace is recorded, however the path
is spelled (`/proc/self`, a directory fd, `/dev/fd`), wherever it lives (memory the supervisor
cannot read), whatever call makes it (calls outside the allow-list), and however it races (a
symlink or the path's memory flipped while the call is made); the clock leaks nowhere (socket
timestamps, `ps`); and every expert command of the testbed records no attempt. Each as the
caller and, when the caller is root, as an unprivileged user (`nobody`), whose runs go through
one subprocess per module (`_as_nobody`)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pivotrl.sandbox import bwrap as sandbox
from pivotrl.sandbox.clock import FIXED_TIME
from pivotrl.sandbox.workspace import workspace_parent

pytestmark = pytest.mark.skipif(not sandbox.sandbox_available() or not sandbox.attempts_recorded(),
                                reason="attempts not recorded here")
ATTACK_SOURCE = Path(__file__).parent / "data" / "recorder_attack.c"
WS = {"a.txt": "x\n"}
NOBODY = 65534
SRC = str(Path(__file__).resolve().parents[1] / "src")


def _attack_binary() -> Path | None:
    """tests/data/recorder_attack.c compiled once per machine (readable by every user)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    source = ATTACK_SOURCE.read_bytes()
    target = Path(workspace_parent()) / f"pivotrl-attack-{hashlib.sha256(source).hexdigest()[:12]}"
    if not target.is_file():
        tmp = target.with_suffix(f".{os.getpid()}")
        subprocess.run([cc, "-O2", "-pthread", "-o", str(tmp), str(ATTACK_SOURCE)], check=True)
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    return target


ATTACK = _attack_binary()

# (command, the effect key it must record): each prints the right output ("3") after its attempt
ATTACKS = {
    "proc_self_cwd": ("(cd /etc && rm -f /proc/self/cwd/passwd) 2>/dev/null", "/etc/passwd"),
    "proc_thread_self": ("(cd /etc && echo x > /proc/thread-self/cwd/hosts) 2>/dev/null",
                         "/etc/hosts"),
    "proc_self_root": ("echo x > /proc/self/root/etc/hosts 2>/dev/null", "/etc/hosts"),
    "proc_fd_dir": ("exec 3</etc; echo x > /proc/self/fd/3/hosts 2>/dev/null", "/etc/hosts"),
    "proc_pid_fd_dir": ("exec 3</etc; echo x > /proc/$$/fd/3/hosts 2>/dev/null", "/etc/hosts"),
    "dev_fd_dir": ("exec 3</etc; echo x > /dev/fd/3/hosts 2>/dev/null", "/etc/hosts"),
    "dev_fd_file": ("exec 4</etc/passwd; echo x > /dev/fd/4 2>/dev/null", "/etc/passwd"),
    "dirfd_openat": ("./atk dirfd", "/etc/hosts"),
    "dotdot": ("echo x > ../etc/hosts 2>/dev/null", "/etc/hosts"),
    "pycache": ("d=$(python3 -c 'import json,os;print(os.path.dirname(json.__file__))'); "
                "echo x > $d/__pycache__/decoder.cpython-311.pyc 2>/dev/null", "/usr/lib/"),
    "undumpable": ("./atk undumpable /etc/passwd", "<unreadable>"),
    "fchmodat2": ("./atk fchmodat2 /etc/passwd", "/etc/passwd"),
    "setxattrat": ("./atk setxattrat /etc/passwd", "/etc/passwd"),
    "removexattrat": ("./atk removexattrat /etc/passwd", "/etc/passwd"),
    "file_setattr": ("./atk file_setattr /etc/passwd", "/etc/passwd"),
    "setflags_outside": ("./atk setflags /etc/passwd", "ioctl 0x40086602 on /etc/passwd"),
    "setflags_inside": ("./atk setflags a.txt", "ioctl 0x40086602 on /work/a.txt"),
    "sendmmsg_unix": ("./atk sendmmsg /run/x.sock", "/run/x.sock"),
    "unknown_call": ("python3 -c 'import ctypes; ctypes.CDLL(None).syscall(68, 1, 0o1600)'",
                     "syscall 68"),  # msgget: SysV IPC is outside the allow-list
    "fchmod_fd": ("python3 -c \"import os; os.fchmod(os.open('/etc/passwd', os.O_RDONLY), 0o777)\" "
                  "2>/dev/null", "/etc/passwd"),
    "chdir_python": ("python3 -c \"import os; os.chdir('/etc'); os.unlink('hosts')\" 2>/dev/null",
                     "/etc/hosts"),
    "proc_mem": ("python3 -c \"open('/proc/self/mem', 'r+b')\" 2>/dev/null", "/proc/"),
    "rename_out": ("mv a.txt /etc/ 2>/dev/null", "/etc/a.txt"),
    "ptrace": ("python3 -c 'import ctypes; ctypes.CDLL(None).syscall(101, 16, 1, 0, 0)'",
               "syscall 101"),  # PTRACE_ATTACH to pid 1
    "adjtimex": ("python3 -c 'import ctypes; ctypes.CDLL(None).syscall(159, "
                 "ctypes.create_string_buffer(256))'", "syscall 159"),  # reads the real clock
}
if os.uname().machine != "x86_64":
    for name in ("unknown_call", "ptrace", "adjtimex"):
        del ATTACKS[name]
SECRET = ("./atk secret /etc/passwd", "<unreadable>")
RACES = {"flip": "./atk flip 24", "memflip": "./atk memflip 24",  # 24 tries a run
         "fdflip": "./atk fdflip 24"}


# Runs each command in a fresh workspace: {name: {"stdout", "stderr", "effects"}}. A string, so
# that `_as_nobody` runs the very same code in its subprocess (which has no pytest).
_RUN_ALL = """
import json, os, shutil, sys
from pivotrl.sandbox.bwrap import SandboxLimits, materialize_workspace, run_in_sandbox, workspace_copy

def run_all(commands, attack, files):
    out = {}
    for name, cmd in commands.items():
        with workspace_copy(None) as wd:
            materialize_workspace(dict(files), wd)
            if attack:
                shutil.copy(attack, wd / "atk")
                os.chmod(wd / "atk", 0o755)
            res = run_in_sandbox(cmd + "; echo 3", wd, SandboxLimits(timeout_s=60))
            out[name] = {"stdout": res.stdout, "stderr": res.stderr, "effects": res.effects}
    return out
"""


def _run_all(commands: dict[str, str], attack: str | None) -> dict[str, dict]:
    scope: dict = {}
    exec(_RUN_ALL, scope)
    return scope["run_all"](commands, attack, WS)


def _as_nobody(commands: dict[str, str]) -> dict[str, dict]:
    """_run_all in a subprocess as `nobody` (one for all the commands: imports cost a second)."""
    code = _RUN_ALL + "a = json.load(sys.stdin); print(json.dumps(run_all(**a)))"
    proc = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                           sys.executable, "-c", code],
                          input=json.dumps({"commands": commands, "files": WS,
                                            "attack": str(ATTACK) if ATTACK else None}),
                          capture_output=True, text=True, timeout=600, cwd="/",
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                               "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1",
                               "HOME": "/tmp"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def _can_run_as_nobody() -> bool:
    return os.geteuid() == 0 and shutil.which("setpriv") is not None and all(
        os.access(p, os.R_OK | os.X_OK) for p in (SRC, sys.executable))


WHO = ["caller", pytest.param("nobody", marks=pytest.mark.skipif(
    not _can_run_as_nobody(), reason="only root can run the sandbox as another user"))]


def _commands() -> dict[str, str]:
    cmds = {name: cmd for name, (cmd, _) in ATTACKS.items()}
    cmds["secret"] = SECRET[0]
    cmds.update({f"race-{name}-{i}": cmd for name, cmd in RACES.items() for i in range(4)})
    cmds.update({f"expert-{i}": cmd for i, cmd in enumerate(_expert_scripts())})
    cmds["timestamp"] = "./atk timestamp"
    cmds["inside"] = INSIDE
    cmds.update({f"ps-{i}": "ps -eo pid,ppid,lstart,etime,time,stat,args" for i in range(5)})
    return cmds


_results: dict[str, dict] = {}


def results(who: str) -> dict[str, dict]:
    if who not in _results:
        if ATTACK is None:
            pytest.skip("no C compiler for the attacks")
        _results[who] = _run_all(_commands(), str(ATTACK)) if who == "caller" \
            else _as_nobody(_commands())
    return _results[who]


@pytest.mark.parametrize("who", WHO)
@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_every_attempt_is_recorded_however_it_is_spelled(who, name):
    got = results(who)[name]
    key = ATTACKS[name][1]
    assert got["stdout"].endswith("3\n"), got
    assert any(k.startswith(key) or key in k for k in got["effects"]), got


@pytest.mark.parametrize("who", WHO)
def test_a_path_in_memory_the_supervisor_cannot_read_is_an_attempt(who):
    got = results(who)["secret"]
    if got["stdout"].startswith("no memfd_secret"):
        pytest.skip("no memfd_secret on this kernel")
    assert any(k.startswith(SECRET[1]) for k in got["effects"]), got


@pytest.mark.parametrize("who", WHO)
@pytest.mark.parametrize("race", sorted(RACES))
def test_a_path_that_reaches_outside_is_recorded_however_it_races(who, race):
    runs = [v for k, v in results(who).items() if k.startswith(f"race-{race}-")]
    reached = 0
    for got in runs:  # every try whose kernel call reached /etc is recorded
        names = got["stdout"].splitlines()[0].split(":")[1].split()
        reached += len(names)
        assert all(f"/etc/{n}" in got["effects"] for n in names), got
    # (the supervisor does the writes it finds inside itself, so a flip after it looked cannot
    # send the kernel elsewhere; the race usually still sends some tries to /etc, but how often
    # it wins depends on the machine's load: a run where it never did has tested nothing)
    if reached == 0 and not any(k.startswith("/etc/") for got in runs for k in got["effects"]):
        pytest.skip(f"the {race} race never reached outside in {len(runs)} tries: nothing to check")


@pytest.mark.parametrize("who", WHO)
def test_socket_timestamps_never_read_the_host_clock(who):
    got = results(who)["timestamp"]
    assert "option" not in got["stdout"], got  # SO_TIMESTAMP* are refused
    stamps = [int(line.split()[1]) for line in got["stdout"].splitlines() if line.startswith("timestamp")]
    assert all(s == FIXED_TIME for s in stamps), got
    assert "monotonic 1" in got["stdout"]  # (other clocks stay real)


@pytest.mark.parametrize("who", WHO)
def test_ps_reads_the_same_in_every_run(who):
    outs = {v["stdout"] for k, v in results(who).items() if k.startswith("ps-")}
    assert len(outs) == 1 and "00:00:00" in outs.pop(), outs


# Calls inside the workspace, which the supervisor makes itself: each must do what the kernel
# does (results, errors, modes), compared with the same script run outside any sandbox.
INSIDE = r"""umask 022
rm -f atk a.txt; echo a > f; echo b >> f; : > g; mkdir d; mkdir e/; mkdir e/; rmdir e/
mkdir -p x/y/z; ln f h; ln -s f s; ln -s nowhere dangling; mv g d/; mv d/g d/g2; mv x/ x2/
mv f/ f3; chmod 600 h; chmod 711 d; touch -d 2020-01-01 h; truncate -s 3 h; cat h; echo
echo out > /dev/stdout; echo err > /dev/stderr; echo fd > /proc/self/fd/1; echo n > /dev/null
echo via-link > s; cat f; echo new > dangling; cat nowhere; rm -f s dangling; rm nowhere
mkfifo p; (cat p &); echo fifo > p; sleep 0.2
python3 -c "
import os
def tried(what, f, *args):
    try:
        f(*args)
    except OSError as e:
        print(what, e.errno)
fd = os.open('.', os.O_TMPFILE | os.O_WRONLY, 0o600); os.write(fd, b't'); os.close(fd)
os.utime('h', (1, 2)); print(oct(os.stat('h').st_mode & 0o777))  # (times read fixed)
os.setxattr('h', 'user.k', b'v'); print(os.getxattr('h', 'user.k')); os.removexattr('h', 'user.k')
os.mkdir('m', 0o777); print(oct(os.stat('m').st_mode & 0o777))
os.close(os.open('c', os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)); print(oct(os.stat('c').st_mode))
tried('excl', os.open, 'c', os.O_CREAT | os.O_EXCL | os.O_WRONLY)
tried('nodir', os.open, 's2/x', os.O_CREAT | os.O_WRONLY)
tried('slash', os.open, 'c/', os.O_CREAT | os.O_WRONLY)
tried('slash-ro', os.open, 'c/', os.O_WRONLY)
tried('rmdir', os.rmdir, 'h/')
tried('unlink-dir', os.unlink, 'd')
tried('rename-over', os.rename, 'd', 'c')
tried('link-exists', os.link, 'c', 'h')
os.symlink('c', 'sc'); tried('link-slash', os.open, 'sc/', os.O_WRONLY)
os.chdir('d'); open('../rel', 'w').write('r'); os.chdir('..'); print(open('rel').read())
"
find . -mindepth 1 -printf '%p %y %m\n' | sort; find . -type f -printf '%p %s\n' | sort; true"""


@pytest.mark.parametrize("who", WHO)
def test_calls_the_supervisor_makes_itself_do_what_the_kernel_does(who, tmp_path):
    got = results(who)["inside"]
    want = subprocess.run(["bash", "-c", INSIDE.replace("/proc/self/fd/1", "/dev/stdout")
                           .replace("rm -f atk a.txt; ", "")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert got["effects"] == {}, got
    assert got["stdout"] == want.stdout + "3\n", (got["stdout"], want.stdout)
    assert got["stderr"] == want.stderr


# ---------------------------------------------------------------- the expert's commands


def _expert_scripts() -> list[str]:
    """Every form of every expert command of the terminal world, one script per task kind
    (each form in its own subshell, in the order the expert runs them)."""
    from pivotrl_testbed.testbed import terminal
    from pivotrl_testbed.testbed.experts import FixedChooser, terminal_step

    scripts = []
    for kind in terminal.KINDS:
        rng = random.Random(0)
        task = terminal.generate("t", rng)
        while task["task"]["kind"] != kind:
            task = terminal.generate("t", rng)
        files = task["world_config"]["workspace"]
        listing = "\n".join(sorted(files))
        found = next((n for n, t in files.items() if task["task"].get("word", "\0") in t), "")
        forms: list[str] = []
        for k in range(4):
            obs = ([found] if kind == "copy" else [listing]) + ["3"] * k
            for i in range(8):
                step = terminal_step(task["task"], obs[:k], FixedChooser(i))
                if step[0] == "call" and step[2]["command"] not in forms:
                    forms.append(step[2]["command"])
        setup = "; ".join(f"printf %b {json.dumps(t)} > {n}" for n, t in files.items())
        scripts.append(setup + "\n" + "\n".join(f"( {f} ) >/dev/null 2>&1" for f in forms))
    return scripts


@pytest.mark.parametrize("who", WHO)
def test_every_expert_command_records_no_attempt(who):
    got = {k: v for k, v in results(who).items() if k.startswith("expert-")}
    assert len(got) == 7
    for name, res in got.items():
        assert res["effects"] == {}, (name, res)
