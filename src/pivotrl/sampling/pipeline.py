"""Keeping an engine busy and whole: prompts it cannot take are set aside before sampling, and the
next chunk is sampled while the caller scores the current one.

`prefetch(fn, items)` yields fn(item) in order, computing fn(next item) in a worker thread while
the caller works on the current result. Profiling uses it so the GPU (or the server) samples chunk
i+1 while the CPU parses and verifies chunk i; results and their order are exactly those of the
plain loop (each chunk's seeds depend on its turns only), and an error in the worker is raised in
the caller at that chunk.

`split_too_long(prompts, tokenizer, limit)` tells which prompts exceed the engine's context
(`sampler.max_prompt_tokens()`), so one over-long prompt costs a report instead of the whole
chunk: vLLM fails a `generate` call outright on such a prompt, and a resume would hit it again.
`context_length(config, tokenizer)` is the one rule for a model's context when no engine states
it (the hf sampler, GRPO's default `max_prompt_length`), and `check_budget` the one rule for a
token budget against it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from pivotrl.formats.length_bound import length_bound

T = TypeVar("T")
R = TypeVar("R")
_END = object()


def prompt_limit(sampler: Any) -> int | None:
    """The longest prompt (tokens) `sampler` accepts, when it knows one."""
    limit = getattr(sampler, "max_prompt_tokens", None)
    value = limit() if callable(limit) else None
    return value if isinstance(value, int) and value > 0 else None


def longer_context_fix(sampler: Any) -> str:
    """What lets `sampler` take longer prompts, for the backend in use: the fix a message about
    prompts set aside as too long names. Only vLLM's context is a pivotrl flag; the hf backend
    takes the model's own context, and a server's is set where the server starts."""
    name = getattr(sampler, "name", "")
    if name == "vllm":
        return ("raise --max-model-len (the vllm backend's context; at most the model's own, "
                "max_position_embeddings in its config.json)")
    if name == "openai":
        return ("start the server with a longer context (its max_model_len, e.g. `vllm serve "
                "--max-model-len`); the openai backend takes the server's")
    return ("the hf backend takes the model's own context (max_position_embeddings in its "
            "config.json), which no flag raises (--max-model-len is the vllm backend's): use a "
            "model whose context holds these prompts, or turns with shorter contexts")


# transformers writes a huge sentinel (int(1e30)) as model_max_length when the tokenizer states none.
_NO_LIMIT = 10 ** 12
_CONFIG_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def context_length(config: Any = None, tokenizer: Any = None) -> int | None:
    """The model's context in tokens: the smallest of what its config states
    (`max_position_embeddings`, or the older names) and the tokenizer's `model_max_length`, when
    either states one; None when neither does. The smallest, because past either a model either
    has no position to give a token or was never trained there."""
    found = []
    if config is not None:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        for key in _CONFIG_CONTEXT_KEYS:
            value = getattr(text, key, None)
            if isinstance(value, int) and value > 0:
                found.append(value)
                break
    limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(limit, int) and 0 < limit < _NO_LIMIT:
        found.append(limit)
    return min(found) if found else None


def check_budget(budget: int, context: int | None, flag: str) -> int | None:
    """THE token-budget check of every verb that generates (`profile`, `evaluate`, `compare`,
    `train`): `budget` new tokens must leave room for a prompt in the model's `context` (None: the
    model states none). Returns the room left for a prompt; a budget that leaves none is a
    ValueError naming `flag`, in every verb alike."""
    if context is None:
        return None
    room = context - budget
    if room < 1:
        raise ValueError(f"{flag} {budget} leaves no room for a prompt in the model's context of "
                         f"{context} tokens: lower it")
    return room


def split_too_long(prompts: list[str], tokenizer: Any, limit: int | None) -> tuple[list[int], dict[int, int]]:
    """(indices of prompts that fit, {index: token count} of those longer than `limit`).
    Counted as the engines tokenize them: no special tokens added (pivotrl.formats.chat). A
    prompt too long to fit by its length alone (`pivotrl.formats.length_bound`) is not
    tokenized, which could take minutes: its count is the fewest tokens it can be."""
    if limit is None:
        return list(range(len(prompts))), {}
    bound = length_bound(tokenizer)
    fits, too_long = [], {}
    for i, prompt in enumerate(prompts):
        fewest = bound.fewest_tokens(prompt) if bound is not None else 0
        if fewest > limit:
            too_long[i] = fewest
            continue
        n = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        if n > limit:
            too_long[i] = n
        else:
            fits.append(i)
    return fits, too_long


class PrefetchStopped(BaseException):
    """Raised in a prefetch worker to stop it: its caller left (Ctrl-C, an error, or it stopped
    reading). A BaseException, so no `except Exception` inside the sampler swallows it."""


def stop_thread(thread: threading.Thread, finished: threading.Event, timeout: float = 30.0) -> None:
    """Stop a Python thread that has not `finished` and wait for it to. An exception is raised
    in it (CPython's PyThreadState_SetAsyncExc), delivered at its next Python bytecode: a torch
    model's forward runs Python between its ops, so a generation stops within one op. Why it must
    stop, not be left as a daemon: a daemon thread still inside torch when the interpreter
    finalizes is cut off by pthread_exit, which unwinds through C++ frames that forbid it, and
    the process aborts ("terminate called without an active exception", SIGABRT) instead of
    exiting with its own status (130 after Ctrl-C). The thread's own `finished` event, not
    `is_alive()`: a Ctrl-C that lands in `thread.join()` leaves CPython 3.11's Thread marked
    stopped while it still runs. A thread whose id is not known yet (Ctrl-C inside
    `thread.start()`) is waited for a moment: its target checks its cancel flag before any work,
    and one whose OS thread was never made has nothing to stop."""
    import ctypes

    if finished.wait(0 if thread.ident is not None else 1.0) or thread.ident is None:
        return
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(PrefetchStopped))
    finished.wait(timeout)


def prefetch(fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
    """fn(item) for each item in order; fn(next) runs in a worker thread while the caller handles
    the current result. When the caller leaves early (Ctrl-C, an error, or it stops iterating)
    the worker is stopped and joined (`stop_thread`), so no thread outlives the loop — a Ctrl-C
    inside `thread.start()` included: the worker is registered before it starts."""
    it = iter(items)
    pending: tuple[threading.Thread, dict[str, Any]] | None = None

    def start(item: T) -> None:
        nonlocal pending
        box: dict[str, Any] = {"finished": threading.Event(), "cancel": False}

        def run() -> None:
            try:
                if not box["cancel"]:
                    box["value"] = fn(item)
            except PrefetchStopped:
                pass
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller below
                box["error"] = exc
            finally:
                box["finished"].set()

        thread = threading.Thread(target=run, name="pivotrl-prefetch", daemon=True)
        pending = (thread, box)  # before start(): a Ctrl-C inside it still stops the thread
        thread.start()

    try:
        first = next(it, _END)
        if first is not _END:
            start(first)
        while pending is not None:
            thread, box = pending
            # A timed wait, not one join(): a Ctrl-C that lands just before the main thread
            # blocks is only handled when the wait returns, so an untimed one would hold it until
            # the whole chunk was sampled.
            while not box["finished"].wait(0.2):
                pass
            thread.join()
            if "error" in box:
                raise box["error"]
            pending = None
            following = next(it, _END)
            if following is not _END:
                start(following)
            yield box["value"]
    finally:
        if pending is not None:
            pending[1]["cancel"] = True
            stop_thread(pending[0], pending[1]["finished"])
