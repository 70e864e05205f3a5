"""Perturbed workspaces: does a command read and write what the expert's command does?

Two commands can print the same thing today for different reasons: `grep -c apple notes.txt`
counts, `echo 4` only knows the answer; `grep -c E log` and `grep -c ERROR log` agree on a log
where only ERROR lines hold an E. Comparing outputs on the one workspace the expert saw cannot
tell them apart; comparing them on workspaces that change what any plausible command would
read can. A candidate must match the expert on the original workspace *and on every probe*,
whether or not the probe changes the expert's own outcome (a probe that leaves the expert's
output alone is exactly the one that catches a command printing a memorised answer in a way
that depends on the files: `ls` for `echo app.log`, `grep -c ERROR` for `grep -c E`):

0. contents: in every text file, every line repeated 2 or 3 times (chosen per line), lines
   made of the file's own words changed slightly added (one letter dropped at either end, case
   swapped, one letter replaced), an empty line and a marker line added, and the whole
   reordered so that no original line keeps its position from the start or the end: counts,
   sizes, heads, tails, cat, sort -u, wc and copies change, a weaker pattern (`grep -c E` for
   `grep -c ERROR`), another case rule, a prefix match, `grep -c .` for `wc -l` and anything
   order-dependent (`cat` for `sort`) count or print differently;
1. names: every file and directory whose name the expert's action does not mention gets a
   new name with the same extension (a file name printed from memory no longer exists), and
   every directory gets, for each extension in it, a new file `<marker>.<ext>` holding a
   reordered copy of a sibling (ls, globs, `grep -l`, `wc -l *` change).

Files the expert names are never renamed (its action must still work), and no probe adds a
dot-file (`ls` and `ls -A` stay equivalent where the workspace has none). The markers and every
choice come from a seed that a verifier derives per turn from a secret drawn per process
(`probe_seed`): a command cannot know the marker, so it cannot tell a probe from the original
by looking for it.

Known limit: a command can still tell the original workspace from a probe by what it knows of
the original (a file name the context showed, a line count, the absence of an empty line) and
print a memorised answer only there: probes catch memorised answers, luck and fixed markers,
not a command written against the verifier. Each such test is extra program text that an
honest command does not need.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import re
import secrets
from pathlib import Path

from pivotrl.sandbox.workspace import rename_entries

PROBES = ("contents", "names")
_SALT = secrets.token_hex(8)  # per process: markers cannot be learnt from past verifications
_WORD = re.compile(r"[A-Za-z]{2,}")
MAX_NEAR_MISS_WORDS = 16
# Reorderings tried until no original line stays at its position (from the start or the end);
# with every line repeated and near-miss lines added, most shufflings succeed within a few.
MAX_SHUFFLES = 200


def probe_seed(key: str) -> str:
    """The seed of a turn's probes: its key mixed with this process's secret."""
    return hashlib.sha256(f"{_SALT}|{key}".encode()).hexdigest()[:16]


def _marker(rng: random.Random) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(8))


def _text_files(root: Path) -> list[tuple[str, str]]:
    """(path, text) of every regular UTF-8 file under `root`, sorted; never follows links."""
    out = []
    for dirpath, dirs, files in os.walk(root, followlinks=False):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(dirpath, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            try:
                with open(path, "rb") as fh:
                    out.append((path, fh.read().decode("utf-8")))
            except (OSError, UnicodeDecodeError):
                continue  # binary or unreadable: left as it is
    return out


def _write(path: str, text: str) -> None:
    with contextlib.suppress(OSError), open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def _lines(text: str) -> tuple[list[str], str]:
    """Lines without their ends, and the end the text had ("\\n" or "")."""
    return text.splitlines(), "\n" if text.endswith("\n") or not text else ""


def _join(lines: list[str], end: str) -> str:
    return "\n".join(lines) + (end if lines else "")


def _contents(text: str, rng: random.Random, marker: str) -> str:
    lines, _end = _lines(text)
    out = [ln for ln in lines for _ in range(rng.choice((2, 3)))]
    words = sorted(set(_WORD.findall(text)))
    rng.shuffle(words)
    for w in words[:MAX_NEAR_MISS_WORDS]:
        i = rng.randrange(len(w))
        out += [w[:-1], w[1:], w.swapcase(), w[:i] + marker[0] + w[i + 1:]]
    out += ["", f"{marker} {marker}"]
    original = list(out)
    for _ in range(MAX_SHUFFLES):
        rng.shuffle(out)
        if out != original and not _keeps_a_line_in_place(lines, out):
            break
    while out == original:  # at least two distinct lines (the marker, the empty one)
        rng.shuffle(out)
    return _join(out, "\n")


def _keeps_a_line_in_place(lines: list[str], out: list[str]) -> bool:
    """Whether the perturbed file still holds some original line at its original position,
    counted from the start or from the end: a read of those positions (`head -2`, `tail -1`,
    `sed -n 2p`) would then see what it saw in the original, and a command printing the
    memorised answer would match the expert there by luck."""
    return any(a == b for a, b in zip(lines, out)) or any(
        a == b for a, b in zip(reversed(lines), reversed(out)))


def _ext(name: str) -> str:
    return name.rsplit(".", 1)[1] if "." in name.strip(".") else ""


def _extra_files(root: Path, rng: random.Random, marker: str) -> None:
    for dirpath, _dirs, files in list(os.walk(root, followlinks=False)):
        by_ext: dict[str, str] = {}
        for name in sorted(files):
            by_ext.setdefault(_ext(name), name)
        if not by_ext:
            by_ext[""] = ""
        for ext, sibling in sorted(by_ext.items()):
            text = ""
            if sibling:
                with contextlib.suppress(OSError, UnicodeDecodeError):
                    text = Path(dirpath, sibling).read_bytes().decode("utf-8")
            lines, _ = _lines(text)
            body = _join(list(reversed(lines)) + [marker], "\n")
            _write(os.path.join(dirpath, marker + (f".{ext}" if ext else "")), body)


def _renamed(keep: str, marker: str):
    def new_name(name: str, index: int) -> str | None:
        if name in keep:
            return None
        ext = _ext(name)
        return f"{marker}{index}" + (f".{ext}" if ext else "")
    return new_name


def perturb_workspace(root: Path | str, probe: int, seed: str = "", keep: str = "") -> bool:
    """Apply probe number `probe` to the directory in place, its marker and choices drawn from
    `seed`; files and directories whose name occurs in `keep` (the expert's action) are never
    renamed. False when there is no such probe."""
    if not 0 <= probe < len(PROBES):
        return False
    root = Path(root)
    rng = random.Random(f"{seed}|{probe}")
    marker = _marker(rng)
    if probe == 0:
        for path, text in _text_files(root):
            _write(path, _contents(text, rng, marker))
    else:
        rename_entries(root, _renamed(keep, marker))
        _extra_files(root, rng, marker)
    return True


def writes(before: dict[str, str], after: dict[str, str]) -> dict[str, str | None]:
    """What a command changed: {path: new description, or None when removed}."""
    out: dict[str, str | None] = {k: v for k, v in after.items() if before.get(k) != v}
    out.update({k: None for k in before if k not in after})
    return out
