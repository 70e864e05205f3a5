"""What a message does in a terminal turn: shell commands (a shell tool's calls, or the fenced
shell blocks of a message without calls), a plain message, another tool, or invalid. The shell
verifier (`pivotrl.verifiers.shell`) compares what the commands do; this reads which they are."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from pivotrl.io.records import Message, message_text

DEFAULT_TOOL_NAMES = ["run", "bash", "shell", "execute", "terminal", "run_command",
                      "execute_command", "run_shell_command", "exec", "sh"]
DEFAULT_ARG_NAMES = ["command", "cmd", "script", "commands", "code"]
_FENCE = re.compile(r"```[ \t]*(bash|sh|shell|console|zsh)[ \t]*\n(.*?)```", re.S | re.I)


@dataclass
class Action:
    kind: str  # "commands" | "message" | "other" | "invalid"
    commands: list[str] = field(default_factory=list)
    reason: str = ""
    form: str = ""  # for commands: "call" (a shell tool call) or "fenced" (blocks in a message)


def extract_action(message: Message, cfg: Any) -> Action:
    """What a message does: shell commands, a plain message, other tool calls, or invalid.
    `cfg`: a `ShellConfig` (its `tool_names`, `arg_names` and `fenced_blocks`)."""
    calls = message.tool_calls or []
    if calls:
        names = set(cfg.tool_names)
        if any(c.function.name not in names for c in calls):
            return Action("other")
        commands = []
        for c in calls:
            try:
                args = c.args()
            except (ValueError, TypeError) as exc:
                return Action("invalid", reason=f"arguments of {c.function.name!r}: {exc}")
            cmd = next((args[a] for a in cfg.arg_names if a in args), None)
            if isinstance(cmd, list) and cmd and all(isinstance(x, str) for x in cmd):
                cmd = shlex.join(cmd)
            if not isinstance(cmd, str) or not cmd.strip():
                return Action("invalid", reason=f"{c.function.name!r} call without a command "
                                                f"(one of {', '.join(cfg.arg_names)})")
            commands.append(cmd)
        return Action("commands", commands, form="call")
    if cfg.fenced_blocks:
        blocks = [_block(lang, body) for lang, body in _FENCE.findall(message_text(message))]
        blocks = [b for b in blocks if b.strip()]
        if blocks:
            return Action("commands", blocks, form="fenced")
    return Action("message")


def _block(lang: str, body: str) -> str:
    if lang.lower() != "console":
        return body
    lines = [ln[2:] for ln in body.splitlines() if ln.startswith("$ ")]
    return "\n".join(lines)
