"""The final-message rule: a message pays only when it is proven to say what the expert's says.

A final message (the expert answered the user instead of calling a tool) is proven equal to the
expert's in three ways only, checked by `toolcall` in this order:

1. the world's own reading: at a turn whose world defines `canonical_message`, the world reads
   both texts as the same answer (`pivotrl.verifiers.world.same_answer`); the world also rules
   a text it reads as another answer wrong;
2. the same text (`compare_messages`): the same characters, the two ends trimmed (a chat shows
   no leading or trailing whitespace, and completion parsing trims them already);
3. the LLM judge (`message_rule: judge`), which reads both texts whole.

Nothing else is proven, and no list of phrases decides. Every word can carry meaning ("on" and
"off", "3 pending and 5 shipped" and "5 pending and 3 shipped", "isn't", "$5" and "5", "1.10"
and "1.1" in a version); and a fixed list of refusal phrases pays a "refusal" that also claims
an action ("none of the tools can do that, now that your order is cancelled") while it misses
real refusals in other words. Two refusals in other words are the judge's question.
"""

from __future__ import annotations

from pivotrl.io.records import Message


def compare_messages(expected: str, candidate: str) -> str:
    """"" when `candidate` is the expert's text (ends trimmed), else why it is not proven equal."""
    cand = candidate.strip()
    if not cand:
        return "empty message"
    if expected.strip() == cand:
        return ""
    return "message differs from the expert's (not proven equal)"


def plain_text(message: Message) -> str | None:
    """The message's text, or None when its content holds a part that is not text (a refusal,
    an image, a text part whose text is no string): more than a text, never proven equal to one."""
    content = message.content
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for part in content:
        if isinstance(part, str):
            parts.append(part)
        elif (isinstance(part, dict) and part.get("type", "text") == "text"
              and isinstance(part.get("text"), str)):
            parts.append(part["text"])
        else:
            return None
    return "".join(parts)
