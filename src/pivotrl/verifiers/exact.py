"""`exact`: normalised string match of the whole action (the paper's ablation baseline).

A call turn matches when the candidate makes the same calls, in the same order, with the same
canonical JSON arguments (sorted keys, no whitespace: key order and spacing are not "text").
A message turn matches when the texts are equal after case folding and whitespace collapsing.
Nothing else is forgiven: 5 vs 5.0, an omitted default or a reworded message all score 0.

`strict=True` is the paper's strict string-match ablation: the candidate's rendered action text
(`actions.render_action`: message text, then each call's JSON with its keys in the order the
model wrote them) must equal the expert's rendered text character for character, so key order,
case and message whitespace count too. The one thing it cannot see is whitespace inside a
tool-call's JSON, which the completion parser does not keep.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from pivotrl.formats.actions import call_arguments, render_action
from pivotrl.io.records import Message, Turn
from pivotrl.verifiers.base import Score
from pivotrl.verifiers.messages import plain_text


class ExactConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    case_sensitive: bool = Field(
        False, description="Compare message text case-sensitively (default False: the paper's "
                           "baseline normalises case and whitespace).")
    strict: bool = Field(
        False, description="Raw-text match of the rendered action (key order, case and spacing "
                           "count; default False: the normalised match above). The demo's "
                           "exact-match arm sets it: the paper's strict string-match ablation.")


def _canonical_calls(message: Message) -> list[tuple[str, str]]:
    # (call_arguments: a text with a duplicate key names no one value, so no canonical form)
    return [(c.function.name, json.dumps(call_arguments(c.function.arguments), sort_keys=True,
                                          separators=(",", ":"), ensure_ascii=False))
            for c in message.tool_calls or []]


def _norm_text(text: str, case_sensitive: bool) -> str:
    text = " ".join(text.split())
    return text if case_sensitive else text.casefold()


class ExactVerifier:
    name = "exact"

    def __init__(self, **config):
        self.config = ExactConfig(**config)

    def score(self, turn: Turn, action: Message | None) -> Score:
        if action is None:
            return Score(0.0, False, "unparseable action")
        got = plain_text(action)
        if got is None:  # a refusal or image part is more than a text (and rendering drops it)
            return Score(0.0, False, "message content holds a part that is not text")
        if self.config.strict:
            # Safe by construction: only an identical text is rewarded, so no wrong action can be.
            try:
                _canonical_calls(action)  # refuses duplicate keys, which rendering would drop
                same = render_action(action) == render_action(turn.expected)
            except (ValueError, TypeError, RecursionError) as exc:
                return Score(0.0, False, f"action arguments are not a JSON object: {exc}")
            return Score(1.0, True, "") if same else Score(0.0, True, "action text differs")
        try:
            cand = _canonical_calls(action)
        except (ValueError, TypeError, RecursionError) as exc:
            return Score(0.0, False, f"candidate arguments are not a JSON object: {exc}")
        try:
            expected = _canonical_calls(turn.expected)
        except (ValueError, TypeError, RecursionError) as exc:
            return Score(0.0, False, f"expert action unusable: {exc}")
        if expected or cand:
            if cand == expected:
                return Score(1.0, True, "")
            return Score(0.0, True, "tool calls differ")
        cs = self.config.case_sensitive
        want = plain_text(turn.expected)
        if want is None:
            return Score(0.0, False, "expert action unusable: content that is not text")
        if _norm_text(got, cs) == _norm_text(want, cs):
            return Score(1.0, True, "")
        return Score(0.0, True, "message text differs")

    def score_batch(self, turns: Sequence[Turn], actions: Sequence[Message | None]) -> list[Score]:
        return [self.score(t, a) for t, a in zip(turns, actions, strict=True)]
