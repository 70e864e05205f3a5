"""`pivotrl serve` (a subprocess on loopback, serving the tiny model) as a drop-in for `vllm serve`:
the openai backend profiles through it exactly as in-process, the official `openai` client streams
from it, errors are OpenAI-shaped 4xx, a client that leaves frees the model, SIGTERM stops it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

from pivotrl.profiling import ProfileConfig, profile_file
from pivotrl.records import Profile, iter_valid
from pivotrl.sampling import SamplingParams, get_sampler
from pivotrl.sampling.hf import HFSampler
from pivotrl.verifiers import get_verifier


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(model_dir, *extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pivotrl.cli", "serve", "--model", str(model_dir),
         "--port", str(port), "--served-model-name", "tiny", *extra],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.time() + 180
    while True:
        if proc.poll() is not None:
            pytest.fail("pivotrl serve exited: " + proc.stderr.read().decode()[-2000:])
        try:
            if httpx.get(f"{url[:-3]}/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.time() > deadline:
            proc.kill()
            pytest.fail("pivotrl serve did not come up in 180 s")
        time.sleep(0.2)
    return proc, url


@pytest.fixture(scope="module")
def server_proc(tiny_model_dir):
    proc, url = start_server(tiny_model_dir)
    yield proc, url
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture
def server(server_proc):
    if server_proc[0].poll() is not None:
        pytest.fail("the module's server has exited (the SIGTERM test must run last)")
    return server_proc[1]


def test_endpoints(server):
    models = httpx.get(f"{server}/models").json()
    assert models["data"][0]["id"] == "tiny"
    body = {"model": "tiny", "prompt": ["hello", "a longer prompt here"], "n": 2,
            "max_tokens": 5, "seed": 4, "temperature": 0.8}
    a = httpx.post(f"{server}/completions", json=body, timeout=60).json()
    b = httpx.post(f"{server}/completions", json=body, timeout=60).json()
    assert [c["index"] for c in a["choices"]] == [0, 1, 2, 3]
    assert [c["text"] for c in a["choices"]] == [c["text"] for c in b["choices"]]  # seeded
    assert 4 <= a["usage"]["completion_tokens"] <= 20 and a["usage"]["prompt_tokens"] > 0
    chat = httpx.post(f"{server}/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "Where is O-1?"}], "n": 3, "max_tokens": 6,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}).json()
    assert len(chat["choices"]) == 3 and chat["object"] == "chat.completion"
    assert all(c["message"]["role"] == "assistant" for c in chat["choices"])
    assert httpx.get(f"{server[:-3]}/health").status_code == 200


@pytest.mark.parametrize("body,status,param", [
    ({"prompt": "x", "n": 0}, 400, "n"),
    ({"prompt": "x", "seed": 2**70}, 400, "seed"),
    ({"prompt": "x", "top_p": 0}, 400, "top_p"),
    ({"prompt": "x", "max_tokens": 10**9}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": 2000, "n": 128}, 400, "max_tokens"),  # n x max_tokens bound
    ({"prompt": "x " * 300, "max_tokens": 2040}, 400, "max_tokens"),  # prompt + max_tokens > context
    ({"prompt": "x", "logprobs": 2}, 400, "logprobs"),
    ({"prompt": "x", "model": "not-served"}, 404, "model"),
    ({"prompt": []}, 400, "prompt"),
])
def test_errors_are_openai_shaped(server, body, status, param):
    r = httpx.post(f"{server}/completions", json=body, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and err["param"] == param and err["message"] and err["type"]


def test_non_finite_numbers_are_400(server):
    for raw in (b'{"prompt": "x", "temperature": NaN}', b'{"prompt": "x", "top_p": Infinity}',
                b'{"messages": [{"role": "user", "content": "x"}], "temperature": -Infinity}'):
        path = "/chat/completions" if b"messages" in raw else "/completions"
        r = httpx.post(f"{server}{path}", content=raw, timeout=30,
                       headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["param"] in ("temperature", "top_p")
    r = httpx.post(f"{server}/chat/completions", timeout=30,
                   json={"messages": [{"role": "user", "content": "x"}], "logprobs": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"


def test_official_openai_client_streams(server):
    import openai  # the dev extra installs it: this test must run, not skip
    client = openai.OpenAI(base_url=server, api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "Where is O-1?"}]
    whole = client.chat.completions.create(model="tiny", messages=messages, seed=7,
                                           max_completion_tokens=6, n=2)
    assert all(c.message.role == "assistant" for c in whole.choices)
    assert whole.usage.completion_tokens <= 2 * 6  # max_completion_tokens honoured
    stream = client.chat.completions.create(model="tiny", messages=messages, seed=7,
                                            max_completion_tokens=6, n=2, stream=True,
                                            stream_options={"include_usage": True})
    texts, reasons, usage = {0: "", 1: ""}, {}, None
    chunks = 0
    for chunk in stream:
        chunks += 1
        usage = chunk.usage or usage
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                reasons[choice.index] = choice.finish_reason
    assert chunks >= 4
    for c in whole.choices:  # same seed: the stream carries the same completions
        assert texts[c.index] == (c.message.content or "") and reasons[c.index] == c.finish_reason
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens
    plain = client.completions.create(model="tiny", prompt="hello", max_tokens=5, seed=3)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny", prompt="hello", max_tokens=5, seed=3, stream=True) if c.choices)
    assert streamed == plain.choices[0].text
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="hello", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model="tiny", prompt="hello", temperature=-1)


def test_a_client_that_leaves_frees_the_model(tiny_model_dir):
    """In-process: the request's client disconnects mid-generation; generation stops at the next
    forward pass, the lock is released, the next request runs; SIGTERM's flag stops it too."""
    import asyncio

    from pivotrl import serve

    engine = serve.Engine(str(tiny_model_dir), 64, None, 1 << 20)
    steps = []  # forward passes that ran (ours, registered after serve's, sees only those)
    engine.sampler.model.register_forward_pre_hook(lambda module, args: steps.append(1))

    class Client:
        def __init__(self, leave_after: float):
            self.t0, self.leave_after = time.time(), leave_after

        async def is_disconnected(self) -> bool:
            return time.time() - self.t0 > self.leave_after

    req = serve.CompletionRequest(prompt="x", n=4, max_tokens=1900, seed=5)
    with pytest.raises(serve.APIError) as info:
        asyncio.run(engine.generate(Client(0.5), ["x"], req, 1900))
    assert info.value.status == 499
    assert 0 < len(steps) < 1900  # stopped at the cancel, not at max_tokens
    assert not engine.lock.locked()
    done = asyncio.run(engine.generate(Client(60), ["x"], serve.CompletionRequest(prompt="x"), 3))
    assert len(done) == 1 and done[0][0].completion_tokens <= 3
    # a request whose client left while it waited never starts
    before = len(steps)
    with pytest.raises(serve.APIError):
        asyncio.run(engine.generate(Client(-1), ["x"], req, 1900))
    assert len(steps) == before
    engine.shutdown.set()
    with pytest.raises(serve.APIError) as info:
        asyncio.run(engine.generate(Client(60), ["x"], req, 1900))
    assert info.value.status == 503 and len(steps) == before


def test_profile_through_the_server_equals_in_process(server, tiny_model_dir, tmp_path):
    turns = tmp_path / "turns.jsonl"
    tools = [{"type": "function", "function": {"name": "get_order", "parameters": {
        "type": "object", "properties": {"order_id": {"type": "string"}}}}}]
    turns.write_text("".join(json.dumps({
        "id": f"t{i}/1", "trajectory_id": f"t{i}", "turn": 1, "tools": tools,
        "context": [{"role": "user", "content": f"Where is order O-{i}?" + " now" * i}],
        "expected": {"role": "assistant", "tool_calls": [{"type": "function", "function": {
            "name": "get_order", "arguments": json.dumps({"order_id": f"O-{i}"})}}]}}) + "\n"
        for i in range(5)))
    cfg = ProfileConfig(k=3, verifier="toolcall", seed=2, max_new_tokens=8)
    verifier = get_verifier("toolcall")
    local = HFSampler(str(tiny_model_dir))
    remote = get_sampler("openai", None, base_url=server, concurrency=4)
    assert remote.model == "tiny"
    via_http = profile_file(turns, tmp_path / "http.jsonl", remote, verifier, local.tokenizer, cfg,
                            progress=False)
    profile_file(turns, tmp_path / "local.jsonl", local, verifier, local.tokenizer, cfg,
                 progress=False)
    got = [(p.id, [s.completion for s in p.samples]) for p in iter_valid(tmp_path / "http.jsonl", Profile)]
    want = [(p.id, [s.completion for s in p.samples]) for p in iter_valid(tmp_path / "local.jsonl", Profile)]
    assert got == want and len(got) == 5
    run = via_http["runs"][-1]
    assert run["rollout_turns"] == 15 and 15 <= run["generated_tokens"] <= 15 * 8
    stats = json.loads((tmp_path / "local.stats.json").read_text())
    assert stats["totals"]["generated_tokens"] == run["generated_tokens"]
    # Direct sampling with the same seed agrees too.
    out = remote.sample(["<|im_start|>user\nhi<|im_end|>\n"], 2, SamplingParams(max_new_tokens=4),
                        seeds=[5])
    assert [c.text for c in out[0]] == [c.text for c in local.sample(
        ["<|im_start|>user\nhi<|im_end|>\n"], 2, SamplingParams(max_new_tokens=4), seeds=[5])[0]]


def test_sigterm_stops_a_busy_server(server_proc):
    """Last in this file: it stops the module's server."""
    import signal
    import threading

    proc, url = server_proc
    busy = threading.Thread(target=lambda: httpx.post(
        f"{url}/completions", json={"prompt": "x", "max_tokens": 1900, "n": 8}, timeout=120),
        daemon=True)
    busy.start()
    time.sleep(1.5)  # the long generation is running
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=20)
    finally:
        proc.kill()
    elapsed = time.time() - t0
    # uvicorn shuts down gracefully, then re-raises the signal: exit by SIGTERM, no traceback
    assert rc in (0, -signal.SIGTERM) and elapsed < 10, (rc, elapsed)
    assert b"Traceback" not in proc.stderr.read()
