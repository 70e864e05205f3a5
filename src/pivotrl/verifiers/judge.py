"""`judge`: an LLM decides whether the candidate does what the expert's action does.

Any OpenAI-compatible chat endpoint works (vLLM, SGLang, llama.cpp server, OpenAI): POST
`{base_url}/chat/completions` with `model`, temperature 0. The prompt shows the end of the
conversation and the two actions labelled A and B and asks for one line, `VERDICT: YES` or
`VERDICT: NO`.

- Position bias: with `swap_check` (default) the question is asked in both orders (expert as A,
  then candidate as A); the reward is 1 only when both answers are YES.
- Replies have one strict format: after any `<think>…</think>` block, the last non-empty line
  is `VERDICT: YES` or `VERDICT: NO` (case and surrounding spaces aside), and no other line
  gives a verdict. Anything else ("They are NOT functionally equivalent.", "Equivalent? No.",
  "YES", two verdicts, an unfinished `<think>`) is an *invalid* reply: reward 0, counted as
  invalid, never read as YES.
- Call vs message is decided before asking: a call answering a message (or the reverse) is 0.
- The judge sees both actions whole, never cut: an action cut to a prefix can say the opposite
  after the cut (repeat the expert's answer, pad, then reverse it). An action longer than
  `max_action_chars` is not judged: the candidate's scores an invalid 0, and so does every
  candidate of a turn whose expert action is that long. Only context messages are cut.
- Answers are cached by a hash of (model, prompt): in memory, and in `cache_path` (JSONL, one
  `{"key", "answer"}` per line, appended) when set, so re-scoring costs nothing.
- A down endpoint raises `JudgeUnavailable` naming the URL; it never turns into reward 0.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Sequence
from pathlib import Path

import httpx
from pydantic import BaseModel, ConfigDict, Field

from pivotrl.io.records import Message, Turn, message_text

from pivotrl.verifiers.base import Score, score_in_threads

SYSTEM_PROMPT = (
    "You judge whether two actions of an AI assistant are functionally equivalent: whether, in "
    "the given conversation, they have the same effect (same tool calls with equivalent "
    "arguments, or messages that convey the same information and decision). Wording, order of "
    "independent items and formatting do not matter; any difference in what is done, to what, or "
    "what is claimed does. Reply with exactly one line: VERDICT: YES if they are equivalent, "
    "VERDICT: NO if they are not.")


class JudgeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    base_url: str = Field(
        "http://127.0.0.1:8000/v1", description="OpenAI-compatible API root (vLLM's default).")
    model: str = Field("default", description="Model name sent in each request.")
    api_key_env: str = Field(
        "OPENAI_API_KEY", description="Environment variable holding the API key (optional).")
    timeout_s: float = Field(60.0, description="Per-request timeout in seconds.")
    retries: int = Field(2, description="Retries on 5xx replies and transient network errors.")
    swap_check: bool = Field(
        True, description="Ask in both orders; reward 1 only if both say equivalent.")
    context_messages: int = Field(
        6, description="How many context messages (the last ones) the prompt shows.")
    max_chars: int = Field(
        4000, description="Each shown *context* message is cut to this many characters (the two "
                          "actions are never cut).")
    max_action_chars: int = Field(
        16000, description="An action (text + calls as JSON) longer than this is not judged: "
                           "invalid 0 (the judge must see both actions whole).")
    max_tokens: int = Field(
        16, description="Tokens the judge may answer with (raise for thinking models).")
    cache_path: str | None = Field(
        None, description="JSONL file caching answers across runs (None: memory only).")
    workers: int = Field(8, description="Concurrent requests in score_batch.")


class JudgeUnavailable(RuntimeError):
    """The judge endpoint cannot be reached or refuses the request."""


_THINK = re.compile(r"<think>.*?</think>", re.S | re.I)
_VERDICT_LINE = re.compile(r"VERDICT:[ \t]*(YES|NO)", re.I)
_VERDICT_WORD = re.compile(r"\bVERDICT\b", re.I)


def parse_verdict(reply: str) -> bool | None:
    """True (VERDICT: YES), False (VERDICT: NO), or None for any other reply (invalid).

    Only the strict format counts: prose is never read for a yes, because the words a judge
    uses around a verdict ("not", "no", "equivalent?") are exactly what a loose parser gets
    wrong."""
    text = _THINK.sub(" ", reply or "")
    if "<think>" in text.lower():  # unterminated thinking: no answer was given
        return None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    m = _VERDICT_LINE.fullmatch(lines[-1])
    if m is None or any(_VERDICT_WORD.search(line) for line in lines[:-1]):
        return None  # no final verdict line, or another verdict given before it
    return m.group(1).lower() == "yes"


def render(message: Message, limit: int | None = None) -> str:
    """A message as the judge reads it: its text, then its calls as JSON lines."""
    parts = []
    text = message_text(message).strip()
    if text:
        parts.append(text)
    for c in message.tool_calls or []:
        try:
            args = c.args()
        except (ValueError, TypeError):
            args = c.function.arguments
        parts.append("CALL " + json.dumps({"name": c.function.name, "arguments": args},
                                          sort_keys=True, ensure_ascii=False, default=str))
    out = "\n".join(parts) or "(empty)"
    return out if limit is None or len(out) <= limit else out[:limit] + " …[cut]"


def build_prompt(turn: Turn, first: Message, second: Message, cfg: JudgeConfig) -> list[dict]:
    shown = turn.context[-cfg.context_messages:] if cfg.context_messages > 0 else []
    convo = "\n\n".join(f"[{m.role}] {render(m, cfg.max_chars)}" for m in shown)
    user = (f"Conversation so far:\n{convo or '(none)'}\n\n"
            f"Action A:\n{render(first)}\n\n"
            f"Action B:\n{render(second)}\n\n"
            "Are actions A and B functionally equivalent here? Reply with exactly one line: "
            "VERDICT: YES or VERDICT: NO.")
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


class JudgeVerifier:
    name = "judge"

    def __init__(self, **config):
        self.config = JudgeConfig(**config)
        self._url = self.config.base_url.rstrip("/") + "/chat/completions"
        key = os.environ.get(self.config.api_key_env, "")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(timeout=self.config.timeout_s, headers=headers)
        self._cache: dict[str, str] = {}
        self._lock = threading.Lock()
        if self.config.cache_path and Path(self.config.cache_path).exists():
            self._load_cache(Path(self.config.cache_path))

    def score(self, turn: Turn, action: Message | None) -> Score:
        if action is None:
            return Score(0.0, False, "unparseable action")
        exp = turn.expected
        if bool(exp.tool_calls) != bool(action.tool_calls):
            what = "a tool call" if action.tool_calls else "a message"
            return Score(0.0, True, f"{what} where the expert did the other")
        if not message_text(action).strip() and not action.tool_calls:
            return Score(0.0, True, "empty message")
        limit = self.config.max_action_chars
        for who, msg in (("candidate", action), ("expert", exp)):
            size = len(render(msg))
            if size > limit:
                return Score(0.0, False, f"{who} action too long for the judge to see whole "
                                         f"({size} > {limit} characters)")
        first = self._ask(build_prompt(turn, exp, action, self.config))
        v1 = parse_verdict(first)
        if v1 is None:
            return Score(0.0, False, f"invalid judge reply: {first[:80]!r}")
        if v1 is False:
            return Score(0.0, True, "judge: not equivalent")
        if not self.config.swap_check:
            return Score(1.0, True, "")
        second = self._ask(build_prompt(turn, action, exp, self.config))
        v2 = parse_verdict(second)
        if v2 is None:
            return Score(0.0, False, f"invalid judge reply: {second[:80]!r}")
        if v2 is False:
            return Score(0.0, True, "judge: not equivalent with the order swapped (position bias)")
        return Score(1.0, True, "")

    def score_batch(self, turns: Sequence[Turn], actions: Sequence[Message | None]) -> list[Score]:
        return score_in_threads(self, turns, actions, self.config.workers)

    # ------------------------------------------------------------ the endpoint

    def _ask(self, messages: list[dict]) -> str:
        key = hashlib.sha256(json.dumps([self.config.model, messages], sort_keys=True)
                             .encode()).hexdigest()
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        answer = self._request(messages)
        with self._lock:
            self._cache[key] = answer
            if self.config.cache_path:
                path = Path(self.config.cache_path)
                path.parent.mkdir(parents=True, exist_ok=True)
                with path.open("a", encoding="utf-8") as fh:
                    fh.write(json.dumps({"key": key, "answer": answer}) + "\n")
        return answer

    def _request(self, messages: list[dict]) -> str:
        body = {"model": self.config.model, "messages": messages, "temperature": 0.0,
                "max_tokens": self.config.max_tokens}
        last = ""
        for _ in range(self.config.retries + 1):
            try:
                resp = self._client.post(self._url, json=body)
            except httpx.TransportError as exc:  # refused, DNS, timeout, reset
                last = f"{type(exc).__name__}: {exc}"
                continue
            if resp.status_code >= 500:
                last = f"HTTP {resp.status_code}: {resp.text[:200]}"
                continue
            if resp.status_code != 200:
                raise JudgeUnavailable(f"judge endpoint {self._url} answered HTTP "
                                       f"{resp.status_code}: {resp.text[:300]}")
            try:
                msg = resp.json()["choices"][0]["message"]
                return msg.get("content") or ""  # reasoning alone is not an answer
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                raise JudgeUnavailable(f"judge endpoint {self._url} sent a reply that is not a "
                                       f"chat completion ({exc}): {resp.text[:200]}") from exc
        raise JudgeUnavailable(f"judge endpoint {self._url} is unreachable ({last}); start an "
                               f"OpenAI-compatible server there (e.g. `vllm serve MODEL`) or set "
                               f"base_url in the judge config")

    def _load_cache(self, path: Path) -> None:
        with path.open(encoding="utf-8", errors="replace") as fh:
            for line in fh:
                try:
                    rec = json.loads(line)
                    self._cache[str(rec["key"])] = str(rec["answer"])
                except (ValueError, KeyError, TypeError):
                    continue  # a torn last line from a killed run

    def close(self) -> None:
        self._client.close()
