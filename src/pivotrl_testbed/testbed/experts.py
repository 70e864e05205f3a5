"""Expert policies for the testbed worlds, and the expert (and weaker "base") trajectories.

The expert reads only what an agent sees: the parameters the user stated in words
(`metadata["task"]`) and the observations of its own earlier calls. It never looks at the hidden
state (customer ids, order ids, file names): it has to look them up, like the agent.

At every step it picks at random among FUNCTIONALLY EQUIVALENT forms of the right action:
argument order, optional arguments spelled out with their default or omitted, values the world
accepts either way (case of emails, statuses, reasons, names; `qty` 2 or "2"), equivalent shell
commands (`grep -c x f` / `grep x f | wc -l`, `head -n 3 f` / `head -3 f` …). Equivalent forms
give identical observations and states (tests check this), so exact-match reward is unfair and a
functional verifier is needed, as with real SFT data.

The weaker expert (`ExpertConfig(noise=…, habit=…)`) is what the tiny base model is pretrained
on: it has habits of its own (prefers one form), sometimes calls with a wrong id or file name
and then recovers, sometimes stops early or writes a malformed call. Its trajectories are
recorded with `metadata["success"]`. With `slips` it also makes its world's slip
(`testbed/slips.py`): the same plausible wrong action, as a habit; with `false_starts` it
opens with its world's wrong first call, then recovers.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any, Literal

from pydantic import BaseModel, Field

from pivotrl.io.records import FunctionCall, Message, ToolCall, Trajectory
from pivotrl_testbed.testbed.common import stable_int
from pivotrl_testbed.testbed.slips import false_start, grounding_slip, slip
from pivotrl_testbed.testbed.tasks import make_tasks
from pivotrl_testbed.testbed.terminal import ANSWERS as TM_ANSWERS, KIND_EXT, file_in
from pivotrl_testbed.testbed.toolshop import ANSWERS as TS_ANSWERS
from pivotrl.verifiers.world import make_world

MAX_TURNS = 8  # every task needs at most 6 turns; the weak expert may waste two


class ExpertConfig(BaseModel):
    noise: float = Field(0.0, description="Probability of a mistake at each turn (0 = the expert; "
                         "the testbed's base learns from 0.1: TestbedConfig.weak_noise).")
    habit: float = Field(0.0, description="Probability of using its habitual (last-listed) form "
                         "instead of a uniformly random one: the base's own style.")
    slips: float = Field(0.0, description="Probability of the world's slip at a step that has one "
                         "(testbed/slips.py: the same plausible wrong action each time, then on as "
                         "if right): a habit the base learns and the worlds' expert lacks. 0 = none.")
    false_starts: float = Field(0.0, description="Probability of opening with the world's false "
                                "start (testbed/slips.py: a wrong first call, its error, then the "
                                "right call): a habit at the step every task has. 0 = none.")
    grounding_slips: float = Field(0.0, description="Probability that a trajectory has the "
                                   "world's grounding slip (testbed/slips.py: every value read "
                                   "from a listing is its first entry instead of the one the task "
                                   "names; one draw per trajectory, no recovery): a skill the base "
                                   "lacks at the step that decides the task. 0 = none.")
    grounding_terminal: Literal["file", "output", "request"] = Field(
        "file", description="Terminal's grounding slip: `file`, the listing's first file where the "
        "task's file goes; `output`, the default output name where the request names one; "
        "`request`, a default for every value the request names (output, folder, level; "
        "testbed/slips.py). Toolshop's is the listing's first order either way.")
    mistakes: dict[str, float] = Field(
        default_factory=lambda: {"wrong_id": 0.6, "stop_early": 0.25, "malformed": 0.15},
        description="Relative weights of the mistake kinds of the weak expert.")


WEAK = ExpertConfig(noise=0.3, habit=0.7)  # a clearly weaker expert (tests); the base's: TestbedConfig


class Chooser:
    """Random choice among equivalent forms, with an optional habit (the last-listed form)."""

    def __init__(self, rng: random.Random, habit: float = 0.0):
        self.rng, self.habit = rng, habit

    def pick(self, options: list[Any], weights: list[float] | None = None) -> Any:
        if self.habit and self.rng.random() < self.habit:
            return options[-1]
        return self.rng.choices(options, weights=weights)[0]

    def order(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        pairs = list(pairs)
        if not (self.habit and self.rng.random() < self.habit):
            self.rng.shuffle(pairs)
        return dict(pairs)


# An expert step is ("call", tool name, arguments) or ("say", text).
Step = tuple[str, Any, Any]


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return None


def _qty(ch: Chooser, key: str, q: int, optional: bool) -> list[tuple[str, Any]]:
    if optional and q == 1 and ch.pick([True, False]):
        return []  # omitted: the schema default is 1
    return [(key, ch.pick([q, str(q)], weights=[0.85, 0.15]))]


def toolshop_step(task: dict[str, Any], obs: list[str], ch: Chooser) -> Step:
    kind, k = task["kind"], len(obs)
    seen = [_json(o) for o in obs]
    if any(isinstance(s, dict) and "error" in s for s in seen):
        return _say(ch, TS_ANSWERS["sorry"])
    email = task["email"]
    if k == 0:
        return ("call", "find_customer", {"email": ch.pick(sorted({email, email.lower()}))})
    cid = seen[0]["customer_id"]
    if kind == "move":
        if k == 1:
            city = task["city"]
            return ("call", "update_address",
                    ch.order([("customer_id", cid), ("city", ch.pick([city, city.title()]))]))
        c = seen[1]["city"].title()
        return _say(ch, TS_ANSWERS["move"], city=c)
    if kind == "count":
        if k == 1:
            return ("call", "list_orders", ch.order(
                [("customer_id", cid), ("status", ch.pick(["shipped", "Shipped", "SHIPPED"]))]))
        n = len(seen[1])
        return _say(ch, TS_ANSWERS["count"], n=n)
    if kind == "buy":
        return _buy(task, seen, k - 1, cid, ch)
    # cancel / return / change / swap: find the one order in the needed status first
    if k == 1:
        pairs = [("customer_id", cid)] + ([("status", "any")] if ch.pick([True, False]) else [])
        return ("call", "list_orders", ch.order(pairs))
    status = "delivered" if kind == "return" else "pending"
    oid = next(o["order_id"] for o in seen[1] if o["status"] == status)
    if kind in ("cancel", "swap"):
        if k == 2:
            r = task["reason"]
            pairs = [("order_id", oid)]
            if r != "changed_mind" or ch.pick([True, False]):
                pairs.append(("reason", ch.pick([r, r.upper()], weights=[0.8, 0.2])))
            return ("call", "cancel_order", ch.order(pairs))
        if kind == "cancel":
            return _say(ch, TS_ANSWERS["cancel"], oid=oid)
        return _buy(task, seen, k - 3, cid, ch, cancelled=oid)
    if k == 2:
        return ("call", "get_order", {"order_id": oid})
    pid = next(i["product_id"] for i in seen[2]["items"] if i["name"] == task["product"])
    q, p = task["qty"], task["product"]
    if k == 3:
        tool = "return_item" if kind == "return" else "change_qty"
        return ("call", tool, ch.order([("order_id", oid), ("product_id", pid)]
                                       + _qty(ch, "qty", q, optional=kind == "return")))
    if kind == "return":
        refund = seen[3]["refund"]
        return _say(ch, TS_ANSWERS["return"], qty=q, product=p, oid=oid, refund=refund)
    return _say(ch, TS_ANSWERS["change"], product=p, oid=oid, qty=q)


def _say(ch: Chooser, templates: list[str], **slots: Any) -> Step:
    """One of a world's equivalent final answers (its `ANSWERS`: the world reads them back)."""
    return ("say", (ch.pick(templates) if len(templates) > 1 else templates[0]).format(**slots))


def _buy(task, seen, j, cid, ch: Chooser, cancelled: str | None = None) -> Step:
    p, q = task["product"], task["qty"]
    if j == 0:
        return ("call", "find_product", {"name": ch.pick([p, p.capitalize()])})
    pid = seen[-1]["product_id"] if j == 1 else seen[-2]["product_id"]
    if j == 1:
        return ("call", "place_order", ch.order([("customer_id", cid), ("product_id", pid)]
                                                + _qty(ch, "qty", q, optional=True)))
    new = seen[-1]["order_id"]
    said = _say(ch, TS_ANSWERS["buy"], new=new, qty=q, product=p)
    if cancelled is None:
        return said
    return _say(ch, TS_ANSWERS["swap"], oid=cancelled, rest=said[1])


def _ls(ch: Chooser) -> Step:
    return ("call", "run", {"command": ch.pick(["ls", "ls -1", "ls .", "ls -A"])})


def terminal_step(task: dict[str, Any], obs: list[str], ch: Chooser) -> Step:
    kind, k = task["kind"], len(obs)
    if any(o.rstrip().endswith("]") and "[exit" in o for o in obs):
        return _say(ch, TM_ANSWERS["sorry"])
    run = lambda cmd: ("call", "run", {"command": cmd})  # noqa: E731
    if kind == "copy":
        w, out = task["word"], task["out"]
        if k == 0:
            return run(ch.pick([f"grep -l {w} *", f"grep -l '{w}' *",
                                f"grep --files-with-matches {w} *"]))
        f = obs[0].strip()
        if k == 1:
            return run(ch.pick([f"cp {f} {out}", f"cat {f} > {out}", f"cp ./{f} {out}",
                                f"cp {f} ./{out}"]))
        return _say(ch, TM_ANSWERS["copy"], f=f, out=out)
    if k == 0:
        return _ls(ch)
    f = file_in(obs[0], KIND_EXT[kind])
    if kind == "count":
        lv = task["level"]
        if k == 1:
            return run(ch.pick([f"grep -c {lv} {f}", f"grep {lv} {f} | wc -l",
                                f"grep -c '{lv}' {f}", f"cat {f} | grep -c {lv}"]))
        n = obs[1].strip()
        return _say(ch, TM_ANSWERS["count"], n=n, level=lv)
    if kind == "lines":
        if k == 1:
            return run(ch.pick([f"wc -l < {f}", f"cat {f} | wc -l", f"grep -c '' {f}"]))
        n = obs[1].strip()
        return _say(ch, TM_ANSWERS["lines"], n=n, f=f)
    if kind == "config":
        key = task["key"]
        if k == 1:
            return run(ch.pick([f"grep {key} {f}", f"grep '{key}' {f}", f"grep -e {key} {f}"]))
        value = obs[1].strip().split("=", 1)[-1]
        return _say(ch, TM_ANSWERS["config"], key=key, value=value)
    if kind == "head":
        n, out = task["n"], task["out"]
        if k == 1:
            return run(ch.pick([f"head -n {n} {f} > {out}", f"head -{n} {f} > {out}",
                                f"cat {f} | head -n {n} > {out}", f"head --lines={n} {f} > {out}"]))
        return _say(ch, TM_ANSWERS["head"], n=n, out=out)
    if kind == "sort":
        out = task["out"]
        if k == 1:
            return run(ch.pick([f"sort -u {f} > {out}", f"sort {f} | uniq > {out}",
                                f"cat {f} | sort -u > {out}", f"sort -u -o {out} {f}"]))
        return _say(ch, TM_ANSWERS["sort"], out=out)
    # move
    d = task["dir"]
    if k == 1:
        return run(ch.pick([f"mkdir {d}", f"mkdir -p {d}", f"mkdir ./{d}"]))
    if k == 2:
        return run(ch.pick([f"mv {f} {d}/", f"mv {f} {d}", f"mv ./{f} {d}/"]))
    return _say(ch, TM_ANSWERS["move"], f=f, d=d)


STEPS = {"toolshop": toolshop_step, "terminal": terminal_step}


class FixedChooser(Chooser):
    """Always the `index`-th form (the last one when there are fewer): enumerates the forms the
    expert may choose at one step."""

    def __init__(self, index: int):
        super().__init__(random.Random(0))
        self.index = index

    def pick(self, options: list[Any], weights: list[float] | None = None) -> Any:
        return options[min(self.index, len(options) - 1)]

    def order(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        return dict(pairs)


def step_forms(world: str, task: dict[str, Any], context: list[Message]) -> list[Step]:
    """Every step the expert may take after `context`: its equivalent forms, in order, without
    repeats ([] when it cannot act on that context)."""
    out: list[Step] = []
    for i in range(8):  # FixedChooser(i): the i-th form at every choice, the last when fewer
        try:
            step = STEPS[world](task, observations(context), FixedChooser(i))
        except (KeyError, IndexError, TypeError, StopIteration, AttributeError):
            return []
        if step not in out:
            out.append(step)
    return out


def answer_forms(world: str, task: dict[str, Any], context: list[Message]) -> list[str]:
    """Every final message the expert may send after `context` (its equivalent templates), or []
    when its next step is a call: the pairs a world's answer rule must accept as the same."""
    forms = step_forms(world, task, context)
    return [s[1] for s in forms] if forms and forms[0][0] == "say" else []


def step_message(step: Step, call_index: int) -> Message:
    """An expert step as an assistant message (arguments a JSON string in the chosen order)."""
    if step[0] == "say":
        return Message(role="assistant", content=step[1])
    return Message(role="assistant", tool_calls=[ToolCall(
        id=f"call_{call_index}", function=FunctionCall(name=step[1], arguments=json.dumps(step[2])))])


def observations(context: list[Message]) -> list[str]:
    return [m.content if isinstance(m.content, str) else "" for m in context if m.role == "tool"]


def expert_message(world: str, task: dict[str, Any], context: list[Message], seed: int,
                   habit: float = 0.0) -> Message:
    """The expert's next action after `context` (deterministic in seed, task text and step)."""
    obs = observations(context)
    user = next((m.content for m in context if m.role == "user"), "")
    ch = Chooser(random.Random(stable_int("expert", seed, user, len(obs))), habit)
    n_calls = sum(len(m.tool_calls or []) for m in context)
    try:
        step = STEPS[world](task, obs, ch)
    except (KeyError, IndexError, TypeError, StopIteration, AttributeError):
        # A context the expert did not make (a model's states): observations it cannot use.
        step = ("say", "Sorry, I could not complete that.")
    return step_message(step, n_calls)


# ---------------------------------------------------------------- trajectories


def run_expert(task: Trajectory, seed: int, config: ExpertConfig | None = None) -> Trajectory:
    """Play one task with the (possibly weak) expert in a live world; return the trajectory."""
    cfg = config or ExpertConfig()
    name = task.metadata["world"]
    world = make_world(name)
    world.reset(task.metadata["world_config"])
    params = task.metadata["task"]
    rng = random.Random(stable_int("noise", seed, task.id))
    slip_rng = random.Random(stable_int("slip", seed, task.id))  # drawn only where a slip is
    messages = list(task.messages)
    plan_context = list(task.messages)  # what the expert plans from: its good steps only
    final = None
    n_calls = 0
    start_rng = random.Random(stable_int("false start", seed, task.id))
    opening = false_start(name, params) if cfg.false_starts else None
    if opening is not None and start_rng.random() < cfg.false_starts:
        messages += _played(world, step_message(opening, 0))
        n_calls = 1  # the expert reads the error and makes the right first call next turn
    # one draw per trajectory, made only when asked for, so the data without it is as before
    ungrounded = (cfg.grounding_slips > 0
                  and random.Random(stable_int("grounding", seed, task.id)).random() < cfg.grounding_slips)
    for _ in range(MAX_TURNS):
        msg = expert_message(name, params, plan_context, seed, cfg.habit)
        if ungrounded and msg.tool_calls:
            right = ("call", msg.tool_calls[0].function.name, msg.tool_calls[0].args())
            slipped = grounding_slip(name, params, observations(plan_context), right, cfg.grounding_terminal)
            if slipped is not None:
                msg = step_message(slipped, n_calls)
        if cfg.slips and msg.tool_calls:
            right = ("call", msg.tool_calls[0].function.name, msg.tool_calls[0].args())
            slipped = slip(name, params, observations(plan_context), right)
            if slipped is not None and slip_rng.random() < cfg.slips:
                msg = step_message(slipped, n_calls)
        mistake = _mistake(rng, cfg) if cfg.noise else None
        if mistake == "stop_early" or (mistake == "malformed" and msg.tool_calls):
            final = _stop_early(name, rng) if mistake == "stop_early" else None
            bad = _malformed(msg) if mistake == "malformed" else final
            messages.append(Message(role="assistant", content=bad))
            break
        wrong = _wrong_id(name, msg, rng, n_calls) if mistake == "wrong_id" else None
        if wrong is not None:
            messages += _played(world, wrong)
            n_calls += 1
            continue  # the expert reads the error and retries with the right call next turn
        msg = _renumber(msg, n_calls)
        messages.append(msg)
        plan_context.append(msg)
        if not msg.tool_calls:
            final = msg.content
            break
        for call in msg.tool_calls:
            obs = world.execute(call.function.name, call.args())
            tool_msg = Message(role="tool", tool_call_id=call.id, content=obs)
            messages.append(tool_msg)
            plan_context.append(tool_msg)
            n_calls += 1
    ok = world.success(task.metadata["goal"], final if isinstance(final, str) else None)
    weak = bool(cfg.noise or cfg.habit or cfg.slips or cfg.false_starts or cfg.grounding_slips)
    return Trajectory(id=f"{task.id}.{'w' if weak else ''}{seed}", messages=messages,
                      tools=task.tools, domain=name,
                      metadata={**task.metadata, "expert_seed": seed, "success": ok,
                                "expert": "weak" if weak else "expert"})


def false_start_messages(task: Trajectory) -> list[Message]:
    """The weak expert's false start on `task` (`slips.false_start`) and the world's answer,
    played in a fresh world at the task's start; [] where the world has none."""
    name = task.metadata["world"]
    step = false_start(name, task.metadata["task"])
    if step is None:
        return []
    world = make_world(name)
    world.reset(task.metadata["world_config"])
    return _played(world, step_message(step, 0))


def _played(world: Any, call: Message) -> list[Message]:
    """A one-call message the expert will not plan from (a mistake), and the world's answer."""
    tc = call.tool_calls[0]
    return [call, Message(role="tool", tool_call_id=tc.id, content=world.execute(tc.function.name, tc.args()))]


def _mistake(rng: random.Random, cfg: ExpertConfig) -> str | None:
    if rng.random() >= cfg.noise:
        return None
    kinds = sorted(cfg.mistakes)
    return rng.choices(kinds, weights=[cfg.mistakes[k] for k in kinds])[0]


def _renumber(msg: Message, start: int) -> Message:
    if not msg.tool_calls:
        return msg
    calls = [c.model_copy(update={"id": f"call_{start + i}"}) for i, c in enumerate(msg.tool_calls)]
    return msg.model_copy(update={"tool_calls": calls})


def _wrong_id(world: str, msg: Message, rng: random.Random, index: int) -> Message | None:
    """The right tool with a wrong identifier (a skipped or misread lookup); None if no id."""
    if not msg.tool_calls:
        return None
    call = msg.tool_calls[0]
    args = dict(call.args())
    before = dict(args)
    if world == "terminal":
        from pivotrl_testbed.testbed.terminal import BASES

        words = args["command"].split()
        for i, w in enumerate(words):
            if re.fullmatch(r"(\./)?\w+\.\w+", w):  # a file name: misremember its base
                base, ext = w.removeprefix("./").rsplit(".", 1)
                words[i] = f"{rng.choice([b for b in BASES if b != base])}.{ext}"
                break
        args["command"] = " ".join(words)
    else:
        for key in ("order_id", "customer_id", "product_id"):
            if key in args:
                args[key] = f"{key[0]}{rng.randrange(10, 100)}"
                break
        else:
            for key in ("email", "name", "city"):
                if key in args:
                    args[key] = "x" + str(args[key])
                    break
    if args == before:
        return None
    return Message(role="assistant", tool_calls=[ToolCall(
        id=f"call_{index}", function=FunctionCall(name=call.function.name, arguments=json.dumps(args)))])


def _stop_early(world: str, rng: random.Random) -> str:
    return rng.choice(["Done.", "All set.", "I have taken care of it."])


def _malformed(msg: Message) -> str:
    call = msg.tool_calls[0]
    body = json.dumps({"name": call.function.name, "arguments": call.args()})
    return "<tool_call>\n" + body[: max(8, len(body) // 2)]  # cut off: no closing tag


def generate_trajectories(world: str, split: str, n: int, seed: int = 0,
                          config: ExpertConfig | None = None, start: int = 0) -> list[Trajectory]:
    """Expert (or, with `config`, weaker) trajectories of the first `n` tasks of `split`."""
    return [run_expert(task, seed, config) for task in make_tasks(world, split, n, start)]
