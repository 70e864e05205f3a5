"""Other worlds with the same mechanics: the testbed's worlds under other tool names, argument
keys, observation keys and system prompts, for a base that must meet toolshop and terminal only
through the demo's data.

A base pretrained on the worlds themselves already knows them, and no arm can teach it anything
(docs/RESULTS.md, "Acceptance criteria for a base with headroom"). A base pretrained on these
variants knows the mechanics (look the customer up, then its orders; `ls`, then `grep -c`) and
the tool-call format, but not toolshop's or terminal's own names and conventions: those it can
only read from the tool list or learn from the demo's trajectories, as the paper's general base
meets a new agentic domain.

A variant is a consistent renaming, never the world itself. Its names come from one of three
spaces (`NAME_SPACES`):
- `pools`: each name drawn from a small synonym pool per tool or key (`TOOL_POOLS`,
  `KEY_POOLS`) that never holds the world's own names. A 2-layer base memorises the pools and
  writes a pool name whatever the list offers (docs/RESULTS.md, "Candidates": 0 % offered
  names on the worlds' own turns);
- `open`: each name a fresh composition of two or three words from `OPEN_WORDS` (161 words:
  25,760 ordered pairs and 4.1M triples, for ~20k names in a 2,000-trajectory mix), so no name
  can be memorised and only reading the tool list (the descriptions stay the world's) lowers
  the loss on names. The 2- and 4-layer bases did not learn to copy a name in the probes (0 %);
- `shared`: the pools with the world's own name added to each (one choice among 5–9), but no
  variant is the world: a variant that draws every one of the world's names is drawn again, and
  the system prompt is never the world's. The base sees each of the world's names in other
  worlds, as a general base has seen common tool names, but never the world's tool list.

A trajectory of the world is translated into a variant's trajectory message by message: the
calls' names and argument keys, the keys of JSON observations, the system prompt and the tool
list. The world's mechanics are untouched, so the translation is exactly what the variant world
would have produced (`translate` is a bijection on names: `tests/test_variants.py` checks that
no trace of the world's own names is left under `pools` and `open`).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from typing import Any

from pivotrl.io.records import FunctionCall, Message, ToolCall, Trajectory
from pivotrl_testbed.testbed.common import compact, stable_int
from pivotrl_testbed.testbed.replies import draw_replies, translate_reply

# Synonym pools, per world: tool names, then keys (arguments and observations share one map, so
# an id read from an observation is passed under the same key it was read as).
TOOL_POOLS: dict[str, dict[str, list[str]]] = {
    "toolshop": {
        "find_customer": ["lookup_client", "search_user", "account_by_email", "find_member",
                          "customer_by_email", "locate_buyer"],
        "get_customer": ["client_info", "read_user", "fetch_account", "member_details",
                         "show_buyer", "customer_info"],
        "list_orders": ["orders_of", "search_orders", "get_orders", "list_purchases",
                        "client_orders", "orders_by_customer"],
        "get_order": ["order_info", "read_order", "fetch_order", "order_details",
                      "show_purchase", "get_purchase"],
        "find_product": ["lookup_item", "search_product", "product_by_name", "find_article",
                         "locate_goods", "find_item"],
        "cancel_order": ["void_order", "cancel_purchase", "abort_order", "drop_order",
                         "order_cancel", "revoke_order"],
        "return_item": ["refund_item", "send_back", "return_goods", "make_return",
                        "item_return", "return_product"],
        "place_order": ["create_order", "buy_item", "new_purchase", "add_order",
                        "order_create", "make_order"],
        "update_address": ["set_city", "change_city", "move_client", "edit_address",
                           "update_location", "set_address"],
        "change_qty": ["set_quantity", "update_qty", "modify_amount", "edit_count",
                       "change_amount", "set_qty"],
    },
    "terminal": {"run": ["shell", "bash", "exec_command", "terminal", "sh", "execute",
                         "run_shell", "command"]},
}
KEY_POOLS: dict[str, dict[str, list[str]]] = {
    "toolshop": {
        "email": ["mail", "email_address", "contact", "user_email"],
        "customer_id": ["client_id", "user_id", "account", "cust", "member_id"],
        "status": ["state", "filter", "order_status", "kind"],
        "order_id": ["order", "oid", "purchase_id", "order_ref"],
        "name": ["product_name", "title", "item_name", "query"],
        "reason": ["why", "cause", "motive", "reason_code"],
        "product_id": ["item", "pid", "item_id", "article_id", "sku"],
        "qty": ["quantity", "count", "amount", "n"],
        "city": ["town", "new_city", "location", "place"],
    },
    "terminal": {"command": ["cmd", "script", "line", "input", "code", "shell_command"]},
}
# The open space's words: shop, file and generic programming vocabulary, so the worlds' own
# names are compositions of words the base has seen in names (as a general base has), never the
# compositions themselves (`_open_name` rejects them).
OPEN_WORDS = sorted(set("""
find get list read fetch show lookup search locate query load make create add new set update
change edit modify move cancel void abort drop revoke return refund send ship buy order place
put post run exec execute call start open close check view count scan pick take give hold
customer client user member buyer account person shopper owner profile contact email mail
address city town place location region zip street order purchase basket cart item product
article goods stock sku unit qty quantity amount number count total price cost status state
stage kind reason cause note why id ref key code token name title label tag text line entry
record row field value data info details summary report history log file folder path dir
command cmd script shell bash terminal prompt input output job task step action request
query filter mode type flag option level group batch page list set map table store shop
market catalog inventory invoice receipt payment wallet card bill delivery parcel package
""".split()))
NAME_SPACES = ("pools", "open", "shared")
JSON_OBSERVATIONS = {"toolshop"}  # worlds whose observations are JSON with named keys
SYSTEM_PROMPTS: dict[str, list[str]] = {
    "toolshop": [
        "You are a store helper. Use the tools to serve the customer. Policy: only pending "
        "orders can be cancelled or changed; only delivered orders can be returned. Reply to "
        "the user when finished.",
        "You help the customers of an online shop with tools. Rules: cancel or change only "
        "pending orders; return only delivered orders. Finish with a reply to the user.",
        "Shop support agent. Call the tools to act for the user. Only pending orders may be "
        "cancelled or changed, only delivered orders returned. End with a message to the user.",
    ],
    "terminal": [
        "You are a command-line helper. Use the {tool} tool to run bash commands in the user's "
        "folder. Reply to the user when finished.",
        "You work in the user's directory through the {tool} tool (bash). Finish with a reply "
        "to the user.",
        "Shell agent: call {tool} to execute bash in the working directory, then answer the "
        "user.",
    ],
}

# `composed` prompts: an opener, a sentence on the tools (and toolshop's policy) and a closer, one
# of each (80 prompts per world): with only the three above, a base tied its choice of tool name
# to their wording and wrote one fixed name under the world's own prompt (docs/RESULTS.md,
# candidate G), as no general base would after meeting many system prompts. None of the parts
# is the world's own sentence.
PROMPT_PARTS: dict[str, tuple[list[str], list[str], list[str]]] = {
    "toolshop": (
        ["You are a store helper.", "You help the customers of an online shop.",
         "Shop support agent.", "You are the assistant of a web store.",
         "Customer service for an online shop."],
        ["Use the tools to serve the customer. Policy: only pending orders can be cancelled or "
         "changed; only delivered orders can be returned.",
         "Act for the user with the tools. Rules: cancel or change only pending orders; return "
         "only delivered orders.",
         "Call the tools to act for the user. Only pending orders may be cancelled or changed, "
         "only delivered orders returned.",
         "The tools below act on the shop. Pending orders alone can be cancelled or changed; "
         "delivered orders alone can be returned."],
        ["Reply to the user when finished.", "Finish with a reply to the user.",
         "End with a message to the user.", "Tell the user when it is done."]),
    "terminal": (
        ["You are a command-line helper.", "Shell agent.", "You work in the user's directory.",
         "You help with files in a terminal.", "Command-line assistant."],
        ["Use the {tool} tool to run bash commands in the user's folder.",
         "Call {tool} to execute bash in the working directory.",
         "Run bash commands through the {tool} tool.",
         "The {tool} tool runs a bash command in the current directory."],
        ["Reply to the user when finished.", "Finish with a reply to the user.",
         "Then answer the user.", "Tell the user when it is done."]),
}
PROMPT_STYLES = ("fixed", "composed")


@dataclass(frozen=True)
class Variant:
    """One renaming of a world: `tools` and `keys` map the world's names to the variant's."""

    world: str
    index: int
    tools: dict[str, str]
    keys: dict[str, str]
    system: str
    name: str = field(default="")
    replies: dict[str, list[str]] | None = None  # its final-answer forms (testbed/replies.py)

    def tool(self, name: str) -> str:
        return self.tools.get(name, name)

    def key(self, key: str) -> str:
        return self.keys.get(key, key)


def _own_names(world: str) -> set[str]:
    """The names an open name must not be: the world's own and every pool's."""
    own = set(TOOL_POOLS[world]) | set(KEY_POOLS[world])
    return own | {n for w in TOOL_POOLS for n in TOOL_POOLS[w]} | {k for w in KEY_POOLS for k in KEY_POOLS[w]}


def _open_name(rng: random.Random, taken: set[str]) -> str:
    """Two words (a third one time in four), none of the worlds' or pools' names, not `taken`."""
    while True:
        words = rng.sample(OPEN_WORDS, 3 if rng.random() < 0.25 else 2)
        name = "_".join(words)
        if name not in taken:
            return name


def make_variant(world: str, index: int, seed: int = 0, names: str = "pools",
                 own_share: float | None = None, *, prompts: str = "fixed",
                 replies: str = "world") -> Variant:
    """The `index`-th variant of `world` (deterministic in world, index, seed and name space):
    distinct names within the variant, never the world itself (module doc). `own_share`
    (`shared` only): the chance that a name is the world's own; None: one pool choice as any
    other. `prompts`: its system prompt one of three per world (`fixed`) or composed of parts
    (`composed`, `PROMPT_PARTS`); drawn after the names, which it leaves as they were.
    `replies`: its final answers in the world's forms or drawn (`replies.draw_replies`)."""
    if world not in TOOL_POOLS:
        raise KeyError(f"no variants for world {world!r}; known: {', '.join(TOOL_POOLS)}")
    if names not in NAME_SPACES:
        raise ValueError(f"unknown name space {names!r}; known: {', '.join(NAME_SPACES)}")
    if prompts not in PROMPT_STYLES:
        raise ValueError(f"unknown prompt style {prompts!r}; known: {', '.join(PROMPT_STYLES)}")
    rng = random.Random(stable_int("variant", world, index, seed, *([names] if names != "pools" else []),
                                   *([own_share] if own_share is not None else [])))
    if names == "open":
        taken = _own_names(world)
        tools = {old: _open_name(rng, taken) for old in TOOL_POOLS[world]}
        taken |= set(tools.values())
        keys = {old: _open_name(rng, taken) for old in KEY_POOLS[world]}
    else:
        def pick(old: str, pool: list[str]) -> str:
            if names != "shared":
                return rng.choice(pool)
            if own_share is None:
                return rng.choice(pool + [old])
            return old if rng.random() < own_share else rng.choice(pool)

        tools = {old: pick(old, pool) for old, pool in TOOL_POOLS[world].items()}
        keys = {old: pick(old, pool) for old, pool in KEY_POOLS[world].items()}
        if all(new == old for new_names in (tools, keys) for old, new in new_names.items()):
            return make_variant(world, index, seed + 1000, names, own_share, prompts=prompts,
                                replies=replies)  # the world
    for named in (tools, keys):  # pools of different entries may share a word; keep names apart
        if len(set(named.values())) != len(named):
            return make_variant(world, index, seed + 1000, names, own_share, prompts=prompts,
                                replies=replies)
    if prompts == "fixed":
        system = rng.choice(SYSTEM_PROMPTS[world])
    else:
        system = " ".join(rng.choice(part) for part in PROMPT_PARTS[world])
    system = system.format(tool=next(iter(tools.values())))
    forms = None if replies == "world" else draw_replies(world, index, seed, replies)
    return Variant(world, index, tools, keys, system, name=f"{world}~{index}", replies=forms)


def _rename_keys(obj: Any, keys: dict[str, str]) -> Any:
    if isinstance(obj, dict):
        return {keys.get(k, k): _rename_keys(v, keys) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rename_keys(v, keys) for v in obj]
    return obj


def _rename_in_text(text: str, v: Variant) -> str:
    """Quoted names inside free text (a cut-off call the weak expert wrote as a message): tool
    names before the call's `"arguments":`, argument keys after it (the envelope's own `"name"`
    is no argument, even where a tool has an argument called name)."""
    def rename(part: str, names: dict[str, str]) -> str:
        return re.sub(r'"([A-Za-z_]+)"', lambda m: f'"{names.get(m.group(1), m.group(1))}"', part)

    cut = text.find('"arguments":')
    if cut < 0:
        return rename(text, v.tools)
    return rename(text[:cut], v.tools) + rename(text[cut:], v.keys)


def translate_tools(tools: list[dict[str, Any]], v: Variant) -> list[dict[str, Any]]:
    out = []
    for tool in tools:
        fn = tool["function"]
        params = fn.get("parameters", {})
        new_params = {**params,
                      "properties": {v.key(k): spec for k, spec in params.get("properties", {}).items()},
                      "required": [v.key(k) for k in params.get("required", [])]}
        out.append({**tool, "function": {**fn, "name": v.tool(fn["name"]), "parameters": new_params}})
    return out


def translate_message(m: Message, v: Variant) -> Message:
    if m.role == "system":
        return m.model_copy(update={"content": v.system})
    if m.role == "tool":
        if v.world not in JSON_OBSERVATIONS or not isinstance(m.content, str):
            return m  # a command's output: nothing named in it
        try:
            obs = json.loads(m.content)
        except json.JSONDecodeError:
            return m
        return m.model_copy(update={"content": compact(_rename_keys(obs, v.keys))})
    if m.role != "assistant":
        return m
    update: dict[str, Any] = {}
    if isinstance(m.content, str) and m.content:
        reply = translate_reply(m.content, v.world, v.replies) if v.replies and not m.tool_calls else None
        update["content"] = reply if reply is not None else _rename_in_text(m.content, v)
    if m.tool_calls:
        update["tool_calls"] = [ToolCall(id=c.id, function=FunctionCall(
            name=v.tool(c.function.name),
            arguments=json.dumps(_rename_keys(c.args(), v.keys))))
            for c in m.tool_calls]
    return m.model_copy(update=update)


def translate(traj: Trajectory, v: Variant) -> Trajectory:
    """`traj` of `v.world` as the variant world would have recorded it."""
    if traj.domain not in (None, v.world):
        raise ValueError(f"{traj.id}: a {traj.domain} trajectory cannot take a {v.world} variant")
    return traj.model_copy(update={
        "id": f"{traj.id}~{v.index}", "domain": v.name,
        "messages": [translate_message(m, v) for m in traj.messages],
        "tools": translate_tools(traj.tools or [], v),
        "metadata": {**traj.metadata, "variant": v.index}})


@dataclass(frozen=True)
class VariantSpec:
    """How a build draws its variants: `TestbedConfig`'s `variants` (count) and `variant_*`
    fields, documented there (`TestbedConfig.variant_spec()`)."""

    count: int = 0
    seed: int = 0
    names: str = "pools"
    own_share: float | None = None
    prompts: str = "fixed"
    replies: str = "world"

    def variant(self, world: str, index: int) -> Variant:
        return make_variant(world, index, self.seed, self.names, self.own_share,
                            prompts=self.prompts, replies=self.replies)


def translate_all(trajs: list[Trajectory], world: str, spec: VariantSpec) -> list[Trajectory]:
    """Trajectory i in variant i mod `spec.count` (round robin: every variant gets its share)."""
    variants = [spec.variant(world, i) for i in range(spec.count)]
    return [translate(t, variants[i % spec.count]) for i, t in enumerate(trajs)]
