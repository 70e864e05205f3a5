"""The one scoring path: (verifier, turns, completion texts or parsed actions) -> Scores.

Profiling, the GRPO reward, turn accuracy and `pivotrl verify` all score through here, so one set
of rules holds everywhere:

- an action that could not be parsed scores 0, is invalid, and keeps the parser's reason;
- a verifier that raises on an action gives that action an invalid 0 with the error as reason
  (model text is hostile: a verifier bug on one sample must not end a run, nor pay the sample);
  but a broken environment (no sandbox, a workspace removed from outside) is raised: it says
  nothing of the action, and scoring every later action 0 would hide it;
- a reward that is not a finite number becomes 0 (NaN would poison the group's advantage);
- every reward is clamped to [0, 1] (the range the pivot statistics and GRPO groups assume);
- a Terminus-2 turn (JSON keystrokes in the message text) is scored by identity of the parsed
  action unless the verifier reads that format itself (`pivotrl.verifiers.terminus_identity`):
  read as a chat message, text rules would pay it.

An action repeated on the same turn object is verified once (a verifier is a function of the
turn and the action). Valid actions reach the verifier in one `score_batch` call, so judges and sandboxed verifiers can
overlap their waits; if the batch call fails, actions are scored one by one to isolate the bad one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from pivotrl.formats.actions import ParsedAction, parse_completion
from pivotrl.io.records import Message, Turn
from pivotrl.sandbox.bwrap import BROKEN_ENVIRONMENT
from pivotrl.verifiers.base import Score, Verifier
from pivotrl.verifiers.terminus_identity import score_identity, scored_by_identity

Parser = Callable[[str], ParsedAction]


def _error(exc: BaseException) -> Score:
    return Score(0.0, False, f"verifier error: {type(exc).__name__}: {exc}"[:300])


def normalise(score: Score) -> Score:
    """The reward rules above applied to one verifier result."""
    try:
        reward = float(score.reward)
    except (TypeError, ValueError):
        return Score(0.0, False, f"verifier returned a non-number reward {score.reward!r}")
    if not math.isfinite(reward):
        return Score(0.0, bool(score.valid), f"verifier returned {reward} (scored 0)")
    return Score(min(1.0, max(0.0, reward)), bool(score.valid), str(score.reason or ""))


def _verify(verifier: Verifier, turns: list[Turn], actions: list[Message]) -> list[Score]:
    batch = getattr(verifier, "score_batch", None)
    if batch is not None:
        try:
            scores = list(batch(turns, actions))
            if len(scores) == len(turns):
                return scores
        except BROKEN_ENVIRONMENT:
            raise
        except Exception:  # noqa: BLE001 - retried one by one below to find the bad action
            pass
    out = []
    for turn, action in zip(turns, actions):
        try:
            out.append(verifier.score(turn, action))
        except BROKEN_ENVIRONMENT:
            raise
        except Exception as exc:  # noqa: BLE001 - see the module docstring
            out.append(_error(exc))
    return out


def score_actions(verifier: Verifier, turns: Sequence[Turn], actions: Sequence[Message | None],
                  reasons: Sequence[str] | None = None) -> list[Score]:
    """Score parsed actions; `None` is an action that could not be parsed (`reasons[i]` says why)."""
    if len(turns) != len(actions):
        raise ValueError(f"{len(turns)} turns but {len(actions)} actions")
    # A verifier is a function of (turn, action), so an action repeated on the same Turn object
    # (the K or G samples of one state often repeat, more so as a policy sharpens) is verified
    # once and its copies get the same Score: in executable worlds each verification runs the
    # world, often several times.
    first: dict[tuple[int, str], int] = {}
    source: dict[int, int] = {}
    for i, a in enumerate(actions):
        if a is not None:
            source[i] = first.setdefault((id(turns[i]), a.model_dump_json()), i)
    todo = sorted(set(source.values()))
    by_identity = {i for i in todo if scored_by_identity(verifier, turns[i])}
    todo = [i for i in todo if i not in by_identity]
    scored = _verify(verifier, [turns[i] for i in todo], [actions[i] for i in todo]) if todo else []
    by_index = dict(zip(todo, scored))
    by_index.update((i, score_identity(turns[i], actions[i])) for i in by_identity)
    out = []
    for i in range(len(actions)):
        if i in source:
            out.append(normalise(by_index[source[i]]))
        else:
            out.append(Score(0.0, False, (reasons[i] if reasons else "") or "unparseable action"))
    return out


def score_completions(verifier: Verifier, turns: Sequence[Turn], texts: Sequence[str],
                      parse: Parser = parse_completion) -> list[Score]:
    """Parse each completion text (with the model family's parser) and score it. A parser with
    `typed_by_tools` (pivotrl.formats.families) also gets the turn's tools: formats that write arguments as
    raw text need the schema to tell "7" from 7."""
    if getattr(parse, "typed_by_tools", False):
        parsed = [parse(text, turn.tools) for turn, text in zip(turns, texts)]
    else:
        parsed = [parse(text) for text in texts]
    return score_actions(verifier, turns, [p.message if p.valid else None for p in parsed],
                         [p.reason for p in parsed])


def score_completion(verifier: Verifier, turn: Turn, text: str, parse: Parser = parse_completion) -> Score:
    """`score_completions` for one completion."""
    return score_completions(verifier, [turn], [text], parse)[0]
