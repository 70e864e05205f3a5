"""SWE editor calls scored by effect (`pivotrl.verifiers.edits`, through `toolcall`): an edit
that leaves the expert's file is paid whatever its arguments, one that fails or leaves another
file is not, whatever its text resembles; where the context does not show the whole file, or
the schema is not one the rule knows, the argument rules decide as before. Views are written
here in the editors' own format (`{n:6}\\t{line}` under the `cat -n` header)."""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import pytest

from fake_judge import FakeJudge
from pivotrl.export import import_nemo_gym
from pivotrl.formats.actions import parse_completion
from pivotrl.io.records import FunctionCall, Message, ToolCall, Turn, iter_valid
from pivotrl.profile.loop import unverifiable
from pivotrl.scoring import score_completions
from pivotrl.verifiers import get_verifier
from pivotrl.verifiers.edits import MAX_FILE_CHARS, known_files, parse_view, same_program

ED = "str_replace_editor"
UTIL = "def f(n):\n    for i in range(n - 1):\n        print(i)\n    return n\n"
ROWS = Path(__file__).resolve().parent / "fixtures" / "nemo_gym" / "swe_pivot.jsonl"


def view_text(path: str, content: str) -> str:
    """What the editors print for a whole-file view (their `_make_output`)."""
    body = "\n".join(f"{i + 1:6}\t{line}" for i, line in enumerate(content.expandtabs().split("\n")))
    return f"Here's the result of running `cat -n` on {path}:\n{body}\n"


def call(args: dict | str, name: str = ED, cid: str = "c9") -> Message:
    raw = args if isinstance(args, str) else json.dumps(args)
    return Message(role="assistant", tool_calls=[ToolCall(id=cid, function=FunctionCall(
        name=name, arguments=raw))])


def result(cid: str, text: str) -> Message:
    return Message(role="tool", tool_call_id=cid, content=text)


def viewed(path: str = "/repo/util.py", content: str = UTIL, **extra) -> list[Message]:
    return [call({"command": "view", "path": path, **extra}, cid="v1"),
            result("v1", view_text(path, content))]


def turn(expected: dict, context: list[Message] | None = None, name: str = ED) -> Turn:
    ctx = [Message(role="system", content="You are a coding agent working in /repo."),
           Message(role="user", content="Fix the off-by-one in util.py line 2.")]
    return Turn(id="swe/1", trajectory_id="swe", turn=1, context=ctx + (context or []),
                expected=call(expected, name))


def sr(old: str, new: str | None = None, path: str = "/repo/util.py", **extra) -> dict:
    args = {"command": "str_replace", "path": path, "old_str": old, **extra}
    if new is not None:
        args["new_str"] = new
    return args


EXPERT = sr("for i in range(n - 1):", "for i in range(n):")
V = get_verifier("toolcall")


def score(expected: dict, cand: dict | str, context=None, verifier=V, name: str = ED):
    return verifier.score(turn(expected, viewed() if context is None else context),
                          call(cand, name))


# ------------------------------------------------------------------ equivalents are paid

def test_a_shorter_unique_anchor_is_the_same_edit():
    s = score(EXPERT, sr("n - 1", "n"))
    assert (s.reward, s.valid, s.reason) == (1.0, True, "the same file after the edit")


def test_old_str_the_whole_file_is_the_same_edit():
    # Replacing the whole file with the expert's result writes the expert's file: the same effect.
    assert score(EXPERT, sr(UTIL, UTIL.replace("n - 1", "n"))).reward == 1


def test_an_insert_that_adds_what_a_str_replace_adds():
    expert = sr("        print(i)\n", "        print(i)\n        print(n)\n")
    cand = {"command": "insert", "path": "/repo/util.py", "insert_line": 3,
            "new_str": "        print(n)"}
    assert score(expert, cand).reward == 1
    assert score(expert, {**cand, "insert_line": 2}).reward == 0  # one line too early


def test_python_formatting_only_is_paid():
    expert = sr("        print(i)", "        print('i=%d' % (i), end = '')")
    cand = sr("print(i)", 'print("i=%d" % i, end="")')
    s = score(expert, cand)
    assert (s.reward, s.reason) == (1.0, "the same program after the edit (formatting only)")


def test_tabs_are_expanded_as_the_editors_expand_them():
    # the file shows 8 spaces; the editors expand a tab in old_str and new_str before matching
    expert = sr("print(i)", "print(i + 1)")
    assert score(expert, sr("\tprint(i)", "\tprint(i + 1)")).reward == 1
    assert score(expert, sr("\tprint(i)", "\tprint(i)  ")).reward == 0


def test_an_omitted_new_str_deletes_like_an_empty_one():
    expert = sr("        print(i)\n", "")
    assert score(expert, sr("        print(i)\n")).reward == 1


def test_spellings_of_one_path_and_strict_mode_nulls():
    cand = sr("n - 1", "n", path="/repo/./util.py", file_text=None, insert_line=None,
              view_range=None)
    assert score(EXPERT, cand).reward == 1


def test_edits_the_context_made_are_applied_in_order():
    first = sr("    return n\n", "    return n + 0\n")
    ctx = viewed() + [call(first, cid="e1"), result(
        "e1", "The file /repo/util.py has been edited. Here's the result of running `cat -n` on "
              "a snippet of /repo/util.py:\n     4\t    return n + 0\nReview the changes.")]
    expert = sr("    return n + 0\n", "    return n + 1\n")
    assert score(expert, sr("n + 0", "n + 1"), ctx).reward == 1
    # "return n" is unique in the shown view but no longer in the file the edit left
    assert score(expert, sr("return n\n", "return n + 1\n"), ctx).reward == 0
    # the edit's result was never shown: only the context's own success message proves it
    failed = ctx[:-1] + [result("e1", "No replacement was performed, old_str did not appear")]
    assert known_files(failed) == {}
    assert score(expert, sr("n + 0", "n + 1"), failed).reward == 0  # argument rules


def test_two_creates_of_one_new_file_need_no_context():
    expert = {"command": "create", "path": "/repo/new.py", "file_text": "X = {'a': 1}\n"}
    same = {**expert, "file_text": 'X = {"a": 1}'}
    assert score(expert, same, context=[]).reward == 1
    assert score(expert, {**expert, "file_text": "X = {'a': 2}\n"}, context=[]).reward == 0
    txt = {**expert, "path": "/repo/new.txt"}  # no formatting rule outside Python
    assert score(txt, {**txt, "file_text": 'X = {"a": 1}\n'}, context=[]).reward == 0


def test_a_trimmed_view_still_shows_the_whole_file():
    text = view_text("/repo/util.py", UTIL).rstrip()  # a harness that strips its output
    assert parse_view(text, "/repo/util.py") == UTIL
    ctx = [call({"command": "view", "path": "/repo/util.py"}, cid="v1"), result("v1", text)]
    assert score(EXPERT, sr("n - 1", "n"), ctx).reward == 1


def test_the_model_text_path_pays_it_too():
    text = '<tool_call>\n{"name": "str_replace_editor", "arguments": ' + json.dumps(
        sr("n - 1", "n")) + '}\n</tool_call>'
    s = score_completions(V, [turn(EXPERT, viewed())], [text], parse_completion)[0]
    assert (s.reward, s.valid) == (1.0, True)


def test_a_nemo_gym_row_with_a_view_is_decided_by_effect(tmp_path):
    row = json.loads(ROWS.read_text().splitlines()[1])
    assert row["expected_action"]["name"] == ED
    content = "def g(n):\n    return list(range(n - 1))\n"
    row["responses_create_params"]["input"] += [
        {"type": "function_call", "call_id": "v1", "name": ED,
         "arguments": json.dumps({"command": "view", "path": "/repo/util.py"})},
        {"type": "function_call_output", "call_id": "v1", "output": view_text("/repo/util.py", content)}]
    rows = tmp_path / "rows.jsonl"
    rows.write_text(ROWS.read_text() + json.dumps(row) + "\n")
    import_nemo_gym(rows, tmp_path / "turns.jsonl")
    plain, shown = [t for t in iter_valid(tmp_path / "turns.jsonl", Turn)
                    if t.expected.tool_calls and t.expected.tool_calls[0].args()["command"] == "str_replace"]
    anchor = call(sr("n - 1)", "n)"))
    assert V.score(shown, anchor).reward == 1
    # the fixture's own row shows no file: its arguments are compared as before
    assert V.score(plain, anchor).reward == 0
    assert V.score(plain, plain.expected).reward == 1


# ------------------------------------------------------------------ near-misses are refused

def test_create_on_a_file_the_context_shows_is_refused():
    # SWE-agent, OpenHands and Anthropic's editor all refuse `create` on an existing path: the
    # expert's fixed file is never written by it, however right its text.
    s = score(EXPERT, {"command": "create", "path": "/repo/util.py",
                       "file_text": UTIL.replace("n - 1", "n")})
    assert (s.reward, s.valid) == (0.0, True) and "exists" in s.reason


@pytest.mark.parametrize("cand, why", [
    (sr("print", "print"), "new_str equals old_str"),
    (sr("n", "m"), "occurs 7 times"),
    (sr("range(n-1)", "range(n)"), "does not occur"),
    (sr("n - 1", "n1"), "another file"),  # one character from the expert's new_str
    (sr("n - 1", "n", path="/repo/utils.py"), "not the expert's"),
    (sr("n - 1", "n", path="repo/util.py"), "not an absolute path"),
    (sr("n - 1", "n", path="/repo/x/../util.py"), "does not name one file"),
    (sr("n - 1", "n", path="/repo/util.py "), "not the expert's"),
    (sr("n - 1", "n", replace_all=True), "not in the editor's schema"),
    (sr("n - 1", "n", insert_line=2), "does not read 'insert_line'"),
    ({"command": "insert", "path": "/repo/util.py", "insert_line": 5, "new_str": "x"}, "after the final newline"),
    ({"command": "insert", "path": "/repo/util.py", "insert_line": 6, "new_str": "x"}, "outside"),
    ({"command": "insert", "path": "/repo/util.py", "insert_line": -1, "new_str": "x"}, "outside"),
    ({"command": "rewrite", "path": "/repo/util.py"}, "no command"),
])
def test_failing_or_other_edits_score_0(cand, why):
    s = score(EXPERT, cand)
    assert s.reward == 0 and why in s.reason, s


def test_a_near_identical_edit_with_another_result_is_refused():
    # NeMo-Gym's swe_pivot pays edit similarity >= 0.8 on the right file: this one would be paid.
    cand = sr("for i in range(n - 1):", "for i in range(n + 1):")
    assert difflib.SequenceMatcher(None, json.dumps(EXPERT), json.dumps(cand)).ratio() > 0.9
    assert score(EXPERT, cand).reward == 0


def test_a_docstring_or_a_comment_is_not_formatting():
    base = 'def f():\n    """Return one."""\n    return 1\n'
    ctx = viewed("/repo/m.py", base)
    expert = sr("return 1", "return 2", path="/repo/m.py")
    doc = sr('"""Return one."""\n    return 1', '"""Return two."""\n    return 2', path="/repo/m.py")
    comment = sr("return 1", "return 2  # two", path="/repo/m.py")
    assert score(expert, doc, ctx).reward == 0
    assert score(expert, comment, ctx).reward == 0  # comments carry directives (# type:, # noqa)


def test_python_syntax_newer_than_the_oldest_grammar_is_not_paid():
    assert same_program("with a as x, b as y:\n    pass\n", "with a as x, b as y :\n    pass\n")
    # one program in Python 3.9+, a SyntaxError before: the repository may run an older one
    assert not same_program("with a as x, b as y:\n    pass\n", "with (a as x, b as y):\n    pass\n")
    assert not same_program("x = f'{d[\"k\"]}'\n", 'x = f"{d[\'k\']}"\n')  # f-strings as written
    assert not same_program("x = 1\n", "x = (\n")  # a file that does not parse proves nothing


def test_two_calls_that_together_make_the_edit_are_not_decided_here():
    two = Message(role="assistant", tool_calls=[
        ToolCall(id="a", function=FunctionCall(name=ED, arguments=json.dumps(sr("n - 1", "n - 0")))),
        ToolCall(id="b", function=FunctionCall(name=ED, arguments=json.dumps(sr("n - 0", "n"))))])
    assert V.score(turn(EXPERT, viewed()), two).reward == 0  # one call each, or the argument rules


def test_the_right_edit_plus_a_surplus_one_is_not_paid():
    """The expert's edit and then another (a view, an edit of another file, the same edit again):
    the call count differs from the expert's, a proven difference whatever the first call does."""
    for extra in ({"command": "view", "path": "/repo/util.py"}, sr("x", "y", path="/repo/other.py"), EXPERT):
        both = Message(role="assistant", tool_calls=[
            ToolCall(id="a", function=FunctionCall(name=ED, arguments=json.dumps(EXPERT))),
            ToolCall(id="b", function=FunctionCall(name=ED, arguments=json.dumps(extra)))])
        assert V.score(turn(EXPERT, viewed()), both).reward == 0, extra


def test_hostile_python_is_bounded():
    deep = "(" * 5000 + "1" + ")" * 5000
    ctx = viewed("/repo/m.py", "x = 1\n")
    s = score(sr("x = 1", "x = 2", path="/repo/m.py"), sr("1", deep, path="/repo/m.py"), ctx)
    assert (s.reward, s.valid) == (0.0, True)
    assert not same_program("x = 1\n", "x = 1\x00\n")


@pytest.mark.parametrize("cand", [
    sr(3, "n"), sr("n - 1", ["n"]), {"command": 5, "path": "/repo/util.py"},
    {"command": "insert", "path": "/repo/util.py", "insert_line": "3", "new_str": "x"},
    {"command": "insert", "path": "/repo/util.py", "insert_line": True, "new_str": "x"},
    {"command": "str_replace", "path": None, "old_str": "n - 1"},
])
def test_malformed_arguments_are_invalid_not_a_crash(cand):
    s = score(EXPERT, cand)
    assert (s.reward, s.valid) == (0.0, False), s


@pytest.mark.parametrize("text", ['{"command": "str_replace", "path": "/repo/util.py"',
                                  '[1, 2]', '{"command": "str_replace", "command": "create"}'])
def test_arguments_that_are_no_object_are_refused(text):
    s = score(EXPERT, text)
    assert s.reward == 0 and not s.valid


# ------------------------------------------------------------------ where the rule does not decide

def test_a_view_range_is_not_the_whole_file():
    ctx = viewed(view_range=[1, 4])
    s = score(EXPERT, sr("n - 1", "n"), ctx)
    assert s.reward == 0 and "old_str" in s.reason  # the argument rules, as before
    assert score(EXPERT, EXPERT, ctx).reward == 1


@pytest.mark.parametrize("ctx", [
    [call({"command": "view", "path": "/repo/util.py"}, cid="v1"),
     result("v1", view_text("/repo/util.py", UTIL)[:-40] + "<response clipped><NOTE>...</NOTE>\n")],
    [call({"command": "view", "path": "/repo/util.py"}, cid="v1"),
     result("v1", view_text("/repo/util.py", UTIL).replace("     3\t", "     4\t"))],
    [call({"command": "view", "path": "/repo/util.py"}, cid="v1"),
     result("v1", view_text("/repo/util.py", UTIL.rstrip("\n")))],  # cut at a line, or no newline
    [call({"command": "view", "path": "/repo/util.py"}, cid="v1"),
     result("v1", view_text("/repo/other.py", UTIL))],
    viewed() + [call({"command": "sed -i s/1/2/ /repo/util.py"}, name="execute_bash", cid="b1"),
                result("b1", "")],
    viewed() + [call({"command": "undo_edit", "path": "/repo/util.py"}, cid="u1"),
                result("u1", "Last edit undone")],
], ids=["clipped", "misnumbered", "no-final-newline", "other-path", "shell-after", "undo-after"])
def test_files_the_context_does_not_prove_fall_back(ctx):
    assert known_files(turn(EXPERT, ctx).context) == {}
    assert score(EXPERT, sr("n - 1", "n"), ctx).reward == 0
    assert score(EXPERT, EXPERT, ctx).reward == 1


def test_a_think_call_keeps_the_file():
    ctx = viewed() + [call({"thought": "fix it"}, name="think", cid="t1"), result("t1", "")]
    assert score(EXPERT, sr("n - 1", "n"), ctx).reward == 1


def test_unknown_editor_schemas_are_unverifiable_not_zero_by_accident():
    odd = {"command": "apply_diff", "path": "/repo/util.py", "diff": "-a\n+b"}
    t = turn(odd, viewed())
    assert "outside the editor schema" in unverifiable(V, t)
    assert V.score(t, call(odd)).reward == 1  # the argument rules still run, no exception
    assert V.score(t, call({**odd, "diff": "-a\n+c"})).reward == 0
    claude = turn({"file_path": "/repo/util.py", "old_string": "n - 1", "new_string": "n"},
                  viewed(), name="Edit")
    assert "Claude Code" in unverifiable(V, claude)
    extra = turn(sr("n - 1", "n", security_risk="LOW"), viewed())
    assert "security_risk" in unverifiable(V, extra)
    assert unverifiable(V, turn(EXPERT, viewed())) == ""
    assert unverifiable(V, turn({"command": "view", "path": "/repo/util.py"})) == ""


def test_a_decided_difference_is_never_the_judges():
    srv = FakeJudge(lambda a, b: "YES")
    try:
        judged = get_verifier("toolcall", unproven_rule="judge", free_text=["old_str", "new_str"],
                              judge={"base_url": srv.url})
        assert score(EXPERT, sr("n - 1", "n + 1"), verifier=judged).reward == 0
        assert score(EXPERT, sr("n - 1", "n"), verifier=judged).reward == 1
        assert srv.requests == 0
    finally:
        srv.close()


# ------------------------------------------------------------------ bounds

def test_huge_files_are_not_read():
    big = "x = 1\n" * (MAX_FILE_CHARS // 6 + 1)
    assert parse_view(view_text("/repo/big.py", big), "/repo/big.py") is None
    assert known_files(viewed("/repo/big.py", big)) == {}

