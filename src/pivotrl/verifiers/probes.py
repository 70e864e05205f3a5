"""Probe workspaces: does a command read and write what the expert's command does?

Two commands can print the same thing today for different reasons: `grep -c apple notes.txt`
counts, `echo 4` only knows the answer; `grep -c E log` and `grep -c ERROR log` agree on a log
where only ERROR lines hold an E. Comparing outputs on the one workspace the expert saw cannot
tell them apart; comparing them on workspaces that change what the expert's command reads can.
A verifier runs the expert's command on each probe below (once per turn) and requires a
candidate to match the expert on them too (`probes_to_compare`). A turn where no probe changes
the expert's outcome (output, exit code, files, effects) reads nothing the probes can vary (a
constant, files outside the workspace): any command printing the same text
would be paid there, so such a turn is *unverifiable* and never a pivot
(`pivotrl.verifiers.shell`, `pivotrl.select`).

The probes, each applied to its own copy of the workspace:

- grow: every text file (and every gzip/bzip2/xz file, decompressed and compressed again)
  gets new lines in its own lines' shapes (each word replaced by another word of the
  workspace, each number by one beyond the file's largest or below its smallest), every line
  repeated 1 to `GROW_MAX_REPEAT` times, near misses of its words (one letter dropped at either
  end or replaced, case swapped, inside a longer word), lines on both sides of every literal of
  the expert's command (`pivotrl.verifiers.literals`: a threshold's neighbours, a filter term
  and its near misses, the day before and after a date), a blank line only where the file
  holds one (every added line keeps a line shape of the file: a CSV line its commas), and a
  reordering in which no original line keeps its place from the start or the end and neither
  end is the first or last line of a sort order (`head -1` against `sort | head -1`): counts,
  sums, maxima and minima, deduplicated sets, first and last matches, sizes, weaker patterns
  and changed literals move. grow2 and grow3 are two more
  independent draws of it: two commands that count different lines (`grep -c INFO` for
  `grep -c ERROR` in a log with two lines of each) agree on one draw whenever the repeats and
  added lines give both sets the same total (a testbed turn with such a log: 11 of 30 process
  secrets when lines repeated 1–3 times), and must agree on all three;
- data: grow on every file but scripts (`.py`, `.sh`, ...), where there are scripts: a
  command that runs a script of the workspace is seen on what its script reads, while grow
  shows what reads the script as text (`cat main.py`) and only breaks running it;
- names: every file and directory the expert's action does not mention is renamed after other
  words of the workspace (its extension kept), and each directory gets new files named the
  same way with lines in a sibling's shape: listings, globs, `grep -l` and `wc -l *` move;
- bytes: every other binary file gets bytes of its own inserted (size, checksums, dumps move);
- env: the files as they are, in another environment (every probe runs in one of its own:
  `probe_environment`), run only where no probe above changed a file (an empty workspace);
- shrink (a last resort, `LAST_RESORT`: used only where no probe above moves the expert):
  every text file but scripts keeps one new line of its shape: counts and sizes cross thresholds
  downwards, matches disappear;
- presence (a last resort too): every workspace entry the expert's action names is removed,
  and every file name it names that does not exist is created (lines in a sibling's shape):
  existence tests move.

Names and lines are made of the workspace's own vocabulary and shapes, with every choice drawn
from a seed a verifier derives per turn from a secret of the process (`probe_seed`): a command
cannot tell a probe from the original by a fixed marker, name pattern or line pattern.

Known limit: a command can still tell the original workspace from a probe by what it knows of
the original (a file name the context showed, a line count) and print a memorised answer only
there: probes catch memorised answers and luck, not a command written against the verifier.
Each such test is extra program text that an honest command does not need.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import hashlib
import lzma
import os
import random
import re
import secrets
import shlex
from pathlib import Path

from pivotrl.sandbox.workspace import remove_tree, rename_entries
from pivotrl.sandbox.environment import SandboxEnv, vary_environment
from pivotrl.verifiers.literals import (MAX_CANDIDATE_LITERALS, command_literals, literal_lines,
                                       new_literals)

PROBES = ("grow", "grow2", "grow3", "data", "names", "bytes", "env", "shrink", "presence")
CANDIDATE_PROBE = 100  # a grow draw around a candidate's own literals (`perturb_workspace`)
CANDIDATE_TEMPLATES = 6  # lines of a file each of a candidate's literals goes into
GROW = ("grow", "grow2", "grow3")  # independent draws of one probe (module doc)
# Each line repeated 1..N times: the wider the range, the rarer two different sets of lines
# reach the same count by chance (two lines against two, by the repeats alone: 19/81 = 23% of
# draws at N = 3, 146/1296 = 11% at 6).
GROW_MAX_REPEAT = 6
# Used only where no other probe moves the expert: emptying or removing the files a command
# reads mostly tests how it fails or finds nothing, and commands that agree on every file with
# content (`grep -c X f` and `grep X f | wc -l`) fail or find nothing with other exit codes.
LAST_RESORT = ("shrink", "presence")
UNVERIFIABLE = ("turn unverifiable: no probe changes the expert's outcome (it reads nothing the "
                "probes vary: a constant or files outside the workspace), so a memorised answer "
                "could not be told from a right one")
IRREPRODUCIBLE = ("turn unverifiable: the expert's outcome changes from one run to the next on the "
                  "same workspace (it reads processes, randomness or timing), so no probe can "
                  "show what it reads")
_SALT = secrets.token_hex(8)  # per process: probes cannot be learnt from past verifications
_WORD = re.compile(r"[A-Za-z]{2,}")
_TOKEN = re.compile(r"(\d+|[A-Za-z]+)")
_LEADING_NUMBER = re.compile(r"\s*(-?\d+(?:\.\d+)?)")
MAX_NEAR_MISS_WORDS = 16
MAX_FILE_BYTES = 1 << 20  # larger files are left as they are (a probe stays cheap)
# Reorderings tried until no original line stays at its position (from the start or the end).
MAX_SHUFFLES = 200
_COMPRESSED = {".gz": gzip, ".bz2": bz2, ".xz": lzma}
_FALLBACK_WORDS = ("alpha", "delta", "omega", "sigma")  # a workspace without any word
# Programs a command may run: new lines in them would only break running them (`data` probe).
_SCRIPTS = {"py", "sh", "bash", "pl", "rb", "js", "awk", "sed", "jq"}


def probe_seed(key: str) -> str:
    """The seed of a turn's probes: its key mixed with this process's secret."""
    return hashlib.sha256(f"{_SALT}|{key}".encode()).hexdigest()[:16]


class _Vocabulary:
    """The workspace's words, numbers and line shapes, from which probes draw what they add."""

    def __init__(self, root: Path):
        self.files = _readable_files(root)
        text = "\n".join(t for _, t, _ in self.files)
        names = [p.name for p in root.rglob("*")] if root.is_dir() else []
        self.words = sorted(set(_WORD.findall(text)) | {w for n in names for w in _WORD.findall(n)})
        self.words = self.words or list(_FALLBACK_WORDS)
        self.lines = [ln for _, t, _ in self.files for ln in t.splitlines() if ln.strip()]

    def word(self, rng: random.Random, like: str = "") -> str:
        w = rng.choice(self.words)
        if like.isupper():
            return w.upper()
        if like[:1].isupper():
            return w.capitalize()
        return w.lower() if like.islower() else w

    def name(self, rng: random.Random, ext: str, taken: set[str]) -> str:
        for _ in range(50):
            stem = self.word(rng, "x").lower()
            if rng.random() < 0.5:
                stem += rng.choice(("_", "-", "")) + self.word(rng, "x").lower()
            name = stem + (f".{ext}" if ext else "")
            if name not in taken:
                taken.add(name)
                return name
        name = f"{self.word(rng, 'x').lower()}{rng.randrange(10, 99)}" + (f".{ext}" if ext else "")
        taken.add(name)
        return name


def _numbers(text: str) -> tuple[int, int]:
    nums = [int(n) for n in re.findall(r"\d+", text)[:10_000] if len(n) < 12]
    return (min(nums), max(nums)) if nums else (0, 9)


def _shaped(template: str, rng: random.Random, vocab: _Vocabulary, lo: int, hi: int) -> str:
    """A new line in `template`'s shape: words replaced by workspace words, numbers by values
    beyond the file's range (so maxima, minima, sums and sorts move)."""
    def swap(m: re.Match) -> str:
        tok = m.group(0)
        if tok.isdigit():
            if rng.random() < 0.5 or lo == 0:
                return str(hi + rng.randrange(1, 10))
            return str(rng.randrange(0, lo))
        return vocab.word(rng, tok) if len(tok) > 1 else tok
    return _TOKEN.sub(swap, template)


def _readable_files(root: Path) -> list[tuple[str, str, str]]:
    """(path, text, kind) of every regular text file ("text") or compressed text file (its
    suffix) under `root`, sorted; never follows links."""
    out = []
    for dirpath, dirs, files in os.walk(root, followlinks=False):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(dirpath, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            try:
                if os.path.getsize(path) > MAX_FILE_BYTES:
                    continue
                module = _COMPRESSED.get(os.path.splitext(name)[1])
                with (module.open if module else open)(path, "rb") as fh:
                    data = fh.read(MAX_FILE_BYTES + 1)  # bounded: a compressed file may be a bomb
                if len(data) <= MAX_FILE_BYTES:
                    out.append((path, data.decode("utf-8"),
                                os.path.splitext(name)[1] if module else "text"))
            except (OSError, UnicodeDecodeError, EOFError, ValueError, lzma.LZMAError):
                continue  # binary, unreadable or corrupt: left to the bytes probe
    return out


def _write(path: str, text: str, kind: str = "text") -> None:
    data = text.encode("utf-8")
    if kind == ".gz":
        data = gzip.compress(data, mtime=0)
    elif kind in _COMPRESSED:
        data = _COMPRESSED[kind].compress(data)
    with contextlib.suppress(OSError), open(path, "wb") as fh:
        fh.write(data)


def _keeps_a_line_in_place(lines: list[str], out: list[str]) -> bool:
    """Whether some original line is still at its original position, counted from the start or
    from the end: a read of those positions (`head -2`, `tail -1`) would see what it saw."""
    return any(a == b for a, b in zip(lines, out)) or any(
        a == b for a, b in zip(reversed(lines), reversed(out)))


def _leading_number(line: str) -> float:
    m = _LEADING_NUMBER.match(line)
    return float(m.group(1)) if m else 0.0


# The orders a command may sort by: bytes (`sort` in the sandbox's C locale), case folded
# (`sort -f`) and numeric (`sort -n`), each with the whole line as the last tie-break, as GNU
# sort does.
_SORT_KEYS = (lambda ln: ln, lambda ln: (ln.casefold(), ln), lambda ln: (_leading_number(ln), ln))


def _sort_extremes(lines: list[str]) -> set[str]:
    """The first and last line of each sort order; empty when there are too few distinct lines
    to keep every end off every extreme. A shuffle keeps the lines, so this is computed once."""
    if len(set(lines)) < 3:
        return set()
    return {pick(lines, key=key) for key in _SORT_KEYS for pick in (min, max)}


def _grow(text: str, rng: random.Random, vocab: _Vocabulary,
          literals: list[tuple[str, str]] = (), exact: bool = True,
          candidate: bool = False) -> str:
    lines = text.splitlines()
    lo, hi = _numbers(text)
    shapes = [ln for ln in lines if ln.strip()] or vocab.lines or vocab.words
    times = [rng.randint(1, GROW_MAX_REPEAT) for _ in lines]
    if lines and max(times) == 1:  # some line repeated, always (`sort` against `sort -u`)
        times[rng.randrange(len(lines))] = 2
    out = [ln for ln, k in zip(lines, times) for _ in range(k)]
    out += [_shaped(rng.choice(shapes), rng, vocab, lo, hi)
            for _ in range(max(2, len(lines) // 2))]
    # near misses of the file's own words, and lines on both sides of the command's literals,
    # each in a line of the file's shape (a CSV line keeps its commas: module docstring)
    words = sorted(set(_WORD.findall(text)))
    rng.shuffle(words)
    out += literal_lines(shapes, [("word", w) for w in words[:MAX_NEAR_MISS_WORDS]], rng,
                         vocab.word, templates=1, positions=1)
    # a candidate's few literals go into more of the file's lines, without near misses, so a
    # planted `| grep -v ZZ` meets a line the rest of its command keeps
    out += literal_lines(shapes, list(literals), rng, vocab.word, exact=exact or candidate,
                         templates=CANDIDATE_TEMPLATES if candidate else 1 if exact else 2,
                         near=not candidate)
    if any(not ln.strip() for ln in lines):  # blank lines only where the file holds one
        out.append("")
    original, moved, extremes = list(out), None, _sort_extremes(out)
    for _ in range(MAX_SHUFFLES):
        rng.shuffle(out)
        if out != original and not _keeps_a_line_in_place(lines, out):
            moved = moved or list(out)
            if out[0] not in extremes and out[-1] not in extremes:  # `head -1` ≠ `sort | head -1`
                break
    else:
        out = moved or out
    return "\n".join(out) + "\n"


def _shrink(text: str, rng: random.Random, vocab: _Vocabulary) -> str:
    lo, hi = _numbers(text)
    shapes = [ln for ln in text.splitlines() if ln.strip()] or vocab.lines or vocab.words
    old = set(text.splitlines())
    line = _shaped(rng.choice(shapes), rng, vocab, lo, hi)
    for _ in range(20):  # a line the file did not hold
        if line not in old:
            break
        line = _shaped(rng.choice(shapes), rng, vocab, lo, hi) + " " + vocab.word(rng)
    return line + "\n"


def _ext(name: str) -> str:
    return name.rsplit(".", 1)[1] if "." in name.strip(".") else ""


def _sibling_body(dirpath: str, ext: str, rng: random.Random, vocab: _Vocabulary) -> str:
    """Lines in the shape of a sibling with extension `ext` (or of any workspace line)."""
    shapes = [ln for p, t, _ in vocab.files if os.path.dirname(p) == dirpath and _ext(p) == ext
              for ln in t.splitlines() if ln.strip()] or vocab.lines or vocab.words
    lo, hi = _numbers("\n".join(shapes))
    return "".join(_shaped(rng.choice(shapes), rng, vocab, lo, hi) + "\n"
                   for _ in range(rng.randrange(2, 6)))


def _names(root: Path, rng: random.Random, vocab: _Vocabulary, keep: str) -> None:
    taken = {p.name for p in root.rglob("*")}

    def new_name(name: str, _index: int) -> str | None:
        return None if name in keep else vocab.name(rng, _ext(name), taken)

    rename_entries(root, new_name)
    for dirpath, _dirs, files in list(os.walk(root, followlinks=False)):
        exts = sorted({_ext(n) for n in files}) or [""]
        for ext in rng.sample(exts, min(len(exts), 2)):
            _write(os.path.join(dirpath, vocab.name(rng, ext, taken)),
                   _sibling_body(dirpath, ext, rng, vocab))


def _mentioned(keep: str) -> list[str]:
    try:
        words = shlex.split(keep, comments=True)
    except ValueError:
        words = keep.split()
    out = []
    for w in words:
        for part in re.split(r"[<>|;&=]", w):
            part = os.path.normpath(part.strip()) if part.strip() else ""
            if part and part != "." and not part.startswith(("-", "/", "$", "~", "..")) \
                    and not re.search(r"[*?\[\]{}()'\"`\\]", part):
                out.append(part)
    return out


def _presence(root: Path, rng: random.Random, vocab: _Vocabulary, keep: str) -> None:
    for rel in sorted(set(_mentioned(keep))):
        path = root / rel  # never the root itself: "." and ".." are not names (_mentioned)
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():
            with contextlib.suppress(OSError):
                remove_tree(path)  # iterative: a command may have left a deep tree
        elif ("." in rel.strip(".") or "/" in rel) and not rel.endswith("/"):
            with contextlib.suppress(OSError):
                path.parent.mkdir(parents=True, exist_ok=True)
                _write(str(path), _sibling_body(str(path.parent), _ext(rel), rng, vocab))


def _bytes(root: Path, rng: random.Random, texts: set[str]) -> None:
    for dirpath, _dirs, files in os.walk(root, followlinks=False):
        for name in sorted(files):
            path = os.path.join(dirpath, name)
            if path in texts or os.path.islink(path) or not os.path.isfile(path):
                continue
            with contextlib.suppress(OSError):
                data = bytearray(Path(path).read_bytes()[:MAX_FILE_BYTES])
                for _ in range(max(1, len(data) // 16)):
                    at = rng.randrange(len(data) + 1)
                    data[at:at] = bytes([data[rng.randrange(len(data))] if data else
                                         rng.randrange(256)])
                Path(path).write_bytes(bytes(data))


def perturb_workspace(root: Path | str, probe: int, seed: str = "", keep: str = "",
                      extra: str = "") -> bool:
    """Apply probe number `probe` (module docstring) to the directory in place, every choice
    drawn from `seed`; `keep` is the expert's action (the names it mentions are never renamed,
    and are what the presence probe removes or creates; its literals get lines on both sides,
    `pivotrl.verifiers.literals`). `CANDIDATE_PROBE` is a grow draw around the literals of
    `extra` (a candidate's action) that `keep` does not name. False when there is no such
    probe. Every probe also runs in another environment (`probe_environment`)."""
    root = Path(root)
    if probe == CANDIDATE_PROBE:
        kind, literals = "grow", new_literals(extra, keep)[:MAX_CANDIDATE_LITERALS]
    elif 0 <= probe < len(PROBES):
        kind, literals = PROBES[probe], command_literals(keep)
    else:
        return False
    # a candidate's probe depends on its literals only: one expert run serves every candidate
    # naming the same ones
    rng = random.Random(f"{seed}|{probe}" + (f"|{literals}" if probe == CANDIDATE_PROBE else ""))
    if kind == "env":
        return True  # the environment alone (`probe_environment`)
    vocab = _Vocabulary(root)
    if kind in (*GROW, "data", "shrink"):
        data = [f for f in vocab.files if _ext(f[0]) not in _SCRIPTS]
        if kind == "data" and len(data) == len(vocab.files):
            return True  # no script: grow already did this (left unchanged: not run)
        for j, (path, text, how) in enumerate(vocab.files if kind in GROW else data):
            # every other file (by draw) holds a word literal's near misses without the word
            exact = (j + probe) % 2 == 0
            new = _shrink(text, rng, vocab) if kind == "shrink" else \
                _grow(text, rng, vocab, literals, exact, probe == CANDIDATE_PROBE)
            _write(path, new, how)
    elif kind == "names":
        _names(root, rng, vocab, keep)
    elif kind == "presence":
        _presence(root, rng, vocab, keep)
    else:
        _bytes(root, rng, {p for p, _, _ in vocab.files})
    return True


def probe_environment(seed: str, probe: int, keep: str = "") -> SandboxEnv:
    """The environment probe number `probe` runs in: another clock, user, host name, kernel
    release, locale and workspace path than the original run's and than every other probe's
    (drawn from `seed`), so a constant cannot stand for what a command reads of them
    (`echo 2024-01-01` for `date +%F`, `echo user` for `whoami`). The workspace keeps its path
    where the expert's action names it (`keep` holds "/work")."""
    return vary_environment(random.Random(f"{seed}|env|{probe}"), keep_workdir="/work" in keep)


def probes_to_compare(results: list[tuple[int, bool, object]]) -> list[object]:
    """The probes a candidate is compared on, from (probe index, whether it moved the expert's
    outcome, anything) of every probe the expert could be run on: none when no probe moved it
    (the turn is unverifiable); else every regular probe, moved or not (a probe that leaves the
    expert alone still catches `grep -c E` for `grep -c ERROR`), and a last-resort one only
    where it is the one that moved the expert."""
    if not any(moved for _, moved, _ in results):
        return []
    def last_resort(i: int) -> bool:  # a world may offer probes of its own past PROBES
        return i < len(PROBES) and PROBES[i] in LAST_RESORT
    regular = [r for r in results if not last_resort(r[0])]
    last = [r for r in results if last_resort(r[0]) and r[1]]
    return [x for _, _, x in (regular if any(m for _, m, _ in regular) else regular + last)]


def writes(before: dict[str, str], after: dict[str, str]) -> dict[str, str | None]:
    """What a command changed: {path: new description, or None when removed}."""
    out: dict[str, str | None] = {k: v for k, v in after.items() if before.get(k) != v}
    out.update({k: None for k in before if k not in after})
    return out
