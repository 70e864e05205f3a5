"""The episode runner: a policy talks to a world turn by turn, judged end to end.

Each turn the policy returns raw completion text; it is parsed with the same parser as profiling
and training (`actions.parse_completion`) and the tool calls are executed in the world, one tool
message per call. An assistant message without tool calls ends the *user turn* (its text is the
final message the goal may check). Rules, chosen to match what a deployed harness does:
- an *invalid* action (unparseable completion) is recorded as an assistant message holding the
  raw text and ends the user turn, as BFCL's handler does ("Failed to decode the model response.
  Proceed to next turn."): the policy meets the consequence of its own output. On a single-turn
  task that ends the episode as a failure;
- a task may carry several user turns: every user message of the task after its opening (a run
  of user messages between assistant/tool messages is one user turn). When the agent ends a user
  turn, the runner delivers the next one, calling the world's `begin_turn()` if it has one (BFCL
  checks calls per user turn), and adds the tools that message carries in an extra `tools` field
  (BFCL miss_func adds held-out functions mid-episode);
- `max_steps_per_turn` (optional; BFCL: `MAXIMUM_STEP_LIMIT` = 20) force-quits the episode when
  one user turn executes more tool steps than that, as BFCL does; `max_turns` caps the model
  turns of the whole episode (0 = no cap);
- an episode that stops before every user turn was delivered fails, whatever the world says
  (BFCL fails a result with fewer turns than its ground truth); reaching `max_turns` without a
  final message is a failure too.
Success is `world.success(goal, final_message)` once the episode is over (for BFCL: its own
`multi_turn_checker` over all user turns).

`run_episodes` steps all episodes in lockstep so a model policy generates one batch per turn.
Every model turn is counted: `model_turns` is the compute unit "rollout turns" of the paper.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from pivotrl.formats.actions import parse_completion, render_action
from pivotrl.formats.chat import completion_text
from pivotrl.io.records import Message, Trajectory, Turn, message_text
from pivotrl.sandbox.bwrap import BROKEN_ENVIRONMENT
from pivotrl.scoring import Parser, score_completions
from pivotrl.verifiers.world import concurrent_world, make_world

MAX_TURNS = 8  # every testbed task needs at most 6 turns (DESIGN: episodes ≤ 8 turns)
EPISODE_THREADS = 4  # threads stepping the episodes of a `concurrent` world (as the verifiers')


class Policy(Protocol):
    def act(self, context: list[Message], tools: list[dict[str, Any]]) -> str:
        """Raw completion text for the next assistant turn (may also offer `act_batch`)."""


def act_batch(policy: Any, contexts: Sequence[list[Message]],
              tools: Sequence[list[dict[str, Any]]]) -> list[str]:
    if hasattr(policy, "act_batch"):
        return list(policy.act_batch(list(contexts), list(tools)))
    return [policy.act(c, t) for c, t in zip(contexts, tools)]


# ---------------------------------------------------------------- policies


class ScriptedPolicy:
    """The expert as a policy: reads the user request and its observations, answers with the
    canonical Hermes text of its action (deterministic given the seed).

    Testbed tasks (`metadata["task"]`) are solved by the testbed expert. Any other trajectory
    (BFCL, a user's SFT data) is *replayed*: in user turn u, after s assistant steps of that
    turn, the policy answers the recorded s-th assistant message of turn u, so the runner
    re-executes the recording in a live world (past the recording's end it closes the turn).
    Recordings with the same context but different actions cannot be told apart by a
    context-only policy (BFCL's base and long_context tasks, before the first observation):
    give it one BFCL category at a time."""

    def __init__(self, tasks: Sequence[Trajectory], seed: int = 0, habit: float = 0.0):
        # Tasks are recognised by their user text; two tasks with the same text have the same
        # stated parameters, so the expert acts the same on both.
        self.by_text: dict[str, tuple[str, Any]] = {}
        self.recorded: dict[str, list[Trajectory]] = {}
        for t in tasks:
            if "task" in t.metadata:
                self.by_text[_user_text(t.messages)] = (t.metadata["world"], t.metadata["task"])
            else:
                self.recorded.setdefault(_user_text(t.messages), []).append(t)
        self.seed, self.habit = seed, habit

    def act(self, context: list[Message], tools: list[dict[str, Any]]) -> str:
        from pivotrl_testbed.testbed.experts import expert_message

        key = _user_text(context)
        if key in self.recorded and key not in self.by_text:
            return render_action(replay_message(self.recorded[key], context, tools))
        if key not in self.by_text:
            return "I cannot help with that."
        world, task = self.by_text[key]
        return render_action(expert_message(world, task, context, self.seed, self.habit))


def _norm(m: Message) -> tuple:
    calls = []
    for c in m.tool_calls or []:
        try:
            calls.append((c.function.name, json.dumps(c.args(), sort_keys=True)))
        except ValueError:
            calls.append((c.function.name, str(c.function.arguments)))
    return (m.role, message_text(m), tuple(calls))


def _tool_names(tools: Sequence[dict[str, Any]]) -> set[str]:
    return {t.get("function", t).get("name", "") for t in tools if isinstance(t, dict)}


def replay_message(candidates: Sequence[Trajectory], context: list[Message],
                   tools: Sequence[dict[str, Any]]) -> Message:
    """The recorded expert's next message for `context` (see `ScriptedPolicy`).

    Several recordings can open alike (BFCL's base and long_context tasks ask the same first
    question); the one whose user turns, tool list and whole prefix agree most with the
    context is replayed."""
    opening_ctx, later_ctx = split_user_turns(context)
    ctx_users = [[message_text(m) for m in turn if m.role == "user"]
                 for turn in [opening_ctx] + later_ctx]
    names = _tool_names(tools)
    ctx_norm = [_norm(m) for m in context]

    def fit(traj: Trajectory) -> tuple[int, int, int]:
        opening_t, later_t = split_user_turns(traj.messages)
        users = [[message_text(m) for m in turn if m.role == "user"]
                 for turn in [opening_t] + later_t]
        agree = int(users[:len(ctx_users)] == ctx_users)
        seen = list(traj.tools) + [x for m in traj.messages[:len(context)] for x in _extra_tools(m)]
        lead = 0
        for a, b in zip(ctx_norm, traj.messages):
            if a != _norm(b):
                break
            lead += 1
        return agree, int(_tool_names(seen) == names), lead

    best = max(candidates, key=fit)
    turn = len(later_ctx)  # user turns delivered so far, minus the opening
    last_user = max((i for i, m in enumerate(context) if m.role == "user"), default=0)
    steps = sum(m.role == "assistant" for m in context[last_user:])
    recorded = _assistant_turns(best.messages)
    mine = recorded[turn] if turn < len(recorded) else []
    if steps < len(mine):
        m = mine[steps]
        return Message(role="assistant", content=m.content, tool_calls=m.tool_calls)
    if mine and not mine[-1].tool_calls:
        return Message(role="assistant", content=mine[-1].content)
    return Message(role="assistant", content="I have nothing more to do here.")


def _assistant_turns(messages: Sequence[Message]) -> list[list[Message]]:
    """Assistant messages per user turn (the opening is turn 0)."""
    turns: list[list[Message]] = [[]]
    prev = None
    for m in messages:
        if m.role == "assistant":
            turns[-1].append(m)
        elif m.role in ("user", "system") and prev in ("assistant", "tool"):
            turns.append([])
        prev = m.role
    return turns


class RandomPolicy:
    """A random tool with random arguments (strings drawn partly from words seen so far), or a
    short message now and then: the near-zero floor of every metric."""

    COMMANDS = ["ls", "pwd", "cat *", "wc -l *", "echo hi > out.txt", "rm -f *.log", "head -2 *"]

    def __init__(self, seed: int = 0, p_message: float = 0.15):
        self.rng, self.p_message = random.Random(seed), p_message

    def act(self, context: list[Message], tools: list[dict[str, Any]]) -> str:
        import json
        import re

        if not tools or self.rng.random() < self.p_message:
            return self.rng.choice(["Done.", "OK.", "Sorry, I cannot do that."])
        fn = self.rng.choice(tools)["function"]
        words = re.findall(r"[\w@.]+", " ".join(message_text(m) for m in context)) or ["x"]
        args = {}
        for key, prop in fn.get("parameters", {}).get("properties", {}).items():
            if key == "command":
                args[key] = self.rng.choice(self.COMMANDS)
            elif "enum" in prop:
                args[key] = self.rng.choice(prop["enum"])
            elif prop.get("type") == "integer":
                args[key] = self.rng.randrange(1, 5)
            else:
                args[key] = self.rng.choice(words)
        return "<tool_call>\n" + json.dumps({"name": fn["name"], "arguments": args}) + "\n</tool_call>"


class ModelPolicy:
    """Any Hugging Face causal LM + tokenizer: prompts built with `chat.prompt_text` (the model's
    own chat template, tools included), generated by `pivotrl.sampling.generate` (left padding, one
    prefill for identical prompts, a stop at the model's end tokens), batched over episodes.
    temperature 0 is greedy; otherwise the i-th context of the c-th call is sampled with seed
    derive_seed(seed, c, i), so a run is reproducible whatever the batching. A prompt longer than
    the model's window (prompt + `max_new_tokens` > `max_position_embeddings`; BFCL's tool docs
    alone exceed a tiny model's) yields an empty completion: the runner counts it as an invalid
    action, and `overlong_prompts` counts it here, rather than a silently truncated context or a
    crash. A context the chat template cannot render is treated the same way (`prompt_errors`)."""

    def __init__(self, model: Any, tokenizer: Any, max_new_tokens: int = 96,
                 temperature: float = 0.0, seed: int = 0, batch_size: int = 32):
        self.model, self.tokenizer = model, tokenizer
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        self.seed, self.batch_size, self.calls = seed, batch_size, 0
        self.generated_tokens = 0
        self.overlong_prompts = 0
        self.prompt_errors = 0

    def act(self, context: list[Message], tools: list[dict[str, Any]]) -> str:
        return self.act_batch([context], [tools])[0]

    def act_batch(self, contexts: list[list[Message]], tools: list[list[dict[str, Any]]]) -> list[str]:
        from pivotrl.formats.chat import prompt_text
        from pivotrl.sampling.generate import generate_each, stop_ids
        from pivotrl.io.seeds import derive_seed

        tok = self.tokenizer
        ids: list[list[int] | None] = []
        for c, t in zip(contexts, tools):
            try:
                ids.append(tok(prompt_text(tok, c, t), add_special_tokens=False)["input_ids"])
            except Exception:  # noqa: BLE001 - a template error on odd content is an invalid turn
                self.prompt_errors += 1
                ids.append(None)
        todo = [i for i, x in enumerate(ids) if x]
        window = getattr(self.model.config, "max_position_embeddings", None)
        gens = generate_each(self.model, [ids[i] for i in todo],
                             [derive_seed(self.seed, self.calls, i) for i in todo],
                             max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                             stop_token_ids=stop_ids(tok, self.model), batch_size=self.batch_size,
                             window=window)
        self.calls += 1
        out = [""] * len(ids)
        for i, g in zip(todo, gens):
            if g.finish_reason == "overlong":
                self.overlong_prompts += 1
                continue
            body = g.tokens[:-1] if g.finish_reason == "stop" else g.tokens
            self.generated_tokens += len(body)
            out[i] = completion_text(tok, body)
        return out


# ---------------------------------------------------------------- episodes


@dataclass
class EpisodeResult:
    trajectory: Trajectory
    success: bool
    model_turns: int  # completions the policy generated (the "rollout turns" unit)
    invalid_actions: int
    final_message: str | None = None
    turn_correct: list[bool] | None = None  # filled by callers that score turns


@dataclass
class _Episode:
    task: Trajectory
    world: Any
    messages: list[Message]
    tools: list[dict[str, Any]] = field(default_factory=list)
    pending: list[list[Message]] = field(default_factory=list)  # user turns not yet delivered
    user_turns: int = 1
    turns: int = 0
    turn_steps: int = 0  # tool-executing steps in the current user turn
    invalid: int = 0
    calls: int = 0
    final: str | None = None
    done: bool = False
    notes: list[str] = field(default_factory=list)


def _user_text(messages: Sequence[Message]) -> str:
    return next((message_text(m) for m in messages if m.role == "user"), "")


def opening(messages: Sequence[Message]) -> list[Message]:
    """The messages an episode starts from: everything before the first assistant message, so a
    whole expert trajectory can be passed as a task (its own actions are not replayed)."""
    first = next((i for i, m in enumerate(messages) if m.role == "assistant"), len(messages))
    return list(messages[:first])


def split_user_turns(messages: Sequence[Message]) -> tuple[list[Message], list[list[Message]]]:
    """(opening, later user turns): each later user turn is a run of user (or system) messages
    that follows an assistant or tool message; the expert's own messages are dropped."""
    head = opening(messages)
    later: list[list[Message]] = []
    prev = "assistant" if len(head) < len(messages) else None
    for m in messages[len(head):]:
        if m.role in ("user", "system"):
            if prev in ("assistant", "tool"):
                later.append([])
            later[-1].append(m)
        prev = m.role
    return head, later


def _extra_tools(message: Message) -> list[dict[str, Any]]:
    """Tools a message adds from its turn on (an extra `tools` field; BFCL miss_func)."""
    extra = (message.model_extra or {}).get("tools")
    return [t for t in extra if isinstance(t, dict)] if isinstance(extra, list) else []


def _add_tools(tools: list[dict[str, Any]], messages: Sequence[Message]) -> list[dict[str, Any]]:
    names = _tool_names(tools)
    out = list(tools)
    for m in messages:
        for t in _extra_tools(m):
            name = t.get("function", t).get("name")
            if name not in names:
                names.add(name)
                out.append(t)
    return out


def run_episodes(world_name: str, tasks: Sequence[Trajectory], policy: Any,
                 max_turns: int = MAX_TURNS,
                 max_steps_per_turn: int | None = None) -> list[EpisodeResult]:
    """Play every task to the end with `policy`, all episodes in lockstep (one batch per turn).

    `tasks` are task records (system + user messages, `metadata["world_config"]` and `["goal"]`)
    or whole trajectories of tasks: their opening starts the episode and their later user
    messages are delivered as later user turns (their assistant and tool messages are not
    replayed). `max_turns` caps model turns per episode (0 = no cap); `max_steps_per_turn`
    force-quits an episode whose user turn executes more tool steps than that (BFCL's rule)."""
    # Each episode owns its world, so worlds that wait on programs are reset and stepped from
    # threads (the waits overlap); the others step in this thread.
    pool = ThreadPoolExecutor(EPISODE_THREADS) if concurrent_world(world_name) else None
    each = pool.map if pool else map
    try:
        episodes = list(each(lambda task: _start(world_name, task), tasks))
        while True:
            active = [e for e in episodes if not e.done]
            if not active:
                break
            texts = act_batch(policy, [e.messages for e in active], [e.tools for e in active])
            list(each(lambda ep, text: _step(ep, text, max_turns, max_steps_per_turn),
                      active, texts))
    finally:
        if pool:
            pool.shutdown()
    results = []
    for ep in episodes:
        try:
            ok = bool(ep.world.success(ep.task.metadata.get("goal", {}), ep.final))
        except BROKEN_ENVIRONMENT:
            raise
        except Exception as exc:  # noqa: BLE001 - a goal check must not take the run down
            ok, ep.notes = False, ep.notes + [f"success check failed: {exc}"]
        if ep.pending:
            ok = False
            ep.notes.append(f"{len(ep.pending)} user turn(s) never delivered")
        if hasattr(ep.world, "close"):
            ep.world.close()
        meta = {**ep.task.metadata, "success": ok, "model_turns": ep.turns,
                "invalid_actions": ep.invalid}
        if ep.user_turns > 1 or ep.pending or hasattr(ep.world, "begin_turn"):
            meta["user_turns"] = ep.user_turns  # (single-turn testbed records stay as they were)
        if ep.notes:
            meta["notes"] = ep.notes
        traj = Trajectory(id=f"{ep.task.id}.episode", messages=ep.messages, tools=ep.task.tools,
                          domain=ep.task.domain or world_name, metadata=meta)
        results.append(EpisodeResult(traj, ok, ep.turns, ep.invalid, ep.final))
    return results


def _start(world_name: str, task: Trajectory) -> _Episode:
    world = make_world(world_name)
    world.reset(task.metadata.get("world_config", {}))
    head, later = split_user_turns(task.messages)
    if hasattr(world, "begin_turn"):
        world.begin_turn()
    return _Episode(task, world, head, _add_tools(list(task.tools), head), later)


def _end_user_turn(ep: _Episode, max_turns: int) -> None:
    """The agent handed the turn back: deliver the next user turn, or end the episode."""
    if not ep.pending:
        ep.done = True
        return
    if max_turns and ep.turns >= max_turns:
        ep.done = True
        ep.notes.append(f"turn limit {max_turns} reached")
        return
    turn = ep.pending.pop(0)
    if hasattr(ep.world, "begin_turn"):
        ep.world.begin_turn()
    ep.messages.extend(turn)
    ep.tools = _add_tools(ep.tools, turn)
    ep.user_turns += 1
    ep.turn_steps = 0
    ep.final = None


def _step(ep: _Episode, text: str, max_turns: int, max_steps_per_turn: int | None = None) -> None:
    ep.turns += 1
    text = text if isinstance(text, str) else ""
    parsed = parse_completion(text)
    if not parsed.valid:
        ep.invalid += 1
        ep.notes.append(f"turn {ep.turns}: invalid action: {parsed.reason}")
        ep.messages.append(Message(role="assistant", content=text if text.strip() else "(empty)"))
        _end_user_turn(ep, max_turns)
        return
    msg = parsed.message
    calls = []
    for call in msg.tool_calls or []:
        calls.append(call.model_copy(update={"id": f"call_{ep.calls}"}))
        ep.calls += 1
    msg = Message(role="assistant", content=msg.content, tool_calls=calls or None)
    ep.messages.append(msg)
    if not calls:
        ep.final = message_text(msg)
        _end_user_turn(ep, max_turns)
        return
    for call in calls:
        try:
            obs = ep.world.execute(call.function.name, call.args())
        except BROKEN_ENVIRONMENT:  # a removed workspace is the run's error, not an observation
            raise
        except Exception as exc:  # noqa: BLE001 - worlds should not raise; if one does, it is data
            obs = f"error: {type(exc).__name__}: {exc}"
        ep.messages.append(Message(role="tool", tool_call_id=call.id, content=str(obs)))
    ep.turn_steps += 1
    if max_steps_per_turn is not None and ep.turn_steps > max_steps_per_turn:
        ep.done = True
        ep.notes.append(f"forced to quit after {max_steps_per_turn} steps in one user turn")
    elif max_turns and ep.turns >= max_turns:
        ep.done = True
        ep.notes.append(f"turn limit {max_turns} reached")


def success_rate(results: Sequence[EpisodeResult]) -> float:
    return sum(r.success for r in results) / len(results) if results else 0.0


# ---------------------------------------------------------------- turn accuracy


@dataclass
class TurnAccuracy:
    accuracy: float  # mean verifier reward over turns (binary verifiers: fraction correct)
    n: int
    invalid: int  # completions that could not be parsed (scored 0)
    rewards: list[float]
    completions: list[str]
    reasons: list[str] = field(default_factory=list)  # the verifier's, one per completion


def turn_accuracy(policy: Any, turns: Sequence[Turn], verifier: Any,
                  parse: Parser = parse_completion) -> TurnAccuracy:
    """Per-turn rewards of `policy` on expert states: for each Turn (context from an expert
    trajectory), one action from the policy, read by `parse` (the model's own format:
    `FormatOptions().parser(tokenizer)`) and scored against the expert's by `verifier` through
    the one scoring path (`pivotrl.scoring`): invalid actions score 0 and are counted. The
    measure over them is the library's (`pivotrl.evaluate.turns.turn_accuracy`)."""
    texts = act_batch(policy, [t.context for t in turns], [t.tools for t in turns])
    scores = score_completions(verifier, turns, texts, parse)
    rewards = [s.reward if s.valid else 0.0 for s in scores]
    invalid = sum(not s.valid for s in scores)
    acc = sum(rewards) / len(rewards) if rewards else 0.0
    return TurnAccuracy(acc, len(rewards), invalid, rewards, texts, [s.reason for s in scores])


def expert_turns(trajectories: Sequence[Trajectory]) -> list[Turn]:
    """Every assistant turn of the trajectories as a Turn, exactly as `pivotrl extract` makes them."""
    from pivotrl.extract import ExtractOptions, extract_turns

    opts = ExtractOptions()
    return [t for traj in trajectories for t in extract_turns(traj, opts)[0]]
