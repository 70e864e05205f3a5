"""Terminus-2 actions: the JSON object that Terminal-Bench's Terminus-2 harness reads from the text
of an assistant message (no tool call), as in NVIDIA's Nemotron-Terminal-Corpus:

    <think>…</think> {"analysis": "…", "plan": "…",
                      "commands": [{"keystrokes": "ls -la\\n", "duration": 0.1}],
                      "task_complete": false}

and the next user turn holds the terminal's output. The schema read here is NeMo-Gym's
`TERMINUS_2_SCHEMA` (resources_servers/terminus_judge/schemas.py), the one its `terminus_judge`
server checks pivot rows of this kind against:

- one JSON object with `analysis` (string), `plan` (string), `commands` (array) and optionally
  `task_complete` (boolean, default false); no other key;
- each command an object with `keystrokes` (string, sent verbatim) and optionally `duration`
  (number of seconds, default 1.0); no other key.

The reader is stricter than the harness, which tolerates text around the JSON, closes missing
braces, reads "true" strings and replaces a bad duration: each of those repairs turns one text
into an action the text does not say, and a permissive parser is a reward leak (docs/DESIGN.md).
So: an optional leading <think>…</think> block (or a lone leading …</think>, for chat templates
that open the block in the prompt), then exactly one JSON object, unique keys, no NaN, the types
above; anything else is an invalid action with the reason. Model text is hostile:
`parse_terminus` never raises.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from pivotrl.formats.actions import END_MARKERS, MAX_COMPLETION_CHARS
from pivotrl.io.records import Message, message_text

TERMINUS_2 = "terminus_2"  # the action format's name, as NeMo-Gym's `metadata.harness` spells it
# Turn.metadata key naming how the expected action is written (absent: a chat message or tool calls).
ACTION_FORMAT_KEY = "action_format"
DEFAULT_DURATION = 1.0  # the schema's default wait, in seconds
_ACTION_KEYS = ("analysis", "plan", "commands", "task_complete")
_REQUIRED = ("analysis", "plan", "commands")
_COMMAND_KEYS = ("keystrokes", "duration")
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


class TerminusCommand(BaseModel):
    model_config = ConfigDict(frozen=True)
    keystrokes: str = Field(..., description="Keys sent verbatim to the terminal (tmux send-keys): "
                            "a command ends with a newline to run; 'C-c' style names are keys.")
    duration: float = Field(DEFAULT_DURATION, description="Seconds the harness waits after "
                            "sending the keys, before the next command or reading the screen.")


class TerminusAction(BaseModel):
    model_config = ConfigDict(frozen=True)
    analysis: str = Field(..., description="The model's reading of the screen (free text, never run).")
    plan: str = Field(..., description="What the commands are meant to do (free text, never run).")
    commands: list[TerminusCommand] = Field(..., description="Sent in order; empty: just wait.")
    task_complete: bool = Field(False, description="True: the agent asks to end the task (the "
                                "harness grades it after a second confirmation).")


@dataclass(frozen=True)
class TerminusParse:
    action: TerminusAction | None  # None when the text is not a Terminus-2 action
    reason: str = ""  # why it is not ("" when it is)
    body: str = ""  # the JSON text of the action, without the thinking block
    thinking: str | None = None  # the text of the <think> block, None when there was none

    @property
    def valid(self) -> bool:
        return self.action is not None


class _Invalid(Exception):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Parsers differ on which of two values of one key wins: such a text names no one action.
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _Invalid(f"duplicate key {key!r}")
        seen.add(key)
    return dict(pairs)


def _no_constant(name: str) -> Any:
    raise _Invalid(f"{name} is not a JSON number")  # json accepts NaN / Infinity unless told not to


_DECODER = json.JSONDecoder(object_pairs_hook=_unique_keys, parse_constant=_no_constant)


def _strip_end(text: str) -> str:
    """Trailing whitespace and end-of-turn markers (any number of them) dropped."""
    while True:
        stripped = text.rstrip()
        marker = next((m for m in END_MARKERS if stripped.endswith(m)), None)
        if marker is None:
            return stripped
        text = stripped[: -len(marker)]


def _split_think(text: str) -> tuple[str | None, str]:
    """(thinking, the rest) of a text with an optional leading think block."""
    close = text.find(_THINK_CLOSE)
    if close == -1:
        if text.lstrip().startswith(_THINK_OPEN):
            raise _Invalid("cut inside the thinking block (unterminated <think>)")
        return None, text
    head, rest = text[:close], text[close + len(_THINK_CLOSE):]
    lead = head.lstrip()
    if lead.startswith(_THINK_OPEN):
        head = lead[len(_THINK_OPEN):]
    if _THINK_OPEN in head:
        raise _Invalid("text before the <think> block" if not lead.startswith(_THINK_OPEN)
                       else "nested <think> block")
    return head, rest


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _command(value: Any, i: int) -> TerminusCommand:
    where = f"commands[{i}]"
    if not isinstance(value, dict):
        raise _Invalid(f"{where} is a JSON {type(value).__name__}, not an object")
    unknown = [k for k in value if k not in _COMMAND_KEYS]
    if unknown:
        raise _Invalid(f"{where} has an unknown field {unknown[0]!r}")
    if "keystrokes" not in value:
        raise _Invalid(f"{where} has no keystrokes")
    if not isinstance(value["keystrokes"], str):
        raise _Invalid(f"{where}.keystrokes is a JSON {type(value['keystrokes']).__name__}, not a string")
    duration = value.get("duration", DEFAULT_DURATION)
    if not _is_number(duration):
        raise _Invalid(f"{where}.duration is not a number")
    return TerminusCommand.model_construct(keystrokes=value["keystrokes"], duration=float(duration))


def _action(value: Any) -> TerminusAction:
    if not isinstance(value, dict):
        raise _Invalid(f"the action is a JSON {type(value).__name__}, not an object")
    unknown = [k for k in value if k not in _ACTION_KEYS]
    if unknown:
        raise _Invalid(f"unknown field {unknown[0]!r}")
    missing = [k for k in _REQUIRED if k not in value]
    if missing:
        raise _Invalid(f"missing field {missing[0]!r}")
    for key in ("analysis", "plan"):
        if not isinstance(value[key], str):
            raise _Invalid(f"{key} is a JSON {type(value[key]).__name__}, not a string")
    if not isinstance(value["commands"], list):
        raise _Invalid(f"commands is a JSON {type(value['commands']).__name__}, not an array")
    done = value.get("task_complete", False)
    if not isinstance(done, bool):
        raise _Invalid(f"task_complete is a JSON {type(done).__name__}, not a boolean")
    commands = [_command(c, i) for i, c in enumerate(value["commands"])]
    return TerminusAction.model_construct(analysis=value["analysis"], plan=value["plan"],
                                          commands=commands, task_complete=done)


def parse_terminus(text: Any, max_chars: int = MAX_COMPLETION_CHARS) -> TerminusParse:
    """Message text → Terminus-2 action, or the reason it is none (module docstring); never raises."""
    try:
        if not isinstance(text, str):
            raise _Invalid(f"the text is {type(text).__name__}, not a string")
        if len(text) > max_chars:
            raise _Invalid(f"text too long ({len(text)} > {max_chars} characters)")
        text = _strip_end(text)
        # A text that opens with the object has no thinking: a "</think>" after it is text after
        # the action, and one inside a keystrokes string is data.
        thinking, rest = (None, text) if text.lstrip().startswith("{") else _split_think(text)
        body = rest.strip()
        if not body:
            raise _Invalid("no JSON object")
        if body.startswith(_THINK_OPEN):
            raise _Invalid("a second <think> block")
        if not body.startswith("{"):
            raise _Invalid("text before the JSON object")
        try:
            value, end = _DECODER.raw_decode(body)
        except json.JSONDecodeError as exc:
            raise _Invalid(f"not valid JSON: {exc.msg} at character {exc.pos}") from None
        after = body[end:].strip()
        if after:
            raise _Invalid("a second JSON object after the action" if after.startswith("{")
                           else "text after the JSON object")
        return TerminusParse(_action(value), "", body[:end], thinking)
    except _Invalid as exc:
        return TerminusParse(None, str(exc))
    except RecursionError:
        return TerminusParse(None, "JSON nested too deeply")
    except Exception as exc:  # noqa: BLE001 - hostile text must never crash a run
        return TerminusParse(None, f"unparseable text: {type(exc).__name__}")


def action_difference(expected: TerminusAction, candidate: TerminusAction) -> str:
    """"" when the two actions send the same keys in the same order and agree on ending the
    task; else how they differ. Analysis and plan are free text the harness never runs. Durations
    are ignored: a duration is how long the harness waits before the next keys and before reading
    the screen; the keys sent, so what runs, are the same (a shorter wait may show less output in
    the next observation, which judging the next turn does not depend on: its context is the
    expert's). A surplus or missing command is another action, never a partial match."""
    want = [c.keystrokes for c in expected.commands]
    got = [c.keystrokes for c in candidate.commands]
    if len(got) != len(want):
        return f"{len(got)} commands where the expert sent {len(want)}"
    for i, (w, g) in enumerate(zip(want, got)):
        if w != g:
            return f"commands[{i}] sends other keystrokes than the expert's"
    if expected.task_complete != candidate.task_complete:
        return "task_complete differs from the expert's"
    return ""


# ---------------------------------------------------------------- trajectories of this format

ACTION_FORMATS = ("auto", "chat", TERMINUS_2)  # what `pivotrl extract` reads assistant turns as


def declares_terminus(metadata: dict[str, Any]) -> bool:
    """The trajectory says its actions are Terminus-2: `action_format` (pivotrl's key) or
    `harness` (NeMo-Gym's `metadata.harness`) is "terminus_2"."""
    return TERMINUS_2 in (metadata.get(ACTION_FORMAT_KEY), metadata.get("harness"))


def reads_as_terminus(messages: list[Message], metadata: dict[str, Any], tools: list[Any],
                      mode: str = "auto") -> bool:
    """Whether a trajectory's assistant turns are Terminus-2 actions. `mode` "chat": never;
    TERMINUS_2: always; "auto": when the trajectory declares it (`declares_terminus`), or when it
    offers no tools, no assistant message calls one, and one of them is a Terminus-2 action."""
    if mode not in ACTION_FORMATS:
        raise ValueError(f"action format {mode!r}: expected one of {', '.join(ACTION_FORMATS)}")
    if mode != "auto":
        return mode == TERMINUS_2
    if declares_terminus(metadata):
        return True
    assistant = [m for m in messages if m.role == "assistant"]
    if tools or any(m.tool_calls for m in assistant):
        return False
    # The cheap test first: a chat answer rarely holds the word "commands" in quotes.
    return any('"commands"' in message_text(m) and parse_terminus(message_text(m)).valid
               for m in assistant)


def as_terminus_message(message: Message) -> tuple[Message | None, str]:
    """An expert's assistant message as a Terminus-2 turn's expected action: (the message with
    the JSON as its content and an inline <think> block moved to `reasoning_content`, "") or
    (None, why it is no Terminus-2 action)."""
    if message.tool_calls:
        return None, "a tool call, not a Terminus-2 action"
    parsed = parse_terminus(message_text(message))
    if not parsed.valid:
        return None, parsed.reason
    update: dict[str, Any] = {"content": parsed.body}
    if parsed.thinking is not None and message.reasoning_content is None:
        update["reasoning_content"] = parsed.thinking
    elif parsed.thinking is not None:
        update = {}  # reasoning in both places: the message is kept as it was written
    return message.model_copy(update=update), ""
