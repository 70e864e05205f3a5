"""One request cannot stop `pivotrl serve`: a body or prompt larger than the context can hold is
a 400 before anything is tokenized, and templating and tokenizing run off the event loop, so
/health and other requests are answered while one request is being tokenized."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest

from pivotrl.formats.length_bound import length_bound
from pivotrl.sampling.serve_limits import max_body_bytes
from test_serve_openai import start_server

REQUEST_TOKENS = 4096  # the server's --max-request-tokens: its body limit is ~2.4 MB


@pytest.fixture(scope="module")
def bounded_server(tiny_model_dir):
    proc, url = start_server(tiny_model_dir, "--max-request-tokens", str(REQUEST_TOKENS))
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def chat(text: str) -> dict:
    return {"messages": [{"role": "user", "content": text}], "max_tokens": 2}


def test_oversized_requests_are_400_at_once_and_health_answers_meanwhile(bounded_server,
                                                                          tiny_model_dir):
    from transformers import AutoTokenizer

    bound = length_bound(AutoTokenizer.from_pretrained(str(tiny_model_dir)))
    body_limit = max_body_bytes(bound, REQUEST_TOKENS)
    context = 2048  # the tiny model's positions, below --max-request-tokens
    answers: dict[str, httpx.Response] = {}

    def send(name: str, body: dict) -> None:
        # The client's timeout bounds a hang; tokenizing the megabyte run would take far longer.
        answers[name] = httpx.post(f"{bounded_server}/chat/completions", json=body, timeout=60)

    big = {"ten_megabytes": chat("All work and no play. " * 480_000),  # ~10 MB of text
           "megabyte_run": chat("a" * 1_000_000)}
    assert len(big["ten_megabytes"]["messages"][0]["content"]) > body_limit > 1_000_000
    threads = [threading.Thread(target=send, args=item, daemon=True) for item in big.items()]
    for thread in threads:
        thread.start()
    health = httpx.get(f"{bounded_server[:-3]}/health", timeout=60)
    for thread in threads:
        thread.join(120)
    assert health.status_code == 200
    body_refusal = answers["ten_megabytes"]
    assert body_refusal.status_code == 400, body_refusal.text
    assert f"above this server's limit of {body_limit:,} bytes" in body_refusal.json()["error"]["message"]
    run_refusal = answers["megabyte_run"]
    assert run_refusal.status_code == 400, run_refusal.text
    err = run_refusal.json()["error"]
    assert err["param"] == "messages" and err["code"] == 400
    assert f"cannot fit in {context:,} tokens" in err["message"]
    assert f"at most {bound.max_chars(context):,} characters" in err["message"]
    completion = httpx.post(f"{bounded_server}/completions", timeout=60,
                            json={"prompt": "b" * 1_000_000, "max_tokens": 2})
    assert completion.status_code == 400 and completion.json()["error"]["param"] == "prompt"
    assert "prompt 0 has 1,000,000 characters" in completion.json()["error"]["message"]
    # within every bound: answered as before
    ok = httpx.post(f"{bounded_server}/chat/completions", json=chat("Where is O-1?"), timeout=60)
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["role"] == "assistant"


class HeldTokenizer:
    """The engine's tokenizer, whose first call of `method` waits until the test lets it go."""

    def __init__(self, tok, method: str):
        self._tok, self._method = tok, method
        self.entered, self.release = threading.Event(), threading.Event()

    def _held(self, call):
        def run(*args, **kwargs):
            if not self.entered.is_set():
                self.entered.set()
                if not self.release.wait(60):  # the loop never got to /health
                    raise RuntimeError("held for 60 s: the event loop was blocked")
            return call(*args, **kwargs)
        return run

    def __call__(self, *args, **kwargs):
        call = self._tok.__call__
        return (self._held(call) if self._method == "__call__" else call)(*args, **kwargs)

    def __getattr__(self, name):
        if name.startswith("__") or name == "_tok":
            raise AttributeError(name)
        value = getattr(self._tok, name)
        return self._held(value) if name == self._method else value


@pytest.mark.parametrize("path,body,method", [
    ("/v1/completions", {"prompt": "hello", "max_tokens": 2}, "__call__"),  # tokenizing
    ("/v1/chat/completions", chat("hello"), "apply_chat_template"),  # templating
])
def test_health_answers_while_a_request_is_tokenized(tiny_model_dir, path, body, method):
    """Ordered by events: the request is inside the tokenizer (held there) when /health is asked;
    the tokenizer is let go only after /health answered, so a tokenizer on the event loop would
    have held /health too, and the request would fail after 60 s."""
    from pivotrl.sampling.serve import create_app

    app = create_app(str(tiny_model_dir), batch_size=8)
    held = HeldTokenizer(app.state.engine.tokenizer, method)
    app.state.engine.tokenizer = held

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://serve") as client:
            request = asyncio.ensure_future(client.post(path, json=body, timeout=120))
            assert await asyncio.to_thread(held.entered.wait, 60)
            health = await asyncio.wait_for(client.get("/health"), 60)
            held.release.set()
            return health, await request

    health, answer = asyncio.run(run())
    assert health.status_code == 200
    assert answer.status_code == 200, answer.text
