"""Terminus-2 turns, until a verifier executes their actions: only the expert's own action pays.

A Terminus-2 turn (`Turn.metadata["action_format"] == "terminus_2"`, pivotrl.formats.terminus)
expects keystrokes written as JSON in the message text. Read as a chat message it would be
compared as text: `exact` folds case and spaces (`LS -LA` would pass for `ls -la`); NeMo-Gym's
argument-comparison server gives any chat message a reward of 1; its `terminus_judge` pays a
SequenceMatcher ratio of the concatenated keystrokes of at least 0.95 (so a long command plus a
short surplus one passes) or an LLM judge's verdict. None of those proves that the same thing
runs. So `pivotrl.scoring` scores every such turn here, whatever the verifier, by identity of
the parsed action (`formats.terminus.action_difference`): the same keystrokes in the same order
and the same `task_complete` score 1; anything else 0, a surplus command included. It is the
rule `toolcall` starts from for a final message: the expert's own text pays
(pivotrl.verifiers.messages). Identity pays no wrong action; it only misses right ones
written otherwise (`ls -al` for `ls -la`), so such a turn is not `unverifiable` (that marks turns
where the verifier would pay a wrong action) and can be a pivot.

A verifier that reads these actions itself (the equivalence verifier to come) says so with
`action_formats = ("terminus_2",)`; its turns then go to it.

Rules on the candidate: a completion the parser could not read, a tool call, content that is
not text, or text that is not one Terminus-2 action is invalid (0, counted, with the reason); the
model family's parser has already dropped its reasoning and end markers.
"""

from __future__ import annotations

from typing import Any

from pivotrl.formats.terminus import ACTION_FORMAT_KEY, TERMINUS_2, action_difference, parse_terminus
from pivotrl.io.records import Message, Turn
from pivotrl.verifiers.base import Score
from pivotrl.verifiers.messages import plain_text


def is_terminus_turn(turn: Any) -> bool:
    """The turn's expected action is a Terminus-2 JSON action."""
    metadata = getattr(turn, "metadata", None)
    return isinstance(metadata, dict) and metadata.get(ACTION_FORMAT_KEY) == TERMINUS_2


def scored_by_identity(verifier: Any, turn: Any) -> bool:
    """`turn` is a Terminus-2 turn and `verifier` does not read such actions itself."""
    formats = getattr(verifier, "action_formats", ()) or ()
    return is_terminus_turn(turn) and TERMINUS_2 not in formats


def score_identity(turn: Turn, action: Message | None) -> Score:
    """1 when `action` is the expert's Terminus-2 action (module docstring), else 0 with why."""
    if action is None:
        return Score(0.0, False, "unparseable action")
    if action.tool_calls:
        return Score(0.0, False, "a tool call where the harness reads a Terminus-2 JSON action "
                                 "from the text")
    text = plain_text(action)
    if text is None:
        return Score(0.0, False, "message content holds a part that is not text")
    got = parse_terminus(text)
    if not got.valid:
        return Score(0.0, False, f"not a Terminus-2 action: {got.reason}")
    want = parse_terminus(plain_text(turn.expected) or "")
    if not want.valid:
        return Score(0.0, False, f"expert action unusable: not a Terminus-2 action: {want.reason}")
    diff = action_difference(want.action, got.action)
    return Score(0.0 if diff else 1.0, True, diff)
