"""`toolshop`: a τ²-Bench-style customer-service world (customers, orders, products, a policy).

Ten tools with JSON-schema parameters. Tasks need 2–5 calls where later arguments come from
earlier observations (email → customer id → order id → product id …) and end with a message to
the user. Success is judged end to end: the final state must equal the goal state exactly (so a
wrong cancellation or a stray order fails the task), the episode must end with a message, and
for questions the message must state the fact asked for.

The world accepts equivalent spellings where a real backend would: emails, statuses, reasons,
product names and cities are case-insensitive; `qty` may be 2 or "2"; optional arguments have
defaults. Observations and stored values are canonical, so equivalent calls give identical
observations and states. Errors are observations (`{"error": …}`), never exceptions.
"""

from __future__ import annotations

import copy
import random
import re
from typing import Any

from pivotrl_testbed.testbed.common import compact, read_answer, sentence_end
from pivotrl.verifiers.world import register_world

NAME = "toolshop"
SYSTEM_PROMPT = ("You are a shop assistant. Use the tools to help the user. Policy: only pending "
                 "orders can be cancelled or changed; only delivered orders can be returned. "
                 "When done, reply to the user.")

NAMES = ["ann", "bob", "cat", "dan", "eve", "fay", "gus", "hal", "ivy", "jon", "kim", "lea"]
DOMAINS = ["mail.com", "shop.io", "web.net"]
CITIES = ["oslo", "rome", "lima", "kyiv", "bern", "doha", "riga", "nice"]
PRODUCTS = ["lamp", "mug", "desk", "pen", "bag", "cap", "sock", "fan", "kettle", "chair"]
STATUSES = ["pending", "shipped", "delivered", "cancelled"]
REASONS = ["duplicate", "changed_mind", "too_slow"]


def _tool(name: str, desc: str, props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": desc,
        "parameters": {"type": "object", "properties": props, "required": required}}}


_S, _I = {"type": "string"}, {"type": "integer"}
TOOLS = [
    _tool("find_customer", "Find a customer by email.", {"email": _S}, ["email"]),
    _tool("get_customer", "Get a customer's details.", {"customer_id": _S}, ["customer_id"]),
    _tool("list_orders", "List a customer's orders.",
          {"customer_id": _S, "status": {"type": "string", "enum": ["any"] + STATUSES,
                                         "default": "any"}}, ["customer_id"]),
    _tool("get_order", "Get an order's items.", {"order_id": _S}, ["order_id"]),
    _tool("find_product", "Find a product by name.", {"name": _S}, ["name"]),
    _tool("cancel_order", "Cancel a pending order.",
          {"order_id": _S, "reason": {"type": "string", "enum": REASONS, "default": "changed_mind"}},
          ["order_id"]),
    _tool("return_item", "Return items of a delivered order.",
          {"order_id": _S, "product_id": _S, "qty": {"type": "integer", "default": 1}},
          ["order_id", "product_id"]),
    _tool("place_order", "Order a product for a customer.",
          {"customer_id": _S, "product_id": _S, "qty": {"type": "integer", "default": 1}},
          ["customer_id", "product_id"]),
    _tool("update_address", "Set a customer's city.", {"customer_id": _S, "city": _S},
          ["customer_id", "city"]),
    _tool("change_qty", "Change an item's quantity in a pending order.",
          {"order_id": _S, "product_id": _S, "qty": _I}, ["order_id", "product_id", "qty"]),
]
_SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
KINDS = ["cancel", "return", "buy", "move", "count", "change", "swap"]
CALLS_PER_KIND = {"cancel": 3, "return": 4, "buy": 3, "move": 2, "count": 2, "change": 4, "swap": 5}


_FOLDED = {"email", "name", "city"}  # the tools look these up / store them lower-cased

# The final answers the expert chooses among, by task kind: the forms in one list are the same
# answer (the world's `canonical_message` reads them back). A swap answer is the cancel prefix
# followed by a buy answer.
ANSWERS: dict[str, list[str]] = {
    "move": ["Your city is now {city}.", "Done, I updated your city to {city}."],
    "count": ["You have {n} shipped orders.", "{n} of your orders have shipped."],
    "cancel": ["Your order {oid} is cancelled.", "Done: order {oid} has been cancelled."],
    "return": ["I returned {qty} {product} from order {oid}. Refund: {refund}.",
               "Done, {qty} {product} returned from {oid}, refund {refund}."],
    "change": ["Done: {product} in order {oid} is now {qty}.", "Order {oid} now has {qty} {product}."],
    "buy": ["Order {new} is placed for {qty} {product}.", "Done: your order {new} is placed."],
    "swap": ["Order {oid} is cancelled. {rest}"],
    "sorry": ["Sorry, I could not complete that."],
}


class ToolError(Exception):
    pass


def _text(args: dict[str, Any], key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ToolError(f"{key} must be a non-empty string")
    return value.strip()


def _qty(args: dict[str, Any], key: str = "qty", default: int | None = 1) -> int:
    value = args.get(key, default)
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())  # "2" is accepted, as many real backends do
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 99:
        raise ToolError(f"{key} must be an integer from 1 to 99")
    return value


def _choice(args: dict[str, Any], key: str, allowed: list[str], default: str) -> str:
    value = args.get(key, default)
    if not isinstance(value, str) or value.strip().lower() not in allowed:
        raise ToolError(f"{key} must be one of {', '.join(allowed)}")
    return value.strip().lower()


class ToolshopWorld:
    name = NAME

    def __init__(self) -> None:
        self.state: dict[str, Any] = {"customers": {}, "orders": {}, "products": {}, "next": 10}

    def reset(self, config: dict[str, Any]) -> None:
        self.state = copy.deepcopy(config["state"])

    def snapshot(self) -> dict[str, Any]:
        return copy.deepcopy(self.state)

    def execute(self, name: str, arguments: dict[str, Any]) -> str:

        schema = _SCHEMAS.get(name)
        if schema is None:
            return compact({"error": f"unknown tool {name}"})
        if not isinstance(arguments, dict):
            return compact({"error": "arguments must be an object"})
        unknown = sorted(set(arguments) - set(schema["properties"]))
        if unknown:
            return compact({"error": f"unknown argument {unknown[0]}"})
        missing = [k for k in schema["required"] if k not in arguments]
        if missing:
            return compact({"error": f"missing argument {missing[0]}"})
        try:
            return compact(getattr(self, "_" + name)(arguments))
        except ToolError as exc:
            return compact({"error": str(exc)})

    def canonical_call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any] | None:
        """The arguments as `execute` reads them (ids stripped; emails, names and cities
        lower-cased; statuses and reasons folded; qty parsed; defaults filled), or None when
        `execute` rejects the call before it looks at the state. The verifiers' action rule:
        calls with equal forms do the same thing here."""
        schema = _SCHEMAS.get(name)
        if schema is None or not isinstance(arguments, dict):
            return None
        props = schema["properties"]
        if set(arguments) - set(props) or any(k not in arguments for k in schema["required"]):
            return None
        out: dict[str, Any] = {}
        try:
            for key, spec in props.items():
                if key == "qty":
                    out[key] = _qty(arguments, key, spec.get("default"))
                elif "enum" in spec:
                    out[key] = _choice(arguments, key, spec["enum"], spec["default"])
                else:
                    value = _text(arguments, key)
                    out[key] = value.lower() if key in _FOLDED else value
        except ToolError:
            return None
        return out

    def canonical_message(self, text: str) -> tuple | None:
        """A final answer as this world reads it (`pivotrl.verifiers.world`): its kind and the
        facts it states, names folded as the tools fold them; a buy answer that leaves out the
        product and quantity reads the same as one that states them when the state confirms
        them (a stated product or quantity the order does not hold stays in, so it differs).
        The end of a sentence reads as the user reads it: "!" or no full stop for "."."""
        read = read_answer(sentence_end(text), ANSWERS)
        if read is None:
            return None
        kind, slots = read
        if kind == "swap":  # the cancel prefix, then exactly one buy answer
            rest = read_answer(slots["rest"], {"buy": ANSWERS["buy"]})
            if rest is None:
                return None
            return ("swap", slots["oid"], self._bought(rest[1]))
        if kind == "buy":
            return self._bought(slots)
        return (kind, *sorted((k, v.lower() if k in ("city", "product") else v)
                              for k, v in slots.items()))

    def _bought(self, slots: dict[str, str]) -> tuple:
        """A buy answer: the order id, and the product and quantity it states only when the
        order does not hold them (a false claim keeps it apart from the short form)."""
        order = self.state["orders"].get(slots["new"], {})
        held = {(self.state["products"].get(p, {}).get("name"), str(q))
                for p, q in order.get("items", {}).items()}
        stated = (slots.get("product", "").lower(), slots.get("qty"))
        if "qty" in slots and stated not in held:
            return ("buy", slots["new"], "states", *stated)
        return ("buy", slots["new"])

    def success(self, goal: dict[str, Any], final_message: str | None) -> bool:
        if final_message is None or self.state != goal["state"]:
            return False
        return all(mentions(final_message, m) for m in goal.get("mention", []))

    # ---------------------------------------------------------------- tools

    def _customer(self, args: dict[str, Any]) -> str:
        cid = _text(args, "customer_id")
        if cid not in self.state["customers"]:
            raise ToolError(f"no customer {cid}")
        return cid

    def _order(self, args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        oid = _text(args, "order_id")
        if oid not in self.state["orders"]:
            raise ToolError(f"no order {oid}")
        return oid, self.state["orders"][oid]

    def _product(self, args: dict[str, Any]) -> str:
        pid = _text(args, "product_id")
        if pid not in self.state["products"]:
            raise ToolError(f"no product {pid}")
        return pid

    def _find_customer(self, args):
        email = _text(args, "email").lower()
        for cid, c in self.state["customers"].items():
            if c["email"] == email:
                return {"customer_id": cid, "name": c["name"]}
        raise ToolError("no customer with that email")

    def _get_customer(self, args):
        cid = self._customer(args)
        return {"customer_id": cid, **self.state["customers"][cid]}

    def _list_orders(self, args):
        cid = self._customer(args)
        status = _choice(args, "status", ["any"] + STATUSES, "any")
        return [{"order_id": oid, "status": o["status"]} for oid, o in self.state["orders"].items()
                if o["customer"] == cid and status in ("any", o["status"])]

    def _get_order(self, args):
        oid, o = self._order(args)
        items = [{"product_id": p, "name": self.state["products"][p]["name"], "qty": q}
                 for p, q in o["items"].items()]
        return {"order_id": oid, "status": o["status"], "items": items}

    def _find_product(self, args):
        name = _text(args, "name").lower()
        for pid, p in self.state["products"].items():
            if p["name"] == name:
                return {"product_id": pid, "price": p["price"], "stock": p["stock"]}
        raise ToolError("no product with that name")

    def _cancel_order(self, args):
        oid, o = self._order(args)
        reason = _choice(args, "reason", REASONS, "changed_mind")
        if o["status"] != "pending":
            raise ToolError(f"order {oid} is {o['status']}, not pending")
        o["status"], o["reason"] = "cancelled", reason
        for pid, q in o["items"].items():
            self.state["products"][pid]["stock"] += q
        return {"order_id": oid, "status": "cancelled"}

    def _return_item(self, args):
        oid, o = self._order(args)
        pid, qty = self._product(args), _qty(args)
        if o["status"] != "delivered":
            raise ToolError(f"order {oid} is {o['status']}, not delivered")
        have = o["items"].get(pid, 0) - o.get("returned", {}).get(pid, 0)
        if qty > have:
            raise ToolError(f"only {have} of {pid} can be returned")
        o.setdefault("returned", {})[pid] = o.get("returned", {}).get(pid, 0) + qty
        self.state["products"][pid]["stock"] += qty
        return {"order_id": oid, "returned": qty, "refund": qty * self.state["products"][pid]["price"]}

    def _place_order(self, args):
        cid, pid, qty = self._customer(args), self._product(args), _qty(args)
        product = self.state["products"][pid]
        if product["stock"] < qty:
            raise ToolError(f"only {product['stock']} in stock")
        oid = f"o{self.state['next']}"
        self.state["next"] += 1
        product["stock"] -= qty
        self.state["orders"][oid] = {"customer": cid, "status": "pending", "items": {pid: qty}}
        return {"order_id": oid, "total": qty * product["price"]}

    def _update_address(self, args):
        cid = self._customer(args)
        city = _text(args, "city").lower()
        self.state["customers"][cid]["city"] = city
        return {"customer_id": cid, "city": city}

    def _change_qty(self, args):
        oid, o = self._order(args)
        pid, qty = self._product(args), _qty(args, default=None)
        if o["status"] != "pending":
            raise ToolError(f"order {oid} is {o['status']}, not pending")
        if pid not in o["items"]:
            raise ToolError(f"{pid} is not in order {oid}")
        stock = self.state["products"][pid]
        if stock["stock"] + o["items"][pid] < qty:
            raise ToolError(f"only {stock['stock'] + o['items'][pid]} available")
        stock["stock"] += o["items"][pid] - qty
        o["items"][pid] = qty
        return {"order_id": oid, "product_id": pid, "qty": qty}


register_world(NAME, ToolshopWorld)


def mentions(text: str, fact: str) -> bool:
    """Whether `text` states `fact` as a whole word (case-insensitive): "3" is not in "13"."""
    return re.search(r"(?<![\w])" + re.escape(fact) + r"(?![\w])", text, re.I) is not None


# ---------------------------------------------------------------- task generation

_REASON_WORDS = {"duplicate": ["I ordered it twice", "it is a duplicate"],
                 "changed_mind": ["I changed my mind", "I do not want it anymore"],
                 "too_slow": ["it is taking too long", "shipping is too slow"]}
_TEMPLATES = {
    "cancel": ["Hi, I am {email}. Please cancel my pending order, {why}.",
               "Cancel my pending order please, {why}. My email is {email}.",
               "{email} here. {Why}, so cancel the order that is still pending."],
    "return": ["I am {email}. I want to return {qty} {product} from my delivered order.",
               "Please return {qty} {product} from my delivered order. Email: {email}.",
               "{email} here. Return {qty} of the {product} I received, please."],
    "buy": ["Hi, {email} here. Please order {qty} {product} for me.",
            "I would like to buy {qty} {product}. My email is {email}.",
            "Order {qty} {product} for {email}, thanks."],
    "move": ["I moved to {city}. My email is {email}. Please update my address.",
             "{email} here. Change my city to {city}.",
             "Please set my city to {city}. Email: {email}."],
    "count": ["I am {email}. How many of my orders have shipped?",
              "How many shipped orders do I have? Email: {email}.",
              "{email} here. Count my orders that are shipped, please."],
    "change": ["I am {email}. In my pending order, change the {product} to {qty}.",
               "Please make it {qty} {product} in my pending order. Email: {email}.",
               "{email} here. Set the {product} quantity of my pending order to {qty}."],
    "swap": ["I am {email}. Cancel my pending order, {why}, and order {qty} {product} instead.",
             "{email} here. {Why}: cancel my pending order and buy {qty} {product}.",
             "Please cancel my pending order ({why}) and order {qty} {product}. Email: {email}."],
}


def _statuses(rng: random.Random, k: int, exclude: set[str]) -> list[str]:
    pool = [s for s in STATUSES if s not in exclude]
    return [rng.choice(pool) for _ in range(k)]


def generate(task_id: str, rng: random.Random) -> dict[str, Any]:
    """One task: initial state, goal state (by running the intended calls), user text, params."""
    kind = KINDS[rng.randrange(len(KINDS))]
    names = rng.sample(NAMES, 3)
    cids = [f"c{n}" for n in rng.sample(range(10, 100), 3)]
    customers = {cid: {"name": nm, "email": f"{nm}{rng.randrange(10)}@{rng.choice(DOMAINS)}",
                       "city": rng.choice(CITIES)} for cid, nm in zip(cids, names)}
    pnames = rng.sample(PRODUCTS, 5)
    pids = [f"p{n}" for n in rng.sample(range(1, 10), 5)]
    products = {pid: {"name": nm, "price": rng.randrange(5, 90), "stock": rng.randrange(3, 9)}
                for pid, nm in zip(pids, pnames)}
    oids = [f"o{n}" for n in rng.sample(range(10, 60), 7)]
    me = cids[0]
    # The target customer's orders are shaped so the task has exactly one right answer.
    need = {"cancel": "pending", "swap": "pending", "change": "pending", "return": "delivered"}
    mine: list[str] = []
    if kind in need:
        mine = [need[kind]] + _statuses(rng, rng.randrange(1, 3), {need[kind]})
    elif kind == "count":
        n_shipped = rng.randrange(0, 4)
        mine = ["shipped"] * n_shipped + _statuses(rng, rng.randrange(1, 3), {"shipped"})
    else:
        mine = _statuses(rng, rng.randrange(1, 3), set())
    rng.shuffle(mine)
    owners = [me] * len(mine) + [rng.choice(cids[1:]) for _ in range(len(oids) - len(mine))]
    statuses = mine + _statuses(rng, len(oids) - len(mine), set())
    orders = {}
    for oid, owner, status in zip(oids, owners, statuses):
        items = {p: rng.randrange(1, 4) for p in rng.sample(pids, rng.randrange(1, 3))}
        orders[oid] = {"customer": owner, "status": status, "items": items}
    state = {"customers": customers, "orders": orders, "products": products,
             "next": rng.randrange(60, 100)}

    target = next((o for o in oids if orders[o]["customer"] == me
                   and orders[o]["status"] == need.get(kind)), None)
    email = customers[me]["email"]
    shown = email if rng.random() < 0.5 else email.capitalize()  # users type emails either way
    task: dict[str, Any] = {"kind": kind, "email": shown}
    calls: list[tuple[str, dict[str, Any]]] = []
    mention: list[str] = []
    if kind in ("cancel", "swap"):
        task["reason"] = rng.choice(REASONS)
        calls.append(("cancel_order", {"order_id": target, "reason": task["reason"]}))
    if kind in ("return", "change"):
        pid = rng.choice(sorted(orders[target]["items"]))
        have = orders[target]["items"][pid]
        qty = rng.randrange(1, have + 1) if kind == "return" else rng.choice(
            [q for q in range(1, 5) if q != have])
        task.update(product=products[pid]["name"], qty=qty)
        calls.append(("return_item" if kind == "return" else "change_qty",
                      {"order_id": target, "product_id": pid, "qty": qty}))
    if kind in ("buy", "swap"):
        pid = rng.choice(pids)
        task.update(product=products[pid]["name"], qty=rng.randrange(1, 4))
        calls.append(("place_order", {"customer_id": me, "product_id": pid, "qty": task["qty"]}))
    if kind == "move":
        task["city"] = rng.choice([c for c in CITIES if c != customers[me]["city"]])
        calls.append(("update_address", {"customer_id": me, "city": task["city"]}))
    if kind == "count":
        mention.append(str(sum(o["customer"] == me and o["status"] == "shipped"
                               for o in orders.values())))
    world = ToolshopWorld()
    world.reset({"state": state})
    for name, args in calls:
        obs = world.execute(name, args)
        assert '"error"' not in obs, (task_id, name, obs)
    why = rng.choice(_REASON_WORDS[task["reason"]]) if "reason" in task else ""
    user = rng.choice(_TEMPLATES[kind]).format(
        email=shown, why=why, Why=why[:1].upper() + why[1:], qty=task.get("qty"),
        product=task.get("product"), city=task.get("city", "").title())
    return {"user": user, "world_config": {"state": state},
            "goal": {"state": world.snapshot(), "mention": mention}, "task": task}
