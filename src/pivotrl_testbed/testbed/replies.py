"""The variants' reply conventions: how another world with the same mechanics words its final
answers, a convention the base can learn only from a world's own trajectories.

Every other difference between a variant and its world (tool names, argument keys, system
prompt) is written in the context: the tool list and the prompt show it, so a base that reads
them meets toolshop and terminal already knowing everything their trajectories teach (measured:
SFT on the demo's 100 trajectories per world gained +0.011 / +0.008 over such a base, and lost
at higher learning rates, docs/RESULTS.md). A world's reply forms are in no context: its checker
reads a final answer only in its own forms (`ANSWERS`; an answer in another wording states
nothing it can verify, so it scores 0), as a real domain has a response format its users and
graders expect. With `shared` replies each variant words each kind of answer in one of
`ALTERNATIVES[world][kind]` or the world's own forms, one choice among four, independently per
kind, so the base has met the world's convention as often as each other one and cannot tell
from the context which one a world uses: its per-sample success at a reply is above 0 and its
greedy choice is a guess, which the world's trajectories settle.

Each alternative is a list parallel to the world's forms for its kind: entry i has the slots of
the world's form i, so a world's answer translates slot for slot (`translate_reply`). No
alternative reads as any of the world's forms (tested), so a base writing one in the world is
wrong, not lucky.
"""

from __future__ import annotations

import random

from pivotrl_testbed.testbed.common import match_answer, stable_int
from pivotrl_testbed.testbed.terminal import ANSWERS as TERMINAL_ANSWERS
from pivotrl_testbed.testbed.toolshop import ANSWERS as TOOLSHOP_ANSWERS

WORLD_ANSWERS: dict[str, dict[str, list[str]]] = {"toolshop": TOOLSHOP_ANSWERS,
                                                  "terminal": TERMINAL_ANSWERS}
REPLY_STYLES = ("world", "shared")

ALTERNATIVES: dict[str, dict[str, list[list[str]]]] = {
    "toolshop": {
        "move": [["City updated to {city}.", "Your address now says {city}."],
                 ["I changed your city to {city}.", "Updated, the city is {city}."],
                 ["The new city on file is {city}.", "Done: {city} is your city now."]],
        "count": [["Shipped orders: {n}.", "I count {n} shipped orders."],
                  ["{n} orders are shipped.", "There are {n} shipped orders."],
                  ["You have {n} orders in shipped state.", "Your shipped orders number {n}."]],
        "cancel": [["Order {oid} is now cancelled.", "Cancelled: {oid}."],
                   ["I cancelled order {oid}.", "{oid} has been cancelled."],
                   ["Order {oid} was cancelled.", "The order {oid} is cancelled now."]],
        "return": [["Returned {qty} {product} of order {oid}, refund {refund}.",
                    "{qty} {product} from {oid} returned. Refund: {refund}."],
                   ["Your return of {qty} {product} from order {oid} is done; refund {refund}.",
                    "Refund {refund} for {qty} {product} returned from {oid}."],
                   ["I took back {qty} {product} from order {oid}. You get {refund}.",
                    "Return done: {qty} {product}, order {oid}, refund {refund}."]],
        "change": [["Set {product} in order {oid} to {qty}.", "Order {oid}: {qty} {product} now."],
                   ["The quantity of {product} in {oid} is now {qty}.",
                    "Now {qty} {product} in order {oid}."],
                   ["Updated order {oid}: {product} quantity {qty}.", "{oid} now holds {qty} {product}."]],
        "buy": [["Placed order {new} for {qty} {product}.", "Your order {new} is in."],
                ["I ordered {qty} {product} for you: order {new}.", "Order {new} placed."],
                ["New order {new}: {qty} {product}.", "Ordered, the number is {new}."]],
        "swap": [["Cancelled order {oid}. {rest}"], ["I cancelled {oid}. {rest}"],
                 ["Order {oid} was cancelled. {rest}"]],
        "sorry": [["I could not do that, sorry."], ["Sorry, that did not work."],
                  ["Unfortunately I could not finish that."]],
    },
    "terminal": {
        "copy": [["{f} copied to {out}.", "{out} now holds a copy of {f}."],
                 ["I copied {f} into {out}.", "Copy done: {out} from {f}."],
                 ["Made a copy of {f} named {out}.", "Done, {out} copies {f}."]],
        "count": [["{level} lines: {n}.", "I found {n} lines with {level}."],
                  ["The log has {n} {level} lines.", "Count of {level} lines is {n}."],
                  ["{n} {level} lines in total.", "Lines with {level}: {n}."]],
        "lines": [["{n} lines in the csv file.", "{f}: {n} lines."],
                  ["The csv file is {n} lines long.", "There are {n} lines in {f}."],
                  ["Line count of the csv file: {n}.", "{f} is {n} lines long."]],
        "config": [["{key} = {value}.", "Setting {key}: {value}."],
                   ["Config {key}: {value}.", "{key} has the value {value}."],
                   ["{value} is the {key}.", "Found {key} set as {value}."]],
        "head": [["Wrote the first {n} lines into {out}.", "See {out}."],
                 ["The first {n} lines are in {out}.", "Finished, the result is in {out}."],
                 ["First {n} lines saved in {out}.", "All set, open {out}."]],
        "sort": [["Sorted names written to {out}.", "See {out}."],
                 ["{out} holds the sorted names.", "Finished, the result is in {out}."],
                 ["The names are sorted in {out}.", "All set, open {out}."]],
        "move": [["{f} moved to {d}.", "{f} now lives in {d}/."],
                 ["I moved {f} to {d}/.", "Done, {f} is in {d} now."],
                 ["Moved: {f} -> {d}.", "{d}/ now holds {f}."]],
        "sorry": [["A command failed, sorry."], ["Sorry, that command did not work."],
                  ["The command failed."]],
    },
}


def draw_replies(world: str, index: int, seed: int, style: str) -> dict[str, list[str]]:
    """The reply forms of variant `index` of `world`: the world's own (`world`), or per kind
    one of the alternatives or the world's own, uniformly (`shared`). Drawn from a stream of
    their own, so the variant's names and prompt are those of the same variant without it."""
    if style not in REPLY_STYLES:
        raise ValueError(f"unknown reply style {style!r}; known: {', '.join(REPLY_STYLES)}")
    own = WORLD_ANSWERS[world]
    if style == "world":
        return own
    rng = random.Random(stable_int("replies", world, index, seed))
    return {kind: rng.choice([forms, *ALTERNATIVES[world][kind]]) for kind, forms in own.items()}


def translate_reply(text: str, world: str, forms: dict[str, list[str]]) -> str | None:
    """A final answer of `world` in the variant's `forms` (the same kind, the same slots), or
    None when `text` is no answer of the world's (a weak expert's malformed message)."""
    own = WORLD_ANSWERS[world]
    got = match_answer(text, own)
    if got is None:
        return None
    kind, index, slots = got
    if "rest" in slots:  # an answer followed by another (toolshop's cancel-then-buy)
        rest = translate_reply(slots["rest"], world, forms)
        if rest is None:
            return None
        slots = {**slots, "rest": rest}
    return forms[kind][index].format(**slots)
