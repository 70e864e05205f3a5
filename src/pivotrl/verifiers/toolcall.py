"""`toolcall`: schema-aware functional equivalence of tool calls.

Does the candidate *do* what the expert's action does? The principle (of every rule here and in
`pivotrl.verifiers.arguments` and `pivotrl.verifiers.messages`): **pay only what is proven.** A
value pays when it is the same JSON value, or when a rule the schema or the world grants proves
it means the same; what no rule proves is 0, or, where the user configured the judge, the
judge's question. No similarity threshold pays anything, and strings are data: no whitespace,
case or Unicode rule unless the user declares an environment that normalises (`normalize`).

- Only an assistant message is an action; content parts other than text (a refusal, an
  image) are more than a text and score 0; a call of another `type` than the expert's scores 0;
  an arguments text with a duplicate key names no one call (parsers differ on which wins): 0.
- Call vs message: an expert call answered by a message scores 0, and vice versa. When both
  called tools, text content around the calls is ignored (the calls are the action).
- Only offered tools pay: when the turn offers tools, a call to a tool it does not offer, or an
  argument the tool's schema does not name, is a wrong action (the environment would reject it
  or, worse, run something it never offered), whatever the expert did.
- Calls are a multiset: same number of calls, and an optimal one-to-one matching (order ignored)
  in which every pair is equivalent. Otherwise 0; with `partial_credit`, a candidate whose every
  call matches one of the expert's earns matched / expert calls, and any extra or wrong call
  (which may be destructive) still earns 0.
- A pair is equivalent when the function name is the same and the arguments are equal *as
  values* under the function's schema (from the turn's `tools`): the rules of
  `pivotrl.verifiers.arguments`.
- When the turn names a world (`metadata["world"]`) whose class defines `canonical_call` (see
  `pivotrl.verifiers.world`), that world's own rule decides argument equivalence for the calls it
  knows: the world executes both calls identically, so they are the same action there; a call
  it accepts and one it rejects are never the same action, whatever a schema rule says.
- `unproven_rule: judge`: an action whose calls match once the *unproven* differences (free text
  that differs) are allowed, and only then, goes to the LLM judge, which sees both whole actions
  in both orders. A proven difference (another number, id, type, enum value, function or call
  count) is never a judge's question.
- A final message: the same text (ends trimmed) pays; at a turn whose world defines
  `canonical_message` the world reads both (`same_answer`): answers it reads as the same score
  1, answers it reads as different 0; any other text scores 0 or, with `message_rule: judge`,
  goes to the judge (`pivotrl.verifiers.messages`). A message is never a free pass.
- An editor call (str_replace_editor family) whose arguments differ from the expert's is
  decided by its effect where `pivotrl.verifiers.edits` can apply both edits to a file the
  context shows whole: the same resulting file scores 1, a failing edit or another file 0 (a
  proven difference, never a judge's question); elsewhere the rules above decide. A turn whose
  expert edits with an editor schema it does not know is `unverifiable`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pivotrl.io.records import Message, Turn
from pivotrl.formats.actions import call_arguments
from pivotrl.verifiers.arguments import ArgumentComparer, is_unproven
from pivotrl.verifiers.base import Score
from pivotrl.verifiers.edits import EditRule
from pivotrl.verifiers.judge import JudgeVerifier
from pivotrl.verifiers.messages import compare_messages, plain_text
from pivotrl.verifiers.schema import build_index, not_offered, schema_index  # noqa: F401
from pivotrl.verifiers.world import action_rule, same_answer


class ToolcallConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    message_rule: Literal["exact", "judge", "any"] = Field(
        "exact", description="How a message is judged when the expert sent a message: 'exact' "
                             "(the same text, ends trimmed, or the same answer as the turn's "
                             "world reads it: pivotrl.verifiers.messages; any other text scores "
                             "0), 'judge' (those pay, any other text goes to the LLM judge), "
                             "'any' (every message scores 1: NeMo-Gym's rule, a known reward "
                             "leak, only for ablations).")
    normalize: list[Literal["whitespace", "case", "unicode", "bfcl"]] = Field(
        default_factory=list, description="String rules for an environment that normalises "
                                          "strings itself (default none: strings are data, a "
                                          "padded or re-spaced value is another value). "
                                          "'whitespace' (runs of whitespace as one space, ends "
                                          "trimmed, one-line strings only), 'case' (ASCII case), "
                                          "'unicode' (NFC), only in strings declared free text "
                                          "(free_text, or contentMediaType: text/plain in the "
                                          "schema), never in identifiers or code; "
                                          "'bfcl': BFCL's checker rule on every string (drop "
                                          "' ,./-_*^', lower-case) and dotted tool names called "
                                          "with underscores. Each is documented with where it "
                                          "holds in pivotrl.verifiers.arguments.")
    free_text: list[str] = Field(
        default_factory=list, description="Parameters whose strings are prose in your "
                                          "environment, by path: 'subject', 'message.body', "
                                          "array items as 'items.note'. The normalize folds "
                                          "(whitespace, case, unicode) apply to these and to "
                                          "strings whose schema says contentMediaType: "
                                          "text/plain, and to nothing else (default none: a "
                                          "parameter's name never grants a fold; 'table' or "
                                          "'query' may hold identifiers or code).")
    unproven_rule: Literal["reject", "judge"] = Field(
        "reject", description="Calls that would match if the unproven differences (free text "
                              "that differs: spacing, case, punctuation, words) were allowed: "
                              "'reject' scores them 0 (precision first), 'judge' asks the LLM "
                              "judge about the whole action in both orders. A proven difference "
                              "(number, id, type, enum value, function) is never asked.")
    numeric_strings: bool = Field(
        False, description="Accept a canonical numeric string for an integer/number parameter "
                           "('2' for 2), as lax backends do (pydantic lax mode, FastAPI). Default "
                           "False, precision first: JSON Schema, strict function calling and "
                           "executors that take JSON types literally (BFCL: '2' * 3 is '222') "
                           "reject it; on BFCL's mutated calls turning it on dropped precision "
                           "0.993 -> 0.893. Where the turn names a world, the world's own rule "
                           "(canonical_call) decides instead, whatever this says.")
    int_float_equal: bool = Field(
        False, description="Treat an int and a float of the same value (5 and 5.0) as one value "
                           "for integer and number parameters, for a backend that converts. "
                           "Default False: a record that stores what it is given stores 5.0 "
                           "where the expert's stored 5 (a state compared by its text differs), "
                           "typed executors reject 5.0 for an int (range(5.0)), BFCL's checker "
                           "rejects a float for an integer. normalize: [bfcl] grants it for "
                           "number parameters only, as BFCL does.")
    partial_credit: bool = Field(
        False, description="With several expert calls, a candidate whose every call matches one of "
                           "the expert's earns matched / expert calls instead of 0; an extra or "
                           "wrong call (possibly destructive) still earns 0. Profiling and pivot "
                           "selection count a reward >= SUCCESS_THRESHOLD (0.5, "
                           "pivotrl.profile) as a success, so with this on, half of the "
                           "expert's calls counts as a success there.")
    max_action_chars: int = Field(
        32768, description="A candidate whose text + arguments exceed this many characters "
                           "scores 0 (runaway output is not an action).")
    judge: dict[str, Any] = Field(
        default_factory=dict, description="Config of the 'judge' verifier, for "
                                          "message_rule='judge' and unproven_rule='judge'.")


def _calls(message: Message, measure: bool = True) -> tuple[list[tuple[str, dict, str | None]], int]:
    """(name, arguments, arguments text) of each call, and the size of the arguments (their
    text, or their JSON where given as objects: every call counts towards the limit)."""
    out, size = [], 0
    for call in message.tool_calls or []:
        raw = call.function.arguments
        args = call_arguments(raw)
        if isinstance(raw, str):
            size += len(raw)
        else:
            raw = None
            if measure:  # also refuses what is no JSON (a set, a cycle): not a call's arguments
                size += len(json.dumps(args))
        out.append((call.function.name, args, raw))
    return out, size


def _text_of(args: dict) -> str | None:
    """The arguments text parse_completion writes, None where it holds NaN or Infinity (no JSON
    value: never paid, not even as the expert's own text)."""
    try:
        return json.dumps(args, ensure_ascii=False, allow_nan=False)
    except ValueError:
        return None


def _ruled(rule, name: str, args: dict) -> Any:
    try:
        return rule(name, args)
    except Exception:  # noqa: BLE001  (a world's rule failing on hostile arguments: no form)
        return None


def _perfect_matching(ok: list[list[bool]]) -> int:
    """Size of a maximum matching in the bipartite graph ok[i][j] (Kuhn's algorithm)."""
    n, m = len(ok), len(ok[0]) if ok else 0
    match_of: list[int] = [-1] * m

    def augment(i: int, seen: list[bool]) -> bool:
        for j in range(m):
            if ok[i][j] and not seen[j]:
                seen[j] = True
                if match_of[j] == -1 or augment(match_of[j], seen):
                    match_of[j] = i
                    return True
        return False

    return sum(augment(i, [False] * m) for i in range(n))


class ToolcallVerifier:
    name = "toolcall"

    def __init__(self, **config):
        self.config = ToolcallConfig(**config)
        cfg = self.config
        self._cmp = ArgumentComparer(cfg.int_float_equal, cfg.numeric_strings, cfg.normalize,
                                     cfg.free_text)
        self._expected_cache: dict[int, tuple[Message, list[tuple[str, dict, str]]]] = {}
        self._judge = None
        self._edits = EditRule()

    def unverifiable(self, turn: Turn) -> str:
        """Why no rule here can verify `turn` ('' when one can): an editor of unknown schema."""
        return self._edits.unverifiable(turn)

    def _expected(self, turn: Turn) -> list[tuple[str, dict, str]]:
        hit = self._expected_cache.get(id(turn.expected))
        if hit is not None and hit[0] is turn.expected:
            return hit[1]
        # The arguments text as parse_completion writes it: an identical candidate is equal
        # without any comparison (the usual case once the policy is good).
        calls = [(n, a, _text_of(a)) for n, a, _ in _calls(turn.expected, measure=False)[0]]
        if len(self._expected_cache) > 4096:
            self._expected_cache.clear()
        self._expected_cache[id(turn.expected)] = (turn.expected, calls)
        return calls

    def score(self, turn: Turn, action: Message | None) -> Score:
        if action is None:
            return Score(0.0, False, "unparseable action")
        if action.role != "assistant":  # a user, tool or system message is not the agent's action
            return Score(0.0, False, f"a {action.role} message is not an action")
        try:
            cand, size = _calls(action)
        except (ValueError, TypeError, RecursionError) as exc:
            return Score(0.0, False, f"malformed candidate call: {exc}")
        text = plain_text(action)
        if text is None:
            return Score(0.0, False, "message content holds a part that is not text")
        size += len(text)
        if size > self.config.max_action_chars:
            return Score(0.0, False, f"action too long ({size} characters)")
        try:
            expected = self._expected(turn)
        except (ValueError, TypeError, RecursionError) as exc:
            return Score(0.0, False, f"expert action unusable: {exc}")
        if expected and not cand:
            return Score(0.0, True, "message instead of a tool call")
        if cand and not expected:
            return Score(0.0, True, "tool call where the expert answered with a message")
        if not expected:
            return self._score_message(turn, action, text)
        kinds = {c.type for c in turn.expected.tool_calls or []}
        if any(c.type not in kinds for c in action.tool_calls or []):
            # only "function" calls exist in OpenAI's format: another type is another action
            return Score(0.0, True, "a call of another type than the expert's")
        try:
            return self._score_calls(turn, action, cand, expected)
        except RecursionError:  # arguments (or schemas) nested past what can be compared
            return Score(0.0, False, "arguments nested too deeply to compare")

    def _score_calls(self, turn: Turn, action: Message, cand: list, expected: list) -> Score:
        if len(cand) != len(expected) and not (self.config.partial_credit
                                               and len(cand) < len(expected)):
            return Score(0.0, True, f"{len(cand)} calls where the expert made {len(expected)}")
        index = schema_index(turn.tools)
        if turn.tools:
            for cn, ca, _ in cand:
                why = self._not_offered(index, cn, ca)
                if why:
                    return Score(0.0, True, why)
        rule = action_rule(turn.metadata.get("world")) if turn.metadata else None
        diffs = [["" if cn == en and cr is not None and cr == er
                  else self._pair(index, rule, en, ea, cn, ca)
                  for cn, ca, cr in cand] for en, ea, er in expected]
        if len(expected) == 1 and len(cand) == 1:
            score = Score(0.0 if diffs[0][0] else 1.0, True, diffs[0][0])
            # SWE edits by their effect on the file (pivotrl.verifiers.edits), where it decides
            by_effect = self._edits.score(turn, expected[0][:2], cand[0][:2]) if (
                diffs[0][0] and rule is None) else None
            if by_effect is not None:
                return by_effect
        else:
            score = self._matched(diffs, len(expected), len(cand))
        if score.reward < 1.0 and self.config.unproven_rule == "judge" and len(cand) == len(
                expected) and _perfect_matching([[not d or is_unproven(d) for d in row]
                                                 for row in diffs]) == len(expected):
            return self._judged(turn, action)  # every remaining difference is unproven
        return score

    @staticmethod
    def _matched(diffs: list[list[str]], n_expected: int, n_cand: int) -> Score:
        matched = _perfect_matching([[not d for d in row] for row in diffs])
        if matched == n_expected == n_cand:
            return Score(1.0, True, "")
        reason = next((d for row in diffs for d in row if d), "calls differ")
        if matched < n_cand:  # some candidate call does what no expert call does
            return Score(0.0, True, f"{matched}/{n_expected} calls match; e.g. {reason}")
        return Score(matched / n_expected, True,  # partial credit: a subset of the calls
                     f"{matched}/{n_expected} of the expert's calls made")

    def _judged(self, turn: Turn, action: Message) -> Score:
        if self._judge is None:
            self._judge = JudgeVerifier(**self.config.judge)
        return self._judge.score(turn, action)

    def _not_offered(self, index, name: str, args: dict) -> str:
        if self._cmp.bfcl and index.get(name) is None and "_" in name:
            dotted = self._dotted(index, name)
            if dotted is not None:
                name = dotted
        return not_offered(index, name, args)

    @staticmethod
    def _dotted(index, name: str) -> str | None:
        """Under `normalize: [bfcl]`, "a_b" names the offered tool "a.b" when no tool is "a_b":
        BFCL's harness renames dotted tools for APIs that forbid dots in names. Only when one
        offered tool renames to it: "a_b_c" from both "a.b_c" and "a_b.c" names neither."""
        found = set()
        for tool in index.tools or []:
            fn = tool.get("function", tool) if isinstance(tool, dict) else None
            other = fn.get("name") if isinstance(fn, dict) else None
            if isinstance(other, str) and "." in other and other.replace(".", "_") == name:
                found.add(other)
        return found.pop() if len(found) == 1 else None

    def _pair(self, index, rule, en: str, ea: dict, cn: str, ca: dict) -> str:
        if cn != en and not (self._cmp.bfcl and cn == en.replace(".", "_")
                             and index.get(cn) is None
                             and (not index.tools or self._dotted(index, cn) == en)):
            return f"function {cn!r} != {en!r}"
        if rule is not None:
            exp_canon, cand_canon = _ruled(rule, en, ea), _ruled(rule, en, ca)
            if exp_canon is not None and cand_canon is not None:
                # The world executes both in its canonical form: equal forms, same action.
                return "" if exp_canon == cand_canon else (
                    f"arguments differ under the {en!r} tool's own rules")
            if (exp_canon is None) != (cand_canon is None):
                # The world runs one of the two calls and rejects the other: never the same
                # action, whatever a schema rule (or an opt-in such as int_float_equal) says.
                return f"the {en!r} tool's own rules accept only one of the two calls"
        fn = index.get(en)
        if fn is None:
            return self._cmp.fields(None, frozenset(), "", ea, ca)
        return self._cmp.fields(fn.props, fn.required, "", ea, ca, fn.open)

    def _score_message(self, turn: Turn, action: Message, text: str) -> Score:
        rule = self.config.message_rule
        if rule == "any":
            return Score(1.0, True, "any message accepted (message_rule=any)")
        expected = plain_text(turn.expected)
        if expected is None:
            return Score(0.0, False, "expert action unusable: content that is not text")
        diff = compare_messages(expected, text)
        if not diff or not text.strip():
            return Score(0.0 if diff else 1.0, True, diff)
        same = same_answer(turn, expected, text)
        if same is not None:  # the world's own ruling on its answers
            return Score(1.0 if same else 0.0, True,
                         "" if same else "not the expert's answer under the world's own rule")
        if rule == "judge":
            return self._judged(turn, action)
        return Score(0.0, True, diff)

    def score_batch(self, turns: Sequence[Turn], actions: Sequence[Message | None]) -> list[Score]:
        return [self.score(t, a) for t, a in zip(turns, actions, strict=True)]
