"""Perturbed workspaces: does a command read and write what the expert's command does?

Two commands can print the same thing today for different reasons: `grep -c apple notes.txt`
counts, `echo 4` only knows the answer. Comparing outputs on the one workspace the expert saw
cannot tell them apart; comparing them on a *perturbed* copy can. Each probe changes file
contents in a way every honest read sees, without renaming anything a command names:

0. every line of every text file doubled, and one new line appended (counts, heads, tails, cat,
   cut, sort -u, wc and copies all change);
1. one new file `zz-extra-<random>` in every directory (ls and `*` globs change).

A probe is only used when the *expert's* outcome changes under it (its output, exit code or the
changes it makes to the files): the expert reads what the probe changed, so an equivalent
command must follow it. When the expert's outcome does not change, the probe says nothing about
the expert's reads and is skipped (a candidate reading more than the expert is not punished
for it by a probe the expert ignores).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

PROBES = ("lines doubled and one appended", "extra file")
# Drawn per process: a command cannot recognise the probe by its marker and answer the probe
# honestly while printing a memorised answer otherwise.
_SALT = secrets.token_hex(4)
EXTRA_LINE = f"zz extra line {_SALT}\n"
EXTRA_FILE = f"zz-extra-{_SALT}"


def _rewrite_text_files(root: Path, change) -> None:
    for dirpath, _dirs, files in os.walk(root, followlinks=False):
        for name in files:
            path = os.path.join(dirpath, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            try:
                with open(path, "rb") as fh:
                    text = fh.read().decode("utf-8")
            except (OSError, UnicodeDecodeError):
                continue  # binary or unreadable: left as it is
            with contextlib.suppress(OSError):
                with open(path, "w", encoding="utf-8") as fh:
                    fh.write(change(text))


def _changed(text: str) -> str:
    doubled = "".join(line + line if line.endswith("\n") else line + "\n" + line + "\n"
                      for line in text.splitlines(keepends=True))
    return doubled + EXTRA_LINE


def perturb_workspace(root: Path | str, probe: int) -> bool:
    """Apply probe number `probe` to the directory in place; False when there is no such probe."""
    root = Path(root)
    if probe == 0:
        _rewrite_text_files(root, _changed)
    elif probe == 1:
        for dirpath, _dirs, _files in os.walk(root, followlinks=False):
            with contextlib.suppress(OSError):
                (Path(dirpath) / EXTRA_FILE).write_text(EXTRA_LINE, encoding="utf-8")
    else:
        return False
    return True


def writes(before: dict[str, str], after: dict[str, str]) -> dict[str, str | None]:
    """What a command changed: {path: new description, or None when removed}."""
    out: dict[str, str | None] = {k: v for k, v in after.items() if before.get(k) != v}
    out.update({k: None for k in before if k not in after})
    return out
