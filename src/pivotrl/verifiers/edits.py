"""`edits`: an editor call (SWE pivots) is scored by the file it leaves, not by its arguments.

`toolcall` asks `EditRule.score` when the expert and the candidate each made one call to one
editor tool; None is "not decided here" (the argument rules apply). Each part, and why it is safe:

- Schemas (`EDITOR_TOOLS`): the str_replace_editor family of Anthropic's reference editor
  (computer-use-demo `tools/edit.py`) and its ports, SWE-agent's `tools/edit_anthropic` and
  OpenHands' `OHEditor` (openhands-aci). Only create, str_replace and insert are edits; view and
  undo_edit go to the argument rules. An argument the schema does not name, or one the command
  does not read given what the editors do not all ignore, has no modelled effect: the expert's
  call is not decided, the candidate's scores 0. Other editors (`OTHER_EDITORS`): unverifiable.
- The file: one the context shows whole, the latest `view` of that path without `view_range` in
  the editors' format (the `cat -n` header, `{n:6}\t{line}` per line) with the context's own
  successful edits applied on top in order. A clipped or misnumbered view, a line the format does
  not make, no final newline: not read (a cut view would pass for a whole file). Any other tool's
  call forgets every file (a shell may change any); an edit without the editor's success message
  forgets its file. The editors show tabs expanded and newlines universal, and apply str_replace
  and insert to exactly that text (`expandtabs()` on file and strings): the view decides the result.
- Only where the three editors agree: str_replace needs `old_str` exactly once (the
  non-overlapping count of `str.count` and `re.finditer`) and unequal to `new_str`; insert puts
  `new_str`'s lines after line `insert_line` (0 = top) within the lines of a file ending in a
  newline (elsewhere Anthropic's split-join and OpenHands' line copy differ: not proven); create
  refuses an existing path. Paths must be absolute; spellings pathlib (the editors' own) makes one
  string are one file; a `..` part is never folded (a symlink decides where it leads).
- The expert's edit must be well formed and apply, else nothing is decided. The candidate scores 1
  only when its edit applies and the files are equal, or are `.py` files of one program
  (`same_program`); failing, another file or another content scores 0, however alike the text.
  Two creates of one path need no context: both write their text, or both fail (the file exists).
"""

from __future__ import annotations

import ast
import io
import tokenize
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from pivotrl.io.records import Message, Turn
from pivotrl.verifiers.base import Score

EDITOR_TOOLS = {
    "str_replace_editor": "Anthropic text_editor_20241022/20250124 (computer-use-demo "
                          "tools/edit.py), SWE-agent tools/edit_anthropic, OpenHands CodeAct",
    "str_replace_based_edit_tool": "Anthropic text_editor_20250429/20250728: the same commands "
                                   "without undo_edit, modelled as the reference implementation",
}
OTHER_EDITORS = {  # name: (keys that identify the schema, whose schema it is)
    "Edit": ({"file_path", "old_string", "new_string"}, "Claude Code"),
    "MultiEdit": ({"file_path", "edits"}, "Claude Code"),
    "Write": ({"file_path", "content"}, "Claude Code"),
    "apply_patch": ({"input"}, "OpenAI Codex CLI"),
    "replace_in_file": ({"path", "diff"}, "Cline"),
    "write_to_file": ({"path", "content"}, "Cline"),
}
PURE_TOOLS = {"think": "OpenHands CodeAct: records a thought, touches no file"}
EDITS = ("create", "str_replace", "insert")
COMMANDS = EDITS + ("view", "undo_edit")
READS = {"create": ("file_text",), "str_replace": ("old_str", "new_str"),
         "insert": ("insert_line", "new_str")}
KEYS = frozenset({"command", "path", "file_text", "old_str", "new_str", "insert_line",
                  "view_range"})
STRING_KEYS = frozenset({"file_text", "old_str", "new_str"})
VIEW_HEADER = "Here's the result of running `cat -n` on {}:\n"
CLIPPED = "<response clipped>"  # the editors' truncation notice starts so
MAX_FILE_CHARS = 400_000  # larger files are not read (bounds the work per sample)
OLDEST_GRAMMAR = (3, 7)  # the oldest grammar ast.parse offers: newer syntax is not paid


class NotModelled(Exception):
    """Outside what this module models: proves nothing either way."""


class Malformed(Exception):
    """Arguments of types the editor rejects before running the call."""


class ToolError(Exception):
    """A call the editor runs and refuses (its own error message)."""


REFUSED = (NotModelled, Malformed, ToolError)


@dataclass(frozen=True)
class Edit:
    command: str
    path: str  # as pathlib spells it
    text: str  # file_text (create) or new_str
    old: str = ""  # str_replace
    line: int = 0  # insert


def normal_path(path: Any) -> str:
    """The path as the editors' pathlib spells it; raises where they refuse it or where the
    spelling does not decide the file ('..' follows symlinks, a leading '//' is the system's)."""
    if not isinstance(path, str):
        raise Malformed("path is not a string")
    if not path.startswith("/") or "\x00" in path:
        raise ToolError(f"path {path[:80]!r} is not an absolute path")
    if path.startswith("//") or ".." in PurePosixPath(path).parts:
        raise NotModelled(f"path {path[:80]!r} does not name one file by its spelling")
    return str(PurePosixPath(path))


def _string(args: dict, key: str, default: str | None = None) -> str:
    value = default if args.get(key) is None else args[key]
    if value is None:
        raise ToolError(f"parameter {key!r} is required")
    if not isinstance(value, str):
        raise Malformed(f"{key} is not a string")
    return value


def schema_problem(args: dict) -> str:
    """What of a call lies outside the modelled schema ('' for none): an unknown command or
    argument (OpenHands refuses one, Anthropic's ignores it), or one the command does not read
    given a non-string (SWE-agent's command line types `insert_line`, `view_range` always)."""
    command = args.get("command")
    if not isinstance(command, str) or command not in COMMANDS:
        return f"command {str(command)[:40]!r} is not one of {', '.join(COMMANDS)}"
    unknown = sorted(set(args) - KEYS) if command in EDITS else []
    if unknown:
        return f"argument {unknown[0][:40]!r} is not in the editor's schema"
    for key in sorted(KEYS - {"command", "path", *READS.get(command, KEYS)}):
        value = args.get(key)
        if value is not None and not (key in STRING_KEYS and isinstance(value, str)):
            return f"{command} does not read {key!r}, given {type(value).__name__}"
    return ""


def read_edit(args: dict) -> Edit | None:
    """The edit a call makes; None for a known command that edits nothing (view, undo_edit).
    Raises Malformed, ToolError or NotModelled (see the module docstring)."""
    command = args.get("command")
    if not isinstance(command, str):
        raise Malformed("command is missing or not a string")
    if command not in COMMANDS:
        raise ToolError(f"the editor has no command {command[:40]!r}")
    if command not in EDITS:
        return None
    if schema_problem(args):
        raise NotModelled(schema_problem(args))
    path = normal_path(args.get("path"))
    if command == "create":
        return Edit(command, path, _string(args, "file_text"))
    if command == "str_replace":  # an omitted new_str deletes old_str in all three editors
        return Edit(command, path, _string(args, "new_str", ""), old=_string(args, "old_str"))
    line = args.get("insert_line")
    if line is None:
        raise ToolError("parameter 'insert_line' is required")
    if not isinstance(line, int) or isinstance(line, bool):
        raise Malformed("insert_line is not an integer")
    return Edit(command, path, _string(args, "new_str"), line=line)


def replace(base: str, old: str, new: str) -> str:
    """str_replace on the text the editor reads (tabs expanded, as it expands them)."""
    old, new = old.expandtabs(), new.expandtabs()
    found = base.count(old)
    if found != 1:
        raise ToolError("old_str does not occur in the file" if not found
                        else f"old_str occurs {found} times: the editor requires one")
    if old == new:  # SWE-agent and OpenHands refuse; Anthropic's rewrites the same file
        raise ToolError("new_str equals old_str: no change")
    return base.replace(old, new, 1)


def insert(base: str, line: int, new: str) -> str:
    """insert after line `line` (0 = top), where the three editors give one file."""
    if base and not base.endswith("\n"):
        raise NotModelled("insert into a file without a final newline differs between editors")
    lines = base.count("\n")
    if line == lines + 1:
        raise NotModelled("insert after the final newline: Anthropic's accepts, OpenHands' refuses")
    if not 0 <= line <= lines:
        raise ToolError(f"insert_line {line} is outside the file's lines [0, {lines}]")
    parts = base.split("\n")
    return "\n".join(parts[:line] + new.expandtabs().split("\n") + parts[line:])


def apply(edit: Edit, base: str | None) -> str:
    """The file the edit writes; `base` is the file as the editor reads it, None when unknown."""
    if edit.command == "create":
        if base is not None:
            raise ToolError("create refuses a path that exists")
        return edit.text
    if base is None:
        raise NotModelled("the file's whole content is not known")
    if edit.command == "str_replace":
        return replace(base, edit.old, edit.text)
    return insert(base, edit.line, edit.text)


def parse_view(output: str, path: str) -> str | None:
    """The whole file a reference-format `view` of `path` shows, or None when the output is
    anything else (another header, a clipped or renumbered body, a file without final newline)."""
    header = VIEW_HEADER.format(path)
    if not output.startswith(header) or CLIPPED in output or "\r" in output:
        return None
    rows = output[len(header):].rstrip("\n").split("\n")
    text = []
    for n, row in enumerate(rows, 1):
        prefix = f"{n:6}\t"
        if row.startswith(prefix):
            text.append(row[len(prefix):])
        elif n == len(rows) and row == prefix[:-1]:  # a harness that trimmed the output
            text.append("")
        else:
            return None
    content = "\n".join(text)
    ok = content.endswith("\n") and "\t" not in content and len(content) <= MAX_FILE_CHARS
    return content if ok else None


def _text_of(message: Message) -> str | None:
    """A tool result's text: a string, or one text part."""
    content = message.content
    part = content[0] if isinstance(content, list) and len(content) == 1 else None
    if isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"):
        content = part.get("text")
    return content if isinstance(content, str) else None


def _succeeded(edit: Edit, output: str | None) -> bool:
    """Did the context's own edit succeed? Only the editors' own success messages say so."""
    done = (f"File created successfully at: {edit.path}" if edit.command == "create"
            else f"The file {edit.path} has been edited.")
    return output is not None and output.startswith(done)


def _calls_of(message: Message) -> list[tuple[str | None, str, Any, str | None]]:
    """(id, name, arguments or None when unreadable, editor path or None) of each call."""
    out = []
    for call in message.tool_calls or []:
        try:
            args = call.args()
        except (ValueError, TypeError, RecursionError):
            args = None
        try:
            path = normal_path(args.get("path")) if isinstance(args, dict) else None
        except REFUSED:
            path = None
        out.append((call.id, call.function.name, args, path))
    return out


def known_files(context: list[Message]) -> dict[str, str]:
    """Path -> whole content as the editor reads it, for the files the context proves."""
    files: dict[str, str] = {}
    pending: dict[str, tuple[str, Edit | None, str | None]] = {}  # call id -> (path, edit, base)
    for message in context:
        if message.role == "tool":
            path, edit, base = pending.pop(message.tool_call_id or "", (None, None, None))
            output = _text_of(message)
            if path is None:
                continue
            if edit is None:  # a whole-file view: what it shows, or nothing known
                shown = parse_view(output, path) if output is not None else None
                files.pop(path, None)
                if shown is not None:
                    files[path] = shown
            elif _succeeded(edit, output):
                try:  # read back as the editors read: universal newlines, tabs expanded
                    after = apply(edit, base).replace("\r\n", "\n").replace("\r", "\n")
                except REFUSED:
                    continue
                if len(after) <= MAX_FILE_CHARS:
                    files[path] = after.expandtabs()
        elif message.role == "assistant":
            calls = _calls_of(message)
            paths = [c[3] for c in calls if c[1] in EDITOR_TOOLS]
            for call_id, name, args, path in calls:
                if name in PURE_TOOLS:
                    continue
                if name not in EDITOR_TOOLS or not isinstance(args, dict):
                    files.clear()  # another tool may have changed any file
                    pending.clear()
                    continue
                alone = bool(call_id) and path is not None and paths.count(path) == 1
                _note_call(files, pending, call_id if alone else None, args, path)
    return files


def _note_call(files: dict, pending: dict, call_id: str | None, args: dict,
               path: str | None) -> None:
    """Record one editor call of the context: what its result will prove (where `call_id`
    names its result alone), and what it forgets."""
    if args.get("command") == "view":  # reads only; a whole-file view proves the content
        if path is not None and args.get("view_range") is None and call_id:
            pending[call_id] = (path, None, None)
        return
    if path is None:
        files.clear()  # an edit of a path that is not one spelling: any file may be it
        return
    base = files.pop(path, None)  # unknown until the editor's own message proves the result
    try:
        edit = read_edit(args)
    except REFUSED:
        return
    if edit is not None and call_id:
        pending[call_id] = (path, edit, base)


def _program(source: str) -> tuple:
    """The syntax tree (also under the oldest grammar), the comments and the f-strings as
    written (their spelling is grammar-dependent, PEP 701) of a Python file."""
    tree = ast.parse(source)
    inner = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr)
             for v in ast.walk(n) if v is not n}
    fstrings = [ast.get_source_segment(source, n) for n in ast.walk(tree)
                if isinstance(n, ast.JoinedStr) and id(n) not in inner]
    if None in fstrings:
        raise ValueError("an f-string without its source")
    comments = [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline)
                if t.type == tokenize.COMMENT]
    oldest = ast.parse(source, feature_version=OLDEST_GRAMMAR)
    return ast.dump(tree), ast.dump(oldest), comments, fstrings


def same_program(a: str, b: str) -> bool:
    """Are two Python files one program written two ways? Equal syntax trees (which drop
    spacing, line breaks, redundant parentheses and the quote style of plain strings, and keep
    every value, name and docstring), also under the oldest grammar ast offers (a construct newer
    than that, such as a parenthesised `with`, is not paid: the repository may run an older
    Python), the same comments in order (comments carry directives: the coding cookie,
    `# type:`, `# noqa`, `# pragma`) and every f-string spelled alike."""
    if max(len(a), len(b)) > MAX_FILE_CHARS:
        return False
    try:
        return _program(a) == _program(b)
    except Exception:  # noqa: BLE001  (a file ast or tokenize cannot read proves nothing)
        return False


def _refusal(exc: Exception) -> Score:
    """A candidate's refused edit: malformed (invalid), refused by the editor, or not proven."""
    if isinstance(exc, Malformed):
        return Score(0.0, False, f"editor call with malformed arguments: {exc}")
    why = "the editor would refuse the edit" if isinstance(exc, ToolError) else "edit not proven"
    return Score(0.0, True, f"{why}: {exc}")


def decide(files: dict[str, str], expected: Edit, cand_args: dict) -> Score | None:
    """The candidate's score against the expert's edit on the files the context shows (None:
    not decided here). A path the context does not show is unknown: only create applies there."""
    try:
        cand = read_edit(cand_args)
    except REFUSED as exc:
        return _refusal(exc)
    if cand is None:
        return None  # a view or an undo: the argument rules (another command) decide
    if cand.path != expected.path:
        return Score(0.0, True, f"edits {cand.path[:80]!r}, not the expert's {expected.path!r}")
    base = files.get(expected.path)
    try:
        after = apply(expected, base)
    except REFUSED:
        return None  # the expert's edit does not apply to what the context shows
    try:
        got = apply(cand, base)
    except REFUSED as exc:
        return _refusal(exc)
    if after == got:
        return Score(1.0, True, "the same file after the edit")
    if expected.path.endswith(".py") and same_program(after, got):
        return Score(1.0, True, "the same program after the edit (formatting only)")
    return Score(0.0, True, "the edit leaves another file than the expert's")


def unverifiable_edit(expected: Message) -> str:
    """Why the expert's editor call cannot be verified by effect here ('' when it can, or is
    no edit): an editor of another schema, or a str_replace_editor call outside the schema."""
    for _, name, args, _ in _calls_of(expected):
        keys, whose = OTHER_EDITORS.get(name, (None, ""))
        if not isinstance(args, dict):
            continue
        if keys is not None and keys <= set(args):
            return f"{name!r} is {whose}'s editor, whose edits pivotrl does not apply"
        problem = schema_problem(args) if name in EDITOR_TOOLS else ""
        if problem:
            return f"{name!r} call outside the editor schema pivotrl knows: {problem}"
    return ""


class EditRule:
    """`toolcall`'s entry: one editor call against the expert's by effect, or None. Caches
    the files each turn's context proves (K samples of a turn share them)."""

    def __init__(self) -> None:
        self._files: dict[int, tuple[list, dict[str, str]]] = {}

    def files(self, turn: Turn) -> dict[str, str]:
        hit = self._files.get(id(turn.context))
        if hit is None or hit[0] is not turn.context:
            if len(self._files) > 256:
                self._files.clear()
            hit = self._files[id(turn.context)] = (turn.context, known_files(turn.context))
        return hit[1]

    def score(self, turn: Turn, expected: tuple[str, dict], candidate: tuple[str, dict]) -> Score | None:
        """By effect, when both calls are to one editor tool and the expert's is an edit that
        applies; None otherwise (the argument rules decide)."""
        (en, ea), (cn, ca) = expected, candidate
        if en not in EDITOR_TOOLS or cn != en:
            return None
        try:
            edit = read_edit(ea)
        except REFUSED:
            return None
        return None if edit is None else decide(self.files(turn), edit, ca)

    @staticmethod
    def unverifiable(turn: Turn) -> str:
        return unverifiable_edit(turn.expected)
