"""What `pivotrl serve` reads off the generate loop while it runs (each choice's text, as deltas,
and its tokens' logprobs) and the shapes of its answers (choices, stream chunks, usage).

`Observer` is `generation.generate`'s `on_step`: at every decoding step it hands each choice's new
token to that choice's `ChoiceStream` (on the generating thread), and, when streaming, passes what
became sendable to `emit`. The streamed deltas concatenate to the text a non-streamed request
returns for the same seed because the final text is never rebuilt from them: when generation ends,
serve sends `final[len(sent):]`, where `final` is the non-streamed answer's own text. During
generation a delta is sent only when it cannot be taken back:

- Decoding is incremental (the new token decoded with the one before it as context, so a
  SentencePiece word's leading space comes out), and text ending in an incomplete UTF-8 character
  (U+FFFD) waits for the next token.
- Stop strings. Text that could be the start of a stop string is held back; once a stop string
  appears, the choice sends nothing more (the final text is cut there).
- Tool calls (chat with tools). Text from a call opener of the model's format (`<tool_call>`, ...)
  on is held back: the call goes out as `delta.tool_calls` when generation ends and the message
  parses into calls, or as content when it does not.

Logprobs are those of the model's raw distribution at each step (log-softmax of the logits the
token was drawn from, before temperature and top-p), which is what vLLM reports by default
(`logprobs_mode="raw_logprobs"`). The end token is not reported (it is not part of the text),
nor are tokens after a stop string or a pad token.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from typing import Any

import torch

# (token id, its logprob, [(id, logprob)] of the top-k, best first)
Entry = tuple[int, float, list[tuple[int, float]]]
MIN_LOGPROB = -9999.0  # JSON has no -inf; vLLM clamps the same way
log = logging.getLogger(__name__)


def apply_stop(text: str, stop: str | list[str] | None) -> tuple[str, bool]:
    """`text` cut before the first occurrence of any stop string, and whether one occurred."""
    stops = [stop] if isinstance(stop, str) else (stop or [])
    cut = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def _partial_tail(text: str, markers: list[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some marker."""
    best = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:k]):
                best = k
                break
    return best


class ChoiceStream:
    """One choice's text and logprob entries as its tokens arrive (see the module docstring)."""

    def __init__(self, decode: Callable[[list[int]], str], ends: set[int], stops: list[str],
                 openers: tuple[str, ...] = ()):
        self.decode, self.ends, self.stops, self.openers = decode, ends, stops, openers
        self.tokens: list[int] = []
        self.text = ""  # decoded so far
        self.sent = 0  # characters of `text` handed out
        self.closed = False  # end token, pad or stop string: no more text
        self.entries: list[Entry] = []
        self.offsets: list[int] = []  # each entry's token's offset in the text
        self.taken = 0  # entries handed out
        self._prefix = self._read = 0  # incremental decoding window (tokens)

    def push(self, token: int, entry: Entry | None = None) -> None:
        if self.closed:
            return
        if token in self.ends:
            self.closed = True
            return
        self.tokens.append(token)
        if entry is not None:
            self.entries.append(entry)
            self.offsets.append(len(self.text))
        prefix = self.decode(self.tokens[self._prefix:self._read])
        full = self.decode(self.tokens[self._prefix:])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.text += full[len(prefix):]
            self._prefix, self._read = self._read, len(self.tokens)
            # the final text is cut at the stop string: what follows is not part of the answer
            self.closed = bool(self.stops) and apply_stop(self.text, self.stops)[1]

    def sendable(self) -> int:
        """How much of `text` can go out now: not past a stop string or a call opener, nor into
        a tail that may be the start of one (a longer stop string starting earlier than the one
        found may still complete, so the tail is held back even then)."""
        limit = len(apply_stop(self.text, self.stops)[0])
        for opener in self.openers:
            at = self.text.find(opener)
            if at >= 0:
                limit = min(limit, at)
        held = _partial_tail(self.text, self.stops + list(self.openers))
        return max(self.sent, min(limit, len(self.text) - held))

    def take(self) -> tuple[str, int, int]:
        """The text not handed out yet and the range of entries not handed out yet (advancing
        past both)."""
        end = self.sendable()
        delta, self.sent = self.text[self.sent:end], end
        first, self.taken = self.taken, len(self.entries)
        return delta, first, self.taken

    def remainder(self, final: str) -> str:
        """What completes the sent text into `final` (the non-streamed answer's text)."""
        sent = self.text[:self.sent]
        if not final.startswith(sent):  # a tokenizer whose pieces do not decode to prefixes
            log.warning("streamed text %r is not a prefix of the final text %r", sent, final)
        return final[len(sent):]


def step_entries(logits: torch.Tensor, tokens: torch.Tensor, k: int) -> list[Entry]:
    """Per row: the drawn token's logprob under log_softmax(logits), and the top-k."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(-1, tokens[:, None].to(logprobs.device)).squeeze(-1).tolist()
    ids: list[list[int]] = []
    values: list[list[float]] = []
    if k:
        top = logprobs.topk(k, dim=-1)  # sorted, best first
        ids, values = top.indices.tolist(), top.values.tolist()
    return [(int(t), max(chosen[r], MIN_LOGPROB),
             [(i, max(v, MIN_LOGPROB)) for i, v in zip(ids[r], values[r])] if k else [])
            for r, t in enumerate(tokens.tolist())]


class Observer:
    """`on_step` for one request: choice i·n + j follows sample j of prompt i."""

    def __init__(self, tokenizer: Any, n: int, n_prompts: int, ends: list[int],
                 stop: str | list[str] | None, openers: tuple[str, ...], top_k: int | None,
                 emit: Callable[[list[tuple[int, str, int, int]]], None] | None = None):
        pad = getattr(tokenizer, "pad_token_id", None)
        # completion_text drops what follows a pad token that is not the end token
        ends_ = set(ends) | ({pad} if pad is not None and pad != tokenizer.eos_token_id else set())
        self.decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)
        self.n, self.top_k, self.emit = n, top_k, emit
        stops = [s for s in ([stop] if isinstance(stop, str) else (stop or [])) if s]
        self.choices = [ChoiceStream(self.decode, ends_, stops, openers)
                        for _ in range(n * n_prompts)]
        self._names: dict[int, str] = {}

    def __call__(self, step: Any) -> None:
        entries = None if self.top_k is None else step_entries(step.logits, step.tokens, self.top_k)
        touched = []
        for r, (tok, active) in enumerate(zip(step.tokens.tolist(), step.active.tolist())):
            i, j = step.rows[r]
            choice = self.choices[i * self.n + j]
            if active and not choice.closed:
                choice.push(tok, None if entries is None else entries[r])
                touched.append(i * self.n + j)
        if self.emit is not None:
            out = [(idx, *self.choices[idx].take()) for idx in touched]
            out = [o for o in out if o[1] or o[3] > o[2]]
            if out:
                self.emit(out)

    def token(self, token_id: int, as_ids: bool) -> str:
        if as_ids:
            return f"token_id:{token_id}"
        if token_id not in self._names:
            self._names[token_id] = self.decode([token_id])
        return self._names[token_id]


def completion_logprobs(obs: Observer, choice: ChoiceStream, first: int = 0,
                        end: int | None = None, as_ids: bool = False) -> dict[str, Any]:
    """The completions API's block for `choice`'s entries [first, end): tokens, token_logprobs,
    top_logprobs (one dict per token: the top-k and the drawn token, as vLLM answers),
    text_offset (from the completion's start)."""
    entries, offsets = choice.entries[first:end], choice.offsets[first:end]
    tops = []
    for tok, lp, top in entries:
        best = {obs.token(i, as_ids): v for i, v in top}
        best.setdefault(obs.token(tok, as_ids), lp)
        tops.append(best)
    return {"tokens": [obs.token(e[0], as_ids) for e in entries],
            "token_logprobs": [e[1] for e in entries], "top_logprobs": tops,
            "text_offset": list(offsets)}


def chat_logprobs(obs: Observer, choice: ChoiceStream, first: int = 0, end: int | None = None,
                  as_ids: bool = False) -> dict[str, Any]:
    """The chat API's block for `choice`'s entries [first, end): content = [{token, logprob, bytes,
    top_logprobs}] (top-k, best first)."""
    entries = choice.entries[first:end]

    def item(tok: int, lp: float) -> dict[str, Any]:
        name = obs.token(tok, as_ids)
        return {"token": name, "logprob": lp, "bytes": list(name.encode("utf-8"))}

    return {"content": [{**item(tok, lp), "top_logprobs": [item(i, v) for i, v in top]}
                        for tok, lp, top in entries]}


def usage(results) -> dict[str, int]:
    prompt = sum(r[0].prompt_tokens for r in results if r)
    completion = sum(c.completion_tokens for r in results for c in r)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion_choices(results, req: Any, obs: Observer | None = None) -> list[dict[str, Any]]:
    """The completions API's choices (choice i·n + j: sample j of prompt i); logprobs from `obs`."""
    choices = []
    for i, comps in enumerate(results):
        for j, c in enumerate(comps):
            text, stopped = apply_stop(c.text, req.stop)
            index = i * req.n + j
            logprobs = None if obs is None or req.top_k() is None else completion_logprobs(
                obs, obs.choices[index], as_ids=req.return_tokens_as_token_ids)
            choices.append({"index": index, "text": text, "logprobs": logprobs,
                            "finish_reason": "stop" if stopped else c.finish_reason})
    return choices


def chat_choices(results, req: Any, parse, obs: Observer | None = None) -> list[dict[str, Any]]:
    """The chat API's choices: the text as content, or its tool calls when it parses into some."""
    choices = []
    for j, c in enumerate(results[0]):
        text, stopped = apply_stop(c.text, req.stop)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        reason = "stop" if stopped else c.finish_reason
        parsed = parse(text, req.tools) if req.tool_choice != "none" else None
        if parsed is not None and parsed.valid and parsed.message.tool_calls:
            message = {"role": "assistant", "content": parsed.message.content,
                       "tool_calls": [{"id": tc.id or f"call_{uuid.uuid4().hex[:24]}",
                                       "type": "function",
                                       "function": {"name": tc.function.name,
                                                    "arguments": _args(tc.function.arguments)}}
                                      for tc in parsed.message.tool_calls]}
            reason = "tool_calls"
        logprobs = None if obs is None or req.top_k() is None else chat_logprobs(
            obs, obs.choices[j], as_ids=req.return_tokens_as_token_ids)
        choices.append({"index": j, "message": message, "finish_reason": reason,
                        "logprobs": logprobs})
    return choices


def _args(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


class CompletionChunks:
    """The completions API's stream: text deltas, then each choice's rest with its finish_reason."""

    object = "text_completion"

    def __init__(self, req: Any, obs: Observer):
        self.req, self.obs = req, obs

    def start(self) -> list[dict[str, Any]]:
        return []

    def delta(self, index: int, text: str, first: int, end: int,
              reason: str | None = None) -> dict[str, Any]:
        logprobs = None if self.req.top_k() is None or end <= first else completion_logprobs(
            self.obs, self.obs.choices[index], first, end, self.req.return_tokens_as_token_ids)
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}

    def last(self, results) -> list[dict[str, Any]]:
        return [self.delta(c["index"], self.obs.choices[c["index"]].remainder(c["text"]), 0, 0,
                           c["finish_reason"]) for c in completion_choices(results, self.req)]


class ChatChunks:
    """The chat API's stream: a role delta per choice, content deltas, then each choice's rest:
    its calls as `delta.tool_calls` (complete, one entry per call, as the openai client
    accumulates them), or the rest of its content; finish_reason in the last chunk."""

    object = "chat.completion.chunk"

    def __init__(self, req: Any, obs: Observer, parse):
        self.req, self.obs, self.parse = req, obs, parse

    def start(self) -> list[dict[str, Any]]:
        return [self.delta(j, {"role": "assistant", "content": ""}) for j in range(self.req.n)]

    def delta(self, index: int, delta: dict[str, Any] | str, first: int = 0, end: int = 0,
              reason: str | None = None) -> dict[str, Any]:
        logprobs = None if self.req.top_k() is None or end <= first else chat_logprobs(
            self.obs, self.obs.choices[index], first, end, self.req.return_tokens_as_token_ids)
        delta = {"content": delta} if isinstance(delta, str) else delta
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}

    def last(self, results) -> list[dict[str, Any]]:
        out = []
        for c in chat_choices(results, self.req, self.parse):
            i, message, reason = c["index"], c["message"], c["finish_reason"]
            if message.get("tool_calls"):
                calls = [{"index": k, **call} for k, call in enumerate(message["tool_calls"])]
                out += [self.delta(i, {"tool_calls": calls}), self.delta(i, {}, reason=reason)]
            else:
                rest = self.obs.choices[i].remainder(message["content"] or "")
                out.append(self.delta(i, {"content": rest}, reason=reason))
        return out
