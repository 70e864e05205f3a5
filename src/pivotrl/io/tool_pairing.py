"""Which tool message answers which tool call: by id, or by order where the order is unambiguous.

Many SFT data sets carry no call ids: an assistant message makes its calls and the tool messages
right after it answer them in order. The rule, per assistant message with tool calls and the run
of tool messages right after it (its results):

1. A result whose `tool_call_id` names one of the message's calls (or an earlier message's call)
   answers that call. Ids always win over order.
2. The calls no result answered by id and the results that named no call are then paired by
   order, call j with result j, when there are as many of each; a call may have no result only
   when no unpaired result is left at all. A paired call without an id gets its result's
   `tool_call_id`, or `call_<message index>_<call index>` when neither has one; the result gets
   the call's id. Two different ids are never paired: that is a real mismatch.
3. A result that names its tool (`name`) must name its paired call's function; otherwise the
   order is not the pairing and the line is rejected.

Anything else (2 calls and 1 result without ids, a result after a message that made no call) is
ambiguous and rejected, naming the field at fault: a call's `id` when the call lacks the id its
result names, the result's `tool_call_id` when it names no call or has none to be paired by.
"""

from __future__ import annotations

from typing import Any


def pair_tool_messages(messages: list[Any]) -> tuple[str, str] | None:
    """Apply the rule to a trajectory's messages, filling the ids of calls and results paired by
    order (in place). Returns (field, reason) of the first problem, or None."""
    seen: set[str] = set()  # call ids of earlier assistant messages
    i = 0
    while i < len(messages):
        msg = messages[i]
        end = i + 1
        while end < len(messages) and messages[end].role == "tool":
            end += 1
        if msg.role == "assistant" and msg.tool_calls:
            problem = _pair_block(i, msg, list(range(i + 1, end)), messages, seen)
        elif msg.role == "tool":  # results at the start of the trajectory
            problem = _named_only(list(range(i, end)), messages, seen, None)
        else:
            problem = _named_only(list(range(i + 1, end)), messages, seen, msg)
        if problem is not None:
            return problem
        i = end
    return None


def _named_only(indices: list[int], messages: list[Any], seen: set[str], before) -> tuple[str, str] | None:
    """Results with no calls right before them: each must name an earlier call."""
    for k in indices:
        result_id = messages[k].tool_call_id
        if result_id is None:
            after = f"a {before.role} message" if before is not None else "the start of the trajectory"
            return (f"messages[{k}].tool_call_id", f"tool message without tool_call_id after {after}: "
                    "no tool call right before it to pair it with by order")
        if result_id not in seen:
            return f"messages[{k}].tool_call_id", f"tool_call_id {result_id!r} matches no earlier tool call"
    return None


def _pair_block(i: int, msg: Any, indices: list[int], messages: list[Any], seen: set[str]) -> tuple[str, str] | None:
    calls = msg.tool_calls
    own = {c.id for c in calls if c.id}
    answered: set[str] = set()
    open_results = []
    for k in indices:
        result_id = messages[k].tool_call_id
        if result_id is not None and result_id in own:
            answered.add(result_id)
        elif result_id is None or result_id not in seen:
            open_results.append(k)
    open_calls = [j for j, c in enumerate(calls) if c.id is None or c.id not in answered]
    if open_results and len(open_results) != len(open_calls):
        return _ambiguous(i, calls, open_calls, open_results, messages)
    taken = seen | own
    for j, k in zip(open_calls, open_results):
        call, result = calls[j], messages[k]
        if call.id is not None and result.tool_call_id is not None:  # two ids that differ
            return (f"messages[{k}].tool_call_id",
                    f"tool_call_id {result.tool_call_id!r} matches no earlier tool call")
        if result.name is not None and result.name != call.function.name:
            return (f"messages[{k}].name", f"tool result named {result.name!r} follows the call of "
                    f"{call.function.name!r} (messages[{i}].tool_calls[{j}]); pairing by order needs the "
                    "same tool: give the calls ids and the results tool_call_id")
        if call.id is None:
            call.id = result.tool_call_id or _fresh_id(f"call_{i}_{j}", taken)
            taken.add(call.id)
        result.tool_call_id = call.id
    seen.update(c.id for c in calls if c.id)
    return None


def _ambiguous(i: int, calls, open_calls: list[int], open_results: list[int], messages) -> tuple[str, str]:
    first = messages[open_results[0]]
    counts = (f"messages[{i}] has {len(open_calls)} call(s) no result answers by id and "
              f"{len(open_results)} tool message(s) follow that name none of its calls")
    idless = [j for j in open_calls if calls[j].id is None]
    if first.tool_call_id is not None and idless:
        return (f"messages[{i}].tool_calls[{idless[0]}].id",
                f"tool call without id, and the result messages[{open_results[0]}] names "
                f"tool_call_id {first.tool_call_id!r}; {counts}, so they cannot be paired by order")
    if first.tool_call_id is not None:
        return (f"messages[{open_results[0]}].tool_call_id",
                f"tool_call_id {first.tool_call_id!r} matches no earlier tool call")
    return (f"messages[{open_results[0]}].tool_call_id",
            f"tool message without tool_call_id, and pairing by order is ambiguous: {counts}")


def _fresh_id(base: str, taken: set[str]) -> str:
    name = base
    while name in taken:
        name += "_"
    return name
