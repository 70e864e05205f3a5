"""The literals a shell command names, and probe lines on both sides of each of them.

A command that counts `grep -c ERROR` lines, keeps `awk '$3 > 100'` rows or drops
`grep -v DEBUG` lines is right only because of its literals; a workspace that holds no line near
them cannot tell it from a command that names another literal (`$3 > 90`) or none (`cp`). So
the probes (`pivotrl.verifiers.probes`) add, to every text file, lines in the file's own shapes
that sit on both sides of every literal of the expert's command:

- a number N: each number of a template line set, one at a time, to N-1, N and N+1 (the last
  decimal place for a decimal), so `> N`, `>= N` and `> N-1` each keep another set of lines;
- a date D (YYYY-MM-DD): each date of a template line set to the day before, D and the day after;
- a word W (letters): W put in place of a word of a template line, and its near misses
  (a letter dropped at either end, one replaced, case swapped, W inside a longer word), so
  a filter term that is dropped (`cp` for `grep -v W`), changed, weakened or widened selects
  other lines; a template line that holds W also appears with W replaced by another word.

Only the shapes of the file are used (its lines with their tokens replaced, delimiters kept):
`cut -d, -f2` and `awk -F, '{print $2}'` differ only on a line without a comma, which a CSV
file never holds, so no probe adds one.

Literals are read from the command's words that are not command names or short-option
letters: arguments (`ERROR`, `100`, `app.log` → app, log), option values (`-n3`, `--lines=3`,
`-d,`) and quoted programs (`'$3 > 100'` → 3, 100). A candidate's own literals that the
expert's command does not name get a probe of their own (the expert's run there is cached per
set of literals), up to `MAX_CANDIDATE_LITERALS`: a candidate naming more scores 0, so a policy
cannot buy probes by planting literals, and a planted filter (`| grep -v ZZ`) meets lines it
removes.
"""

from __future__ import annotations

import datetime as dt
import random
import re
import shlex

MAX_LITERALS = 32  # of the expert's command: the first ones by position (a probe stays small)
# A candidate naming more new literals than this scores 0: room for an equivalent written
# another way (`python3 -c "import csv ..."` for `cut | sort`), not for a planted list.
MAX_CANDIDATE_LITERALS = 24
TEMPLATES_PER_LITERAL = 1  # template lines each literal is put into, per file and draw
POSITIONS_PER_TEMPLATE = 4  # tokens of one template line a literal replaces, one at a time
_DATE = r"\d{4}-\d{2}-\d{2}"
_NUMBER = r"-?\d+(?:\.\d+)?"
# A template line's tokens: dates first (a date is not three numbers), then numbers, then words.
_LINE_TOKEN = re.compile(rf"(?<![\w.])({_DATE})(?![\w])|(\d+(?:\.\d+)?)|([A-Za-z]+)")
_COMMAND_TOKEN = re.compile(rf"({_DATE})|({_NUMBER})|([A-Za-z]+)")
# Operators after which the next word names a command (its name is not a literal of the data),
# and words that, in a command's place, leave the place to the next word.
_OPERATORS = {"|", "||", "&&", ";", "&", "(", "|&"}
_PREFIXES = {"{", "!", "then", "do", "else", "elif", "if", "while", "until", "xargs", "time",
             "env", "exec", "command", "nice", "nohup", "sudo"}


def command_literals(text: str, limit: int = MAX_LITERALS) -> list[tuple[str, str]]:
    """[(kind, value)] of the literals `text` (one or more shell commands) names, kind "date",
    "number" or "word", in order of first appearance, at most `limit`."""
    out: list[tuple[str, str]] = []
    for line in text.splitlines():
        for word in _data_words(line):
            for m in _COMMAND_TOKEN.finditer(word):
                lit = ("date", m.group(1)) if m.group(1) else ("number", m.group(2).lstrip("-")) \
                    if m.group(2) else ("word", m.group(3))
                if lit not in out:
                    out.append(lit)
    return out[:limit]


def new_literals(candidate: str, expert: str) -> list[tuple[str, str]]:
    """The candidate's literals that the expert's command does not name (all of them, uncut:
    the caller compares their number with MAX_CANDIDATE_LITERALS)."""
    known = set(command_literals(expert, limit=1 << 30))
    return [lit for lit in command_literals(candidate, limit=1 << 30) if lit not in known]


def _data_words(line: str) -> list[str]:
    """The words of one command line that can hold data literals (module docstring)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        words = list(lexer)
    except ValueError:  # an unclosed quote: read it as whitespace-separated words
        words = line.split()
    out, command_next = [], True
    for w in words:
        if set(w) <= set(";&|()<>"):  # an operator or a redirection
            command_next = w in _OPERATORS
            continue
        if command_next and (w in _PREFIXES or re.fullmatch(r"\w+=\S*", w)):
            if "=" in w:
                out.append(w)  # X=5 cmd: the assignment is data
            continue
        if command_next:
            command_next = False  # the command's name
            continue
        if w.startswith("--") and "=" in w:
            out.append(w.split("=", 1)[1])  # --lines=3, --field-separator=,
        elif w.startswith("-") and len(w) > 1 and not re.fullmatch(_NUMBER, w):
            out.append(re.sub(r"^-+[A-Za-z]*", "", w))  # -n3 -> 3, -la -> ""
        else:
            out.append(w)
    return out


# ---------------------------------------------------------------- probe lines


def literal_lines(lines: list[str], literals: list[tuple[str, str]], rng: random.Random,
                  other_word, templates: int = TEMPLATES_PER_LITERAL,
                  positions: int = POSITIONS_PER_TEMPLATE, exact: bool = True,
                  near: bool = True) -> list[str]:
    """New lines in the shapes of `lines` (a file's) on both sides of each literal (module
    docstring); `other_word(rng, like)` draws a replacement word. Without `exact`, a word
    literal's near misses come without the word itself: one file holding `ERRO` lines but no
    `ERROR` line is what tells `grep -l ERRO *` from `grep -l ERROR *` (the probes alternate it
    over files and draws). Without `near`, a word is put in as it is, with no near misses (a
    candidate's own words: what its planted filter acts on). Empty when the file has no line
    with a token of a literal's kind."""
    shapes = [ln for ln in dict.fromkeys(lines) if ln.strip()]
    out: list[str] = []
    for kind, value in literals:
        group = {"date": 1, "number": 2, "word": 3}[kind]
        fit = [t for t in shapes if any(m.group(group) for m in _LINE_TOKEN.finditer(t))]
        for template in rng.sample(fit, min(len(fit), templates)):
            spans = [m.span(group) for m in _LINE_TOKEN.finditer(template) if m.group(group)]
            for a, b in rng.sample(spans, min(len(spans), positions)):
                old = template[a:b]
                for v in (_neighbours(kind, value, old, rng, other_word)
                          if near or kind != "word" else [value]):
                    if exact or kind != "word" or v != value:
                        out.append(template[:a] + v + template[b:])
    return out


def _neighbours(kind: str, value: str, old: str, rng: random.Random, other_word) -> list[str]:
    if kind == "number":
        return _number_neighbours(value)
    if kind == "date":
        try:
            day = dt.date.fromisoformat(value)
        except ValueError:
            return [value]
        return [str(day + dt.timedelta(days=d)) for d in (-1, 0, 1)]
    w = value
    i = rng.randrange(len(w))
    other = rng.choice([c for c in "abcdefghijklmnopqrstuvwxyz" if c != w[i].lower()])
    near = [w, w.swapcase(), w[:i] + other + w[i + 1:], w + other, other + w]
    if len(w) > 1:
        near += [w[:-1], w[1:]]
    if old == w:  # the template holds the word: the same line without it
        near.append(other_word(rng, w))
    return list(dict.fromkeys(near))


def _number_neighbours(value: str) -> list[str]:
    whole, _, frac = value.partition(".")
    scale = 10 ** len(frac)
    n = int(whole + frac) if whole + frac else 0
    out = []
    for v in (n - 1, n, n + 1):
        if v < 0:
            continue
        width = len(whole + frac) if len(whole) > 1 and whole.startswith("0") else len(frac) + 1
        text = str(v).rjust(width, "0")  # "03" stays two digits
        out.append(f"{text[:-len(frac)]}.{text[-len(frac):]}" if frac else text)
    return out
