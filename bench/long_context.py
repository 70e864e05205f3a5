"""A realistic long prefix for the benchmarks' pivots (`--prompt-tokens N`): agent trajectories
run 4k-131k tokens, mostly earlier tool results, so a pivot deep in one has a context of many
earlier tool calls and the JSON they returned. `lengthen` inserts such calls and results (order
look-ups of the toolshop world, each a different order) after the system and first user message
until the rendered prompt has at least N tokens, keeping the pivot's own last messages."""

from __future__ import annotations

import json
import random
from typing import Any

ITEMS = ["desk lamp", "office chair", "usb-c cable", "standing desk", "monitor arm", "keyboard",
         "wireless mouse", "notebook pack", "webcam", "headset"]
STATUSES = ["pending", "shipped", "delivered", "cancelled"]


def history_pair(i: int, rng: random.Random) -> list[dict[str, Any]]:
    """One earlier assistant call and the tool result answering it."""
    order_id = f"O-{1000 + i}"
    lines = [{"item": rng.choice(ITEMS), "qty": rng.randint(1, 4), "unit_price": round(rng.uniform(5, 400), 2)}
             for _ in range(rng.randint(1, 4))]
    result = {"order_id": order_id, "status": rng.choice(STATUSES), "placed": f"2024-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}",
              "address": f"{rng.randint(1, 99)} Elm Street, Springfield", "lines": lines,
              "total": round(sum(x["qty"] * x["unit_price"] for x in lines), 2),
              "tracking": f"TRK{rng.randint(10**8, 10**9)}"}
    call_id = f"h{i}"
    return [{"role": "assistant", "tool_calls": [{"id": call_id, "type": "function", "function": {
                "name": "get_order", "arguments": json.dumps({"order_id": order_id})}}]},
            {"role": "tool", "tool_call_id": call_id, "name": "get_order", "content": json.dumps(result)}]


def lengthen(context: list[dict[str, Any]], tools: list[dict[str, Any]], n_tokens: int, count, seed: int = 0
             ) -> list[dict[str, Any]]:
    """`context` with earlier tool calls and results inserted after its first two messages until
    `count(context, tools)` (the rendered prompt's tokens) reaches `n_tokens`."""
    rng = random.Random(seed)
    head, tail = context[:2], context[2:]
    history: list[dict[str, Any]] = []
    while count(head + history + tail, tools) < n_tokens:
        # grow by the estimated number of pairs still missing (one render per round, not per pair)
        have = count(head + history + tail, tools)
        per_pair = max(1, (have - count(head + tail, tools)) // max(1, len(history) // 2)) if history else 0
        add = max(1, (n_tokens - have) // per_pair) if per_pair else 1
        for _ in range(add):
            history += history_pair(len(history) // 2, rng)
    return head + history + tail
