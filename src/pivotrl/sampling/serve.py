"""`pivotrl serve`: an OpenAI-compatible endpoint around a local HF model (FastAPI + uvicorn),
answering the way `vllm serve` does so the same clients work against both.

Endpoints: `GET /health`, `GET /v1/models`, `POST /v1/completions` (prompt text or a list),
`POST /v1/chat/completions` (messages + tools, templated with the model's own chat template; tool
calls in the completion come back as OpenAI `tool_calls`). Request fields honoured: `model` (must
be the served name), `n`, `max_tokens` / `max_completion_tokens`, `temperature`, `top_p`, `seed`,
`stop`, `stream` (server-sent events, ending `data: [DONE]`) with `stream_options.include_usage`,
`logprobs` (completions: the top-k count) / `logprobs` + `top_logprobs` (chat), and vLLM's
`return_tokens_as_token_ids`. Fields this server cannot honour (`echo`, `best_of` > n, penalties,
`logit_bias`) are refused with a 400 rather than ignored.

Errors have OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`: 400 for any invalid
field or number (NaN/inf floats, seeds outside int64, limits below), 404 for an unknown model.
Limits protect the host: `max_tokens` <= `max_tokens_limit` (the model's context length when
known), prompt + `max_tokens` within the context, one token budget per request for prompt and
completion together, `n x sum over prompts of (prompt tokens + max_tokens)` <=
`max_request_tokens` (each of the n rows holds its prompt in the KV cache too), and at most
`MAX_STOP_STRINGS` stop strings of at most `MAX_STOP_CHARS` characters (OpenAI allows 4; every
decoding step scans each stop string, so unbounded lists made one request's steps, and the
requests queued behind it, arbitrarily slow). Every limit is checked before the request waits
for the model. Nothing is tokenized that no prompt could be: a body larger than the most text
the context and `max_request_tokens` can hold (`serve_limits`) and a prompt longer than the
context can hold (`pivotrl.formats.length_bound`, from the tokenizer's longest token) are 400s
before any tokenizing, as tokenizing a long run of one letter can take minutes. Templating and
tokenizing run in worker threads, so /health and other requests are answered meanwhile. A
request whose client disconnects is cancelled, waiting or generating (generation stops at the
next token); SIGTERM cancels the running generation and shuts down.

Generation goes through the `hf` sampler, one request at a time, in arrival order (the lock is
FIFO), so a request waits at most for the bounded work of those ahead of it, and no request can
hold the model longer than its own token budget allows. For a given `seed` a prompt's samples are
the ones `--backend hf` draws in-process for that seed. For throughput on GPUs use `vllm serve`;
this server is for small models, CPUs and tests.

Streaming is token by token, for every n and every number of prompts: the generate loop reports
each decoding step (`generation.generate(on_step=...)`) and each choice's new text goes out as it
is drawn (`pivotrl.sampling.serve_stream` says when text is held back: incomplete UTF-8, a possible stop
string, a tool call). A request's choices decode together, so their chunks interleave; prompts
beyond one batch (`--batch-size` rows) start streaming when the batch before them ends. The
streamed text concatenates to the non-streamed text for the same seed. Chat with tools: the text
before a call streams as content; the calls go out as `delta.tool_calls` when generation ends, so
a streamed tool-call message's content is that raw text while the non-streamed one's is the
parser's (think blocks and surrounding whitespace dropped), as with vLLM's tool parsers. Errors
after a stream started come as one `data: {"error": ...}` event before `[DONE]`.

Logprobs come from the forward passes that drew the tokens: the log-softmax of the raw logits
(before temperature and top-p), as vLLM reports by default; the end token is not listed.
"""

# No `from __future__ import annotations`: FastAPI reads the endpoint annotations (Request is
# imported inside create_app) as objects.
import asyncio
import json
import random
import threading
import time
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pivotrl.formats.length_bound import length_bound
from pivotrl.io.records import Message
from pivotrl.sampling.serve_stream import (
    ChatChunks,
    CompletionChunks,
    Observer,
    chat_choices,
    completion_choices,
    usage,
)
from pivotrl.sampling.serve_limits import BodyLimit, error_body, max_body_bytes

DEFAULT_MAX_TOKENS = 256
MAX_N = 128
MAX_REQUEST_TOKENS = 1 << 16  # n x (prompt + max_tokens) over prompts; ~64k tokens of KV cache
MAX_STOP_STRINGS = 16  # OpenAI allows 4; vLLM sets no bound. Generous, and still bounded:
MAX_STOP_CHARS = 256  # each decoding step scans every stop string in the choice's tail
INT64 = 2**63
_FLOAT = {"allow_inf_nan": False}


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=100.0, **_FLOAT)
    top_p: float = Field(1.0, gt=0.0, le=1.0, **_FLOAT)
    seed: int | None = Field(None, ge=-INT64, lt=INT64)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    return_tokens_as_token_ids: bool = False  # vLLM's: logprob tokens as "token_id:<id>"
    # Accepted only at the values that change nothing (see `unsupported`).
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0, **_FLOAT)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0, **_FLOAT)
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    @field_validator("stop")
    @classmethod
    def _bounded_stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        stops = [stop] if isinstance(stop, str) else (stop or [])
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}")
        if any(len(s) > MAX_STOP_CHARS for s in stops):
            raise ValueError(f"a stop string has at most {MAX_STOP_CHARS} characters")
        return stop

    def unsupported(self) -> str | None:
        if self.presence_penalty or self.frequency_penalty:
            return "presence_penalty/frequency_penalty"
        if self.logit_bias:
            return "logit_bias"
        return None


class CompletionRequest(_Common):
    prompt: str | list[str]
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    best_of: int | None = Field(None, ge=1, le=MAX_N)

    def top_k(self) -> int | None:
        """Alternatives per token in the logprobs (None: no logprobs)."""
        return self.logprobs

    def unsupported(self) -> str | None:
        if self.echo:
            return "echo"
        if self.best_of is not None and self.best_of != self.n:
            return "best_of"
        return super().unsupported()


class ChatRequest(_Common):
    messages: list[Message]
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)

    def top_k(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def unsupported(self) -> str | None:
        if self.tool_choice not in (None, "auto", "none"):
            return "tool_choice other than auto/none"
        return super().unsupported()


class APIError(Exception):
    """An OpenAI-style error answer."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param



def _sse(data: Any) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


class Cancelled(Exception):
    """Raised inside the model's forward pass to end a generation whose client left."""


class Engine:
    """The sampler behind the endpoints: one generation at a time, cancellable."""

    def __init__(self, model_dir: str, batch_size: int, max_tokens_limit: int | None,
                 max_request_tokens: int):
        from pivotrl.sampling.hf import HFSampler

        self.sampler = HFSampler(model_dir, batch_size=batch_size)
        self.tokenizer = self.sampler.tokenizer
        # tool calls are read in the model's own format (its chat template tells which)
        from pivotrl.formats.families import parser_for

        self.parse = parser_for(self.tokenizer)
        from pivotrl.sampling.pipeline import context_length

        self.max_model_len = context_length(self.sampler.model.config, self.tokenizer)
        self.max_tokens_limit = max_tokens_limit or self.max_model_len or 32768
        self.max_request_tokens = max_request_tokens
        # No prompt can hold more tokens than this, whatever n and max_tokens are: a text the
        # tokenizer's LengthBound says cannot fit in it is refused without being tokenized.
        self.context_tokens = min(self.max_model_len or max_request_tokens, max_request_tokens)
        self.bound = length_bound(self.tokenizer)
        self.max_body_bytes = max_body_bytes(self.bound, max_request_tokens)
        self.lock = asyncio.Lock()
        self.shutdown = threading.Event()
        self.cancel = threading.local()  # the running request's event, in the generating thread

        def stop_if_cancelled(module, args):
            # Every decoding step calls the model once: checking here ends any generation loop
            # at the next token. serve owns this model, so the hook is its to add.
            event = getattr(self.cancel, "event", None)
            if event is not None and (event.is_set() or self.shutdown.is_set()):
                raise Cancelled()

        self.sampler.model.register_forward_pre_hook(stop_if_cancelled)

    def check_max_tokens(self, max_tokens: int) -> None:
        if max_tokens > self.max_tokens_limit:
            raise APIError(400, f"max_tokens={max_tokens} is above this server's limit "
                           f"{self.max_tokens_limit}", "max_tokens")

    def check_tokens(self, prompts: list[str], n: int, max_tokens: int,
                     param: str = "prompt") -> None:
        """Prompt + max_tokens must fit the model's context (vLLM's rule), and n x the sum over
        prompts of (prompt tokens + max_tokens) must fit this server's request budget (400s).
        Prompts are measured by their length first (`pivotrl.formats.length_bound`): one longer
        than any prompt can be is refused untokenized. Blocking: call it off the event loop."""
        if max_tokens * n * len(prompts) > self.max_request_tokens:  # no prompt need be read
            self._over_budget(max_tokens * n * len(prompts))
        if self.bound is not None:
            fewest = 0
            for i, prompt in enumerate(prompts):
                what = "the prompt" if param == "messages" else f"prompt {i}"
                if why := self.bound.refusal(prompt, self.context_tokens, what):
                    raise APIError(400, why, param)
                fewest += (self.bound.fewest_tokens(prompt) + max_tokens) * n
            if fewest > self.max_request_tokens:  # at least this many, not one tokenized
                self._over_budget(fewest)
        total = 0
        for prompt in prompts:
            used = len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"]) + max_tokens
            if self.max_model_len is not None and used > self.max_model_len:
                raise APIError(400, f"This model's maximum context length is {self.max_model_len} "
                               f"tokens. However, you requested {used} tokens (prompt + max_tokens)",
                               "max_tokens")
            total += used * n
            if total > self.max_request_tokens:
                self._over_budget(total)

    def _over_budget(self, total: int) -> None:
        raise APIError(400, f"n x (prompt tokens + max_tokens) over the prompts = {total} or more "
                       f"is above this server's limit {self.max_request_tokens} "
                       "(--max-request-tokens)", "max_tokens")

    def observer(self, req: _Common, n_prompts: int, tools_active: bool = False) -> Observer:
        """Follows each choice through the generate loop (its text as deltas, its logprobs)."""
        openers = self.parse.format.call_openers if tools_active else ()
        return Observer(self.tokenizer, req.n, n_prompts, self.sampler.stop_token_ids, req.stop,
                        openers, req.top_k())

    def _run(self, prompts, n, params, seeds, event, on_step):
        self.cancel.event = event
        try:
            return self.sampler.sample(prompts, n, params, seeds=seeds, on_step=on_step)
        finally:
            self.cancel.event = None

    async def generate(self, request, prompts: list[str], req: _Common, max_tokens: int,
                       on_step=None, event: threading.Event | None = None):
        """Completions of `prompts`; raises APIError(499) when the client leaves first (or
        `event` is set: the stream that reads `on_step` was closed)."""
        from pivotrl.sampling.base import SamplingParams
        from pivotrl.io.seeds import derive_seed

        params = SamplingParams(max_new_tokens=max_tokens, temperature=req.temperature,
                                top_p=req.top_p)
        base = req.seed if req.seed is not None else random.getrandbits(62)
        # A single prompt samples with the request's seed itself (= hf backend with that seed).
        seeds = [base] if len(prompts) == 1 else [derive_seed(base, i) for i in range(len(prompts))]
        event = event or threading.Event()
        async with self.lock:
            if self.shutdown.is_set():
                raise APIError(503, "the server is shutting down")
            if event.is_set() or await request.is_disconnected():
                raise APIError(499, "client disconnected")
            work = asyncio.ensure_future(asyncio.to_thread(self._run, prompts, req.n, params,
                                                           seeds, event, on_step))
            while not work.done():
                await asyncio.wait([work], timeout=0.1)
                if not work.done() and await request.is_disconnected():
                    event.set()  # the next forward pass raises Cancelled; the lock frees then
            try:
                results = await work
            except Cancelled:
                if self.shutdown.is_set():
                    raise APIError(503, "the server is shutting down") from None
                raise APIError(499, "client disconnected") from None
        return results


async def _stream_events(engine: Engine, request, prompts: list[str], req: _Common,
                         max_tokens: int, obs: Observer, chunks, head: dict[str, Any]):
    """Server-sent events of one request while it generates: `obs` (on the generating thread)
    hands each step's new text to this loop through a queue."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    obs.emit = lambda out: loop.call_soon_threadsafe(queue.put_nowait, out)
    leave = threading.Event()
    work = asyncio.ensure_future(engine.generate(request, prompts, req, max_tokens, obs, leave))

    def ended(task) -> None:
        # Steps were queued from the thread before it returned, so this end mark comes last.
        queue.put_nowait(None)
        if not task.cancelled():
            task.exception()  # read here: a stream that was closed no longer awaits it

    work.add_done_callback(ended)
    try:
        for choice in chunks.start():
            yield _sse({**head, "choices": [choice]})
        while (out := await queue.get()) is not None:
            for index, text, first, end in out:
                yield _sse({**head, "choices": [chunks.delta(index, text, first, end)]})
        results = work.result()
        for choice in chunks.last(results):
            yield _sse({**head, "choices": [choice]})
        if (req.stream_options or {}).get("include_usage"):
            yield _sse({**head, "choices": [], "usage": usage(results)})
    except APIError as exc:  # the 200 and earlier chunks are sent: the error is an event
        yield _sse(error_body(exc.status, exc.message, exc.param))
    finally:
        leave.set()  # a client that left mid-stream: generation stops at its next step
    yield "data: [DONE]\n\n"


def _openai_errors(app) -> None:
    """Every error as OpenAI's `{"error": {...}}` (validation errors are 400s, as vLLM answers)."""
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    @app.exception_handler(APIError)
    async def api_error(_, exc: APIError):
        return JSONResponse(error_body(exc.status, exc.message, exc.param), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(_, exc: RequestValidationError):
        err = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        return JSONResponse(error_body(400, f"{'.'.join(loc) or 'body'}: {err.get('msg')}",
                                       ".".join(loc) or None), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_, exc: StarletteHTTPException):
        return JSONResponse(error_body(exc.status_code, str(exc.detail)), status_code=exc.status_code)


def create_app(model_dir: str, batch_size: int = 64, served_name: str | None = None,
               max_tokens_limit: int | None = None, max_request_tokens: int = MAX_REQUEST_TOKENS):
    from fastapi import FastAPI, Request
    from fastapi.responses import Response, StreamingResponse

    from pivotrl.formats.chat import prompt_text

    engine = Engine(model_dir, batch_size, max_tokens_limit, max_request_tokens)
    name = served_name or str(model_dir)
    app = FastAPI(title="pivotrl serve", version="1")
    app.state.engine = engine
    _openai_errors(app)
    app.add_middleware(BodyLimit, limit=engine.max_body_bytes)

    def check(req: _Common, max_tokens: int) -> None:
        if req.model is not None and req.model != name:
            raise APIError(404, f"The model `{req.model}` does not exist.", "model")
        if what := req.unsupported():
            raise APIError(400, f"{what} is not supported by pivotrl serve", what.split("/")[0])
        if isinstance(req, ChatRequest) and req.top_logprobs is not None and not req.logprobs:
            raise APIError(400, "top_logprobs needs logprobs=true", "top_logprobs")
        engine.check_max_tokens(max_tokens)

    async def answer(request, prompts, req: _Common, max_tokens, obs, chunks, head, body):
        if not req.stream:
            results = await engine.generate(request, prompts, req, max_tokens,
                                            obs if req.top_k() is not None else None)
            return {**head, **body(results), "usage": usage(results)}
        if engine.shutdown.is_set():
            raise APIError(503, "the server is shutting down")
        head = {**head, "object": chunks.object}
        return StreamingResponse(
            _stream_events(engine, request, prompts, req, max_tokens, obs, chunks, head),
            media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=503 if engine.shutdown.is_set() else 200)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": name, "object": "model", "created": 0, "owned_by": "pivotrl", "root": name,
                "max_model_len": engine.max_model_len}
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        prompts = [req.prompt] if isinstance(req.prompt, str) else list(req.prompt)
        if not prompts:
            raise APIError(400, "prompt is empty", "prompt")
        max_tokens = req.max_tokens or DEFAULT_MAX_TOKENS
        check(req, max_tokens)
        # Tokenized in a worker thread: the event loop answers /health and the others meanwhile.
        await asyncio.to_thread(engine.check_tokens, prompts, req.n, max_tokens)
        obs = engine.observer(req, len(prompts))
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                "created": int(time.time()), "model": name}
        return await answer(request, prompts, req, max_tokens, obs, CompletionChunks(req, obs),
                            head, lambda results: {"choices": completion_choices(results, req, obs)})

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest, request: Request):
        max_tokens = req.max_completion_tokens or req.max_tokens or DEFAULT_MAX_TOKENS
        check(req, max_tokens)
        try:
            prompt = await asyncio.to_thread(prompt_text, engine.tokenizer, req.messages, req.tools)
        except Exception as exc:  # noqa: BLE001 - a template error is the client's input
            raise APIError(400, f"chat template failed: {exc}", "messages") from None
        await asyncio.to_thread(engine.check_tokens, [prompt], req.n, max_tokens, "messages")
        obs = engine.observer(req, 1, tools_active=req.tool_choice != "none")
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
                "created": int(time.time()), "model": name}
        return await answer(request, [prompt], req, max_tokens, obs,
                            ChatChunks(req, obs, engine.parse), head,
                            lambda results: {"choices": chat_choices(results, req, engine.parse, obs)})

    return app


def serve(model_dir: str, host: str = "127.0.0.1", port: int = 8000, batch_size: int = 64,
          served_name: str | None = None, log_level: str = "warning",
          max_tokens_limit: int | None = None, max_request_tokens: int = MAX_REQUEST_TOKENS) -> None:
    import uvicorn

    app = create_app(model_dir, batch_size, served_name, max_tokens_limit, max_request_tokens)

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):  # SIGTERM/SIGINT: stop the running generation too
            app.state.engine.shutdown.set()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=5)
    Server(config).run()
