"""Agentic-format OOD probes: the worlds' own format (chat template, system prompt, tool list),
but a behaviour the worlds never ask for.

The non-agentic families (`ood.py`) are one-turn chats without tools: they share nothing with
the agentic format, so a fine-tune that narrows the model on the worlds (always call a tool when
tools are offered) cannot show up there as forgetting. These families can:

- `plain_with_tools`: a world's tool list and system prompt, and a question of a non-agentic
  family (`INNER_FAMILIES`: next, reverse, upper). Right: a plain-text answer, no tool call, and
  the text passes that family's own exact checker (`ood.check`).
- `no_tool_fits`: a world's tool list and system prompt, and a request none of its tools can
  serve (the weather, a flight, a taxi: things outside the shop and outside a sandboxed shell).
  Right: a plain-text message, no tool call, equal to one of `REFUSALS`.

- `held_out_world`: a world's task, its first turn, asked under a variant of the world drawn
  apart from the build's own (indices from `HELD_OUT_VARIANT_START`: other tool names,
  argument keys and system prompt; in the small name pools a set of names can recur, in the
  open space every name is new). Right: one tool call, the expert's first call in one of its
  own equivalent forms (`experts.FixedChooser`), renamed as that variant names things. The
  demo's arms train on the world's own names; an arm that has stopped reading the tool list
  calls the world's names here and fails: the narrowing "always the tools I was trained on"
  shows up as forgetting. In a build whose weak expert starts falsely
  (`TestbedConfig.weak_false_starts`), every `held_out_world` task opens with the world's false
  start (`slips.false_start`, as the variant names it) and the world's error, and asks the call
  after it: the base pretrains on reading a new list without being taught to open right, which
  would undo the habit the demo's data is there to correct (right first calls in the same
  context outnumber the false starts). The opening is context only: pretraining puts no loss on
  it (`build.pretrain_examples`).

Why `held_out_world` is checked by equality with the expert's forms: each accepted call is one
the world's own expert makes at that step (the forms it picks among at random: the world's rule
of equivalence), renamed by the variant's one-to-one renaming of names and keys; argument
values are compared as parsed JSON, so key order and spacing are not the answer, nor are words
written beside the call (the world's harness runs the call alone). Anything else (another
argument, another tool, a second call, text without a call) scores 0: a miss, never a payment
for a wrong call.

Why `no_tool_fits` is checked by equality with a closed set of forms: the request has no answer
in text (no tool and no knowledge can give tomorrow's weather or book a flight), so the only
right action is to decline, and the forms are the wording the base was pretrained to decline
with, as `next` fixes "124" rather than "one hundred twenty-four". Equality (ends trimmed: end
markers and outer white space) makes the probe a deterministic function of the completion with
no judge, so a change of its rate is a change of behaviour, never of grading. The price: a
refusal in other words fails (a near miss is a miss), which is what an exact probe measures.
Requests a text answer could serve (translate a sentence, tell a joke) are left out for the same
reason: declining them would not be the only right action.

Split: by the question alone, whatever tool list it comes with (`ood.split_of` of the inner
problem's key for `plain_with_tools`, of the request text for `no_tool_fits`), so a question the
base pretrained on is never an eval question, under any list, and `plain_with_tools` splits its
questions exactly as the plain families split the same ones.

`held_out_world` splits by task (its tasks are drawn past `HELD_OUT_TASK_START`, beyond the
ids of the worlds' and weak experts' tasks).

Tool lists: eval tasks carry the world's own `TOOLS` and `SYSTEM_PROMPT` (what the demo's arms
train on: forgetting caused by that training is what the probe must show), except
`held_out_world`'s, which carry held-out variants; training tasks (the base's pretraining) carry
a variant of the world (`variants.py`: other tool names, argument keys and system prompt), so
the base learns the behaviour under other tool lists and never meets a world's own list here.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pivotrl.io.records import FunctionCall, Message, ToolCall
from pivotrl_testbed.testbed import ood
from pivotrl_testbed.testbed.common import stable_int

if TYPE_CHECKING:
    from pivotrl_testbed.testbed.variants import Variant, VariantSpec

AGENTIC_FAMILIES = ("plain_with_tools", "no_tool_fits", "held_out_world")
INNER_FAMILIES = ("next", "reverse", "upper")  # the plain families a 2-layer base masters
REFUSALS = (
    "Sorry, I can't do that with the tools I have.",
    "Sorry, none of my tools can do that.",
    "That is not something my tools can do.",
)
# With a build whose base pretrains on the worlds themselves (`variants: 0`), the probes'
# training tasks still take other tool lists: this many variants per world.
DEFAULT_VARIANTS = 8
# `held_out_world`: its eval variants' indices start here, past any build's `variants` (the
# field's bound), and its tasks' ids, past the worlds' and the weak experts' task ids.
HELD_OUT_VARIANT_START = 1_000_000
HELD_OUT_TASK_START = 1_000_000

_CITIES = ["oslo", "lima", "cairo", "paris", "tokyo", "delhi", "perth", "quito", "rome", "dakar",
           "seoul", "minsk", "hanoi", "accra", "bern", "riga", "kyiv", "doha", "nairobi", "lagos"]
_DAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
_PEOPLE = ["anna", "ben", "carla", "dev", "emma", "farid", "gina", "hugo", "ines", "jon",
           "kemal", "lena"]
_GENRES = ["jazz", "rock", "folk", "blues", "reggae", "techno", "opera", "salsa"]
_SLOTS: dict[str, list[Any]] = {"city": _CITIES, "day": _DAYS, "person": _PEOPLE,
                                "genre": _GENRES, "hour": list(range(1, 13)), "n": list(range(2, 10))}
# Requests outside every offered tool: real-world actions and live data (the terminal's sandbox
# has no network, the shop's tools only its orders and products).
_COMMON = [
    "What's the weather in {city} today?",
    "Book me a flight to {city} on {day}.",
    "Call a taxi to take me to {city} station.",
    "Play some {genre} music.",
    "Send a text to {person} saying I am late.",
    "Set an alarm for {hour} o'clock tomorrow.",
    "Reserve a table for {n} at a restaurant in {city}.",
    "Remind {person} about the meeting on {day}.",
]
REQUESTS: dict[str, list[str]] = {
    "toolshop": _COMMON + ["Pay my electricity bill for {day}.",
                           "Turn on the lights in {person}'s kitchen."],
    "terminal": _COMMON + ["Order a pizza for {n} people.",
                           "Ring {person}'s phone for me."],
}


def _world(world: str):
    from pivotrl_testbed.testbed.tasks import world_module

    return world_module(world)


def _first_calls(world: str, task_id: str, offer: "Offer",
                 opening: bool) -> tuple[str, str, list[dict[str, Any]] | None]:
    """(the task's request, the JSON list of the expert's first-call forms as `offer` names
    them: [{"name", "arguments"}], and with `opening` the false start and its error as `offer`
    names them, as message dicts)."""
    from pivotrl_testbed.testbed.experts import false_start_messages, step_forms, step_message
    from pivotrl_testbed.testbed.tasks import make_task
    from pivotrl_testbed.testbed.variants import translate_message

    task = make_task(world, task_id)
    forms: list[dict[str, Any]] = []
    for step in step_forms(world, task.metadata["task"], []):
        msg = step_message(step, 0)
        call = (translate_message(msg, offer.variant) if offer.variant else msg).tool_calls[0].function
        form = {"name": call.name, "arguments": json.loads(call.arguments)}
        if form not in forms:  # two steps can differ only in a name the variant maps alike
            forms.append(form)
    said = [translate_message(m, offer.variant) if offer.variant else m
            for m in false_start_messages(task)] if opening else []
    return (str(task.messages[-1].content), json.dumps(forms),
            [m.model_dump(exclude_none=True) for m in said] or None)


def _question(family: str, world: str, rng: random.Random, offer: "Offer",
              opening: bool = False) -> tuple[str, str, str, str, list[dict[str, Any]] | None]:
    """(split key: the question alone, prompt, answer, inner family, opening) of one problem."""
    if family == "held_out_world":
        task_id = f"{world}-{HELD_OUT_TASK_START + rng.randrange(1_000_000)}"
        prompt, answer, said = _first_calls(world, task_id, offer, opening)
        return f"task {task_id}", prompt, answer, "", said
    if family == "plain_with_tools":
        inner = rng.choice(INNER_FAMILIES)
        key, fields, answer = ood._problem(inner, rng)
        return key, rng.choice(ood._PROMPTS[inner]).format(**fields), answer, inner, None
    if family == "no_tool_fits":
        template = rng.choice(REQUESTS[world])
        prompt = template.format(**{k: rng.choice(v) for k, v in _SLOTS.items()})
        return f"request {prompt}", prompt, rng.choice(REFUSALS), "", None
    raise KeyError(f"unknown agentic OOD family {family!r}; known: {', '.join(AGENTIC_FAMILIES)}")


@dataclass(frozen=True)
class Offer:
    """The tool list and system prompt a task is asked under, and the name of their world."""

    name: str
    tools: list[dict[str, Any]]
    system: str
    variant: Variant | None = None  # None: the world itself


def offers(world: str, split: str, spec: VariantSpec | None = None,
           held_out: bool = False) -> list[Offer]:
    """What `split`'s tasks of `world` are asked under: eval, the world's own list and system
    prompt (`held_out`: `DEFAULT_VARIANTS` variants from `HELD_OUT_VARIANT_START` on, past any
    build's own indices); train, `spec.count` (`DEFAULT_VARIANTS` when 0) of the build's variants
    of the world, never the world itself. A variant whose tool names are all the
    world's (possible in the `shared` space, where only an argument key may differ: terminal's
    one tool keeps `run` one time in nine) is passed over for the next one, so no training task
    offers the world's own set of tool names."""
    from pivotrl_testbed.testbed.variants import VariantSpec, translate_tools

    spec = spec or VariantSpec()
    mod = _world(world)
    if split == "eval" and not held_out:
        return [Offer(world, mod.TOOLS, mod.SYSTEM_PROMPT)]
    own = {t["function"]["name"] for t in mod.TOOLS}
    out: list[Offer] = []
    i = HELD_OUT_VARIANT_START if split == "eval" else 0
    while len(out) < (DEFAULT_VARIANTS if split == "eval" else spec.count or DEFAULT_VARIANTS):
        v = spec.variant(world, i)
        i += 1
        tools = translate_tools(mod.TOOLS, v)
        if {t["function"]["name"] for t in tools} != own:
            out.append(Offer(v.name, tools, v.system, v))
    return out


def generate(family: str, split: str, n: int, seed: int = 0, worlds: list[str] | None = None,
             spec: VariantSpec | None = None, false_starts: bool = False) -> list[ood.OODTask]:
    """`n` distinct tasks of agentic `family` on `split`, the worlds taken in turn (each world's
    tasks asked under `offers(world, split, ...)`, the variants in turn); deterministic in every
    argument. Ids are `<family>-<world>-<seed>-<i>`: the family comes first, before any '-'.
    `false_starts`: `held_out_world` tasks open with the world's false start and its error
    (module doc); the same tasks and answers as without."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    if family not in AGENTIC_FAMILIES:
        raise KeyError(f"unknown agentic OOD family {family!r}; known: {', '.join(AGENTIC_FAMILIES)}")
    worlds = list(worlds or ["toolshop", "terminal"])
    lists = {w: offers(w, split, spec, held_out=family == "held_out_world") for w in worlds}
    out: list[ood.OODTask] = []
    seen: set[str] = set()
    i = 0
    while len(out) < n:
        world = worlds[len(out) % len(worlds)]
        offer = lists[world][(len(out) // len(worlds)) % len(lists[world])]
        rng = random.Random(stable_int("agentic-ood", family, world, seed, i))
        question, prompt, answer, inner, said = _question(family, world, rng, offer, false_starts)
        i += 1
        if i > 50 * n + 1000:
            raise ValueError(f"family {family!r} has too few distinct {split} problems for n={n}")
        key = f"{family} {offer.name} {question}"  # one question once per tool list
        if key in seen or ood.split_of(question) != split:
            continue
        seen.add(key)
        out.append(ood.OODTask(f"{family}-{world}-{seed}-{i - 1}", family, prompt, answer, split,
                               key, system=offer.system, tools=offer.tools, world=offer.name,
                               inner=inner, opening=said))
    return out


def question_key(task: ood.OODTask) -> str:
    """The question of an agentic task without its tool list: the unit of the train/eval split."""
    return task.key.split(" ", 2)[2]


def check(task: ood.OODTask, completion: str) -> bool:
    """Exact checker of an agentic task: the completion, read by the library's own parser
    (`pivotrl.formats.actions.parse_completion`), is valid and calls no tool, and its text is
    the inner family's exact answer (`plain_with_tools`) or one of `REFUSALS`, ends trimmed
    (`no_tool_fits`); for `held_out_world`, it is exactly one tool call equal to one of the
    answer's forms (name, and arguments as parsed JSON). An unparseable completion fails."""
    from pivotrl.formats.actions import parse_completion

    if task.family not in AGENTIC_FAMILIES:
        raise KeyError(f"not an agentic OOD task: family {task.family!r}")
    if not isinstance(completion, str):
        return False
    parsed = parse_completion(completion)
    if task.family == "held_out_world":
        return parsed.valid and _one_of_the_calls(parsed.message, task.answer)
    if not parsed.valid or parsed.message is None or parsed.message.tool_calls:
        return False
    text = parsed.message.content
    if not isinstance(text, str):
        return False
    if task.family == "plain_with_tools":
        return ood.check(task.inner, text, task.answer)
    return ood._END.sub("", text).strip() in REFUSALS


def _one_of_the_calls(message: Any, answer: str) -> bool:
    calls = (message.tool_calls or []) if message is not None else []
    if len(calls) != 1:
        return False
    try:
        args = json.loads(calls[0].function.arguments)
    except (TypeError, ValueError):
        return False
    return {"name": calls[0].function.name, "arguments": args} in json.loads(answer)


def expected_reply(task: ood.OODTask) -> Message:
    """The assistant message that answers any OOD task (what pretraining learns and drift
    scores): `held_out_world`'s first form as a tool call, every other family's answer as text."""
    if task.family != "held_out_world":
        return Message(role="assistant", content=task.answer)
    form = json.loads(task.answer)[0]
    index = sum(len(m.get("tool_calls") or []) for m in task.opening or [])
    return Message(role="assistant", tool_calls=[ToolCall(id=f"call_{index}", function=FunctionCall(
        name=form["name"], arguments=json.dumps(form["arguments"])))])


def reply_text(task: ood.OODTask) -> str:
    """`expected_reply` as the model writes it (`formats.actions.render_action`: the Hermes form
    the testbed's template renders and `parse_completion` reads): what bounds a reply's length."""
    from pivotrl.formats.actions import render_action

    return render_action(expected_reply(task))


def score(task: ood.OODTask, completion: str) -> bool:
    """Any OOD task's checker: agentic families here, the others `ood.check`."""
    if task.family in AGENTIC_FAMILIES:
        return check(task, completion)
    return ood.check(task.family, completion, task.answer)


def family_of(item: Any) -> str:
    """The family of an OOD item id (`<family>-...`; no family name holds a '-')."""
    return str(item).split("-")[0]


def is_agentic(item: Any) -> bool:
    """Whether an OOD item id belongs to an agentic-format family."""
    return family_of(item) in AGENTIC_FAMILIES


def mean_by_kind(families: dict[str, dict[str, Any]]) -> dict[str, float]:
    """{"ood": mean accuracy over the non-agentic families, "agentic_ood": over the agentic-format
    ones}, each present only where such families have an accuracy: the two kinds are never
    pooled (`split_kinds` is the same rule for item rows)."""
    out: dict[str, float] = {}
    for kind, agentic in (("ood", False), ("agentic_ood", True)):
        accs = [v["accuracy"] for f, v in families.items()
                if "accuracy" in v and (f in AGENTIC_FAMILIES) == agentic]
        if accs:
            out[kind] = sum(accs) / len(accs)
    return out


def split_kinds(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Item rows with the agentic-format OOD rows relabelled `measure: "agentic_ood"`, so every
    rule that reads `"ood"` (verdicts, frontier, power) reads the non-agentic families only and
    the agentic ones are judged apart. items.jsonl keeps `"ood"` for both."""
    return [{**r, "measure": "agentic_ood"} if r.get("measure") == "ood" and is_agentic(r["item"])
            else r for r in items]
