"""`pivotrl serve` (a subprocess on loopback, serving the tiny model) as a drop-in for `vllm serve`:
the openai backend profiles through it exactly as in-process, the official `openai` client streams
from it token by token (the stream concatenates to the non-streamed answer), logprobs are the
model's, errors are OpenAI-shaped 4xx, a client that leaves frees the model, SIGTERM stops it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

from pivotrl.io.records import Message, Profile, iter_valid
from pivotrl.profile.loop import ProfileConfig
from pivotrl.profile.runs import profile_file
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
    ({"prompt": "x", "logprobs": 21}, 400, "logprobs"),
    ({"prompt": "x", "logprobs": -1}, 400, "logprobs"),
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

@pytest.mark.parametrize("extra", [{"logprobs": True, "top_logprobs": 21},
                                   {"logprobs": True, "top_logprobs": -1},
                                   {"top_logprobs": 2}])  # top_logprobs needs logprobs=true
def test_chat_logprob_errors(server, extra):
    r = httpx.post(f"{server}/chat/completions", timeout=30,
                   json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == 400 and err["param"] == "top_logprobs" and err["message"]


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
    plain = client.completions.create(model="tiny", prompt=["hello", "get"], max_tokens=12,
                                      seed=3, n=2)
    pieces: dict[int, list[str]] = {}
    for c in client.completions.create(model="tiny", prompt=["hello", "get"], max_tokens=12,
                                       seed=3, n=2, stream=True):
        for choice in c.choices:
            pieces.setdefault(choice.index, []).append(choice.text)
    assert sorted(pieces) == [0, 1, 2, 3]
    for c in plain.choices:  # token by token, and the same text as the non-streamed answer
        assert "".join(pieces[c.index]) == c.text
        assert sum(1 for p in pieces[c.index] if p) >= 3, pieces[c.index]
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="hello", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model="tiny", prompt="hello", temperature=-1)


def _sse_json(response) -> list[dict]:
    lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


def _model_logprobs(model_dir, prompt_ids: list[int], completion_ids: list[int]):
    """log_softmax of the model's logits at each completion position, computed here, apart."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + completion_ids])).logits[0].float()
    return torch.log_softmax(logits[len(prompt_ids) - 1:-1], dim=-1)


def _check_logprobs(chosen: list[int], lps: list[float], tops: list[list[tuple[int, float]]],
                    want, k: int) -> None:
    assert len(chosen) == len(lps) == len(tops) > 0
    for pos, (tok, lp, top) in enumerate(zip(chosen, lps, tops)):
        assert abs(lp - float(want[pos, tok])) < 1e-4, (pos, lp, float(want[pos, tok]))
        values = [v for _, v in top]
        assert values == sorted(values, reverse=True)
        ids = [i for i, _ in top]
        assert ids == want[pos].topk(k).indices.tolist()  # the model's own top-k, best first
        assert all(abs(v - float(want[pos, i])) < 1e-4 for i, v in top)
        if lp >= values[-1] + 1e-6:  # the drawn token is in the top k: it is listed
            assert tok in ids


def _token_id(token: str) -> int:
    return int(token.removeprefix("token_id:"))


def test_completion_logprobs_are_the_models(server, tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    body = {"prompt": "get_order", "max_tokens": 8, "seed": 11, "temperature": 1.3, "logprobs": 3,
            "return_tokens_as_token_ids": True}
    choice = httpx.post(f"{server}/completions", json=body, timeout=60).json()["choices"][0]
    plain = httpx.post(f"{server}/completions", json={**body, "logprobs": None},
                       timeout=60).json()["choices"][0]
    assert choice["text"] == plain["text"] and plain["logprobs"] is None  # same sample
    block = choice["logprobs"]
    chosen = [_token_id(t) for t in block["tokens"]]
    assert tokenizer.decode(chosen, skip_special_tokens=False) == choice["text"]
    # each dict lists the top 3, then the drawn token when it is not among them (vLLM's shape)
    tops = [[(_token_id(t), v) for t, v in d.items()][:3] for d in block["top_logprobs"]]
    assert all(len(d) in (3, 4) for d in block["top_logprobs"])
    prompt = tokenizer("get_order", add_special_tokens=False)["input_ids"]
    _check_logprobs(chosen, block["token_logprobs"], tops,
                    _model_logprobs(tiny_model_dir, prompt, chosen), 3)
    assert block["text_offset"][0] == 0 and block["text_offset"] == sorted(block["text_offset"])
    # the stream carries the same tokens and logprobs, a token per chunk
    with httpx.stream("POST", f"{server}/completions", json={**body, "stream": True}, timeout=60) as r:
        chunks = [c["choices"][0] for c in _sse_json(r) if c["choices"]]
    streamed = [c["logprobs"] for c in chunks if c["logprobs"]]
    assert len(streamed) == len(chosen)
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert [x for c in streamed for x in c[key]] == block[key]
    assert "".join(c["text"] for c in chunks) == choice["text"]


def test_chat_logprobs_are_the_models(server, tiny_model_dir):
    from transformers import AutoTokenizer

    from pivotrl.formats.chat import prompt_text

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    messages = [{"role": "user", "content": "Where is O-1?"}]
    body = {"messages": messages, "max_tokens": 8, "seed": 2, "logprobs": True,
            "top_logprobs": 4, "return_tokens_as_token_ids": True, "temperature": 0}
    whole = httpx.post(f"{server}/chat/completions", json=body, timeout=60).json()
    content = whole["choices"][0]["logprobs"]["content"]
    chosen = [_token_id(c["token"]) for c in content]
    prompt = tokenizer(prompt_text(tokenizer, [Message(**m) for m in messages], None),
                       add_special_tokens=False)["input_ids"]
    tops = [[(_token_id(t["token"]), t["logprob"]) for t in c["top_logprobs"]] for c in content]
    _check_logprobs(chosen, [c["logprob"] for c in content], tops,
                    _model_logprobs(tiny_model_dir, prompt, chosen), 4)
    assert chosen == [top[0][0] for top in tops]  # temperature 0: the best token every time
    assert all(c["bytes"] == list(c["token"].encode()) for c in content)
    with httpx.stream("POST", f"{server}/chat/completions", json={**body, "stream": True},
                      timeout=60) as r:
        chunks = [c["choices"][0] for c in _sse_json(r) if c["choices"]]
    assert [x for c in chunks if c["logprobs"] for x in c["logprobs"]["content"]] == content


def test_stream_with_stop_strings_equals_plain(server):
    body = {"prompt": "hello", "max_tokens": 16, "seed": 5, "n": 3}
    texts = [c["text"] for c in httpx.post(f"{server}/completions", json=body,
                                           timeout=60).json()["choices"]]
    stop = [texts[0][4:7], texts[1][len(texts[1]) // 2:][:2]]  # strings these samples contain
    plain = httpx.post(f"{server}/completions", json={**body, "stop": stop}, timeout=60).json()
    with httpx.stream("POST", f"{server}/completions", json={**body, "stop": stop, "stream": True},
                      timeout=60) as r:
        chunks = [c["choices"][0] for c in _sse_json(r) if c["choices"]]
    for c in plain["choices"]:
        mine = [x for x in chunks if x["index"] == c["index"]]
        assert "".join(x["text"] for x in mine) == c["text"]
        assert mine[-1]["finish_reason"] == c["finish_reason"]
    assert [c["finish_reason"] for c in plain["choices"]][:2] == ["stop", "stop"]


def test_unbounded_stop_strings_are_refused_at_once_even_while_the_model_is_busy(server):
    """Stop strings are scanned at every decoding step: too many (or too long) are a 400, given
    before the request waits for the model, so a busy server answers it at once."""
    import threading

    # Ordered by events, not by the clock: the long request has produced its first token (it
    # holds the model) before the bad ones are sent, and had not finished when they were answered.
    first_token, done = threading.Event(), threading.Event()

    def long_request() -> None:
        with httpx.stream("POST", f"{server}/completions", timeout=300, json={
                "prompt": "hello", "max_tokens": 1900, "n": 8, "seed": 1, "stream": True}) as r:
            for _ in r.iter_lines():
                first_token.set()
        done.set()

    busy = threading.Thread(target=long_request, daemon=True)
    busy.start()
    assert first_token.wait(120)
    try:
        for stop, why in (([f"s{i}" for i in range(1200)], "at most 16 stop strings"),
                          (["x" * 257], "at most 256 characters")):
            r = httpx.post(f"{server}/completions", timeout=120,
                           json={"prompt": "x", "max_tokens": 4, "stop": stop})
            assert r.status_code == 400 and r.json()["error"]["param"] == "stop", r.text
            assert why in r.json()["error"]["message"]
            assert not done.is_set()  # answered while the long request still generated
    finally:
        busy.join(300)


def test_prompt_tokens_count_in_the_request_budget(tiny_model_dir):
    """One budget for prompt and completion: n x (prompt + max_tokens) over the prompts."""
    from pivotrl.sampling import serve

    engine = serve.Engine(str(tiny_model_dir), 8, None, 200)
    prompt = "the quick brown fox " * 4
    prompt_tokens = len(engine.tokenizer(prompt, add_special_tokens=False)["input_ids"])
    assert 40 < prompt_tokens < 190
    engine.check_tokens([prompt], 1, 200 - prompt_tokens)  # exactly the budget: accepted
    with pytest.raises(serve.APIError) as info:
        engine.check_tokens([prompt], 1, 201 - prompt_tokens)  # max_tokens alone is within it
    assert info.value.status == 400 and "prompt tokens + max_tokens" in info.value.message
    with pytest.raises(serve.APIError):  # n multiplies the prompt too
        engine.check_tokens([prompt], 2, 100 - prompt_tokens + 1)


def test_first_chunk_arrives_while_generation_runs(tiny_model_dir):
    """Deterministic: the model's third forward pass blocks until the test has received a
    chunk, so a stream that sent only after generation would never send one."""
    import asyncio
    import threading

    from pivotrl.sampling import serve

    engine = serve.Engine(str(tiny_model_dir), 64, None, 1 << 20)
    gate, passes = threading.Event(), []

    def hold(module, args):
        passes.append(1)
        if len(passes) == 3:  # prefill + one decoding step: two tokens drawn and reported
            assert gate.wait(60), "the test never received a chunk"

    engine.sampler.model.register_forward_pre_hook(hold)

    class Client:
        async def is_disconnected(self) -> bool:
            return False

    req = serve.CompletionRequest(prompt="hello", max_tokens=12, seed=4, logprobs=0, stream=True)
    obs = engine.observer(req, 1)

    async def run():
        events = serve._stream_events(engine, Client(), ["hello"], req, 12, obs,
                                      serve.CompletionChunks(req, obs), {"id": "x"})
        first = await asyncio.wait_for(events.__anext__(), 60)
        during = len(passes)
        gate.set()
        return first, during, [e async for e in events]

    first, during, rest = asyncio.run(run())
    assert during <= 3  # generation had not gone past its third forward pass (of 12)
    chunk = json.loads(first.removeprefix("data: "))["choices"][0]
    assert chunk["finish_reason"] is None and len(chunk["logprobs"]["tokens"]) == 1
    assert rest[-1] == "data: [DONE]\n\n" and len(passes) > 3
    text = chunk["text"] + "".join(json.loads(e[6:])["choices"][0]["text"] for e in rest[:-1])
    plain = engine.sampler.sample(["hello"], 1, SamplingParams(max_new_tokens=12), seeds=[4])
    assert text == plain[0][0].text


def test_a_stream_closed_midway_stops_generation(tiny_model_dir):
    """A client that leaves a stream (the server closes the event generator) frees the model
    at the next forward pass, long before max_tokens."""
    import asyncio

    from pivotrl.sampling import serve

    engine = serve.Engine(str(tiny_model_dir), 64, None, 1 << 20)
    passes = []
    engine.sampler.model.register_forward_pre_hook(lambda module, args: passes.append(1))

    class Client:
        async def is_disconnected(self) -> bool:
            return False  # only the closed stream tells

    req = serve.CompletionRequest(prompt="x", n=2, max_tokens=1900, seed=1, logprobs=0, stream=True)
    obs = engine.observer(req, 1)

    async def run():
        events = serve._stream_events(engine, Client(), ["x"], req, 1900, obs,
                                      serve.CompletionChunks(req, obs), {"id": "x"})
        await events.__anext__()
        await events.aclose()
        async with engine.lock:  # the generation ended and let go of the model
            return len(passes)

    assert asyncio.run(asyncio.wait_for(run(), 120)) < 1900


def test_streamed_tool_call_accumulates_like_the_plain_answer(tiny_model_dir):
    """The openai client's own accumulator, fed our chunks for a completion that is a tool call
    (its tokens fed one step at a time, no model needed), ends with the non-streamed message."""
    import torch
    from openai.lib.streaming.chat import ChatCompletionStreamState
    from openai.types.chat import ChatCompletionChunk
    from transformers import AutoTokenizer

    from pivotrl.formats.families import parser_for
    from pivotrl.sampling import serve
    from pivotrl.sampling.base import Completion
    from pivotrl.sampling.generate import Step

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    parse = parser_for(tokenizer)
    tools = [{"type": "function", "function": {"name": "get_order", "parameters": {}}}]
    text = ('Let me look.<tool_call>\n{"name": "get_order", "arguments": {"order_id": "O-1"}}'
            '\n</tool_call>')
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    req = serve.ChatRequest(messages=[Message(role="user", content="x")], tools=tools, stream=True)
    sent: list = []
    obs = serve.Observer(tokenizer, 1, 1, [tokenizer.eos_token_id], None,
                         parse.format.call_openers, None, emit=sent.extend)
    for tok in ids:
        obs(Step([(0, 0)], torch.tensor([tok]), torch.zeros(1, 8), torch.tensor([True])))
    chunks = serve.ChatChunks(req, obs, parse)
    results = [[Completion(text, 5, len(ids), "stop")]]
    head = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "tiny"}
    state = ChatCompletionStreamState()
    for choice in chunks.start() + [chunks.delta(*out) for out in sent] + chunks.last(results):
        state.handle_chunk(ChatCompletionChunk(**head, choices=[choice]))
    final = state.get_final_completion().choices[0]
    plain = serve.chat_choices(results, req, parse)[0]
    assert len(sent) > 3  # the content went out token by token
    assert "".join(out[1] for out in sent) == "Let me look."  # nothing of the call as content
    assert final.message.content == plain["message"]["content"] == "Let me look."
    assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in plain["message"]["tool_calls"]]
    assert final.finish_reason == plain["finish_reason"] == "tool_calls"


def test_a_client_that_leaves_frees_the_model(tiny_model_dir):
    """In-process: the request's client disconnects mid-generation; generation stops at the next
    forward pass, the lock is released, the next request runs; SIGTERM's flag stops it too."""
    import asyncio

    from pivotrl.sampling import serve

    engine = serve.Engine(str(tiny_model_dir), 64, None, 1 << 20)
    steps = []  # forward passes that ran (ours, registered after serve's, sees only those)

    def count_and_slow_down(module, args):
        # 1 ms a pass: 1900 tokens take ≥ 1.9 s, far longer than serve's 0.1-s disconnect poll,
        # so the cancel is not a race with a tiny model that decodes faster than the poll.
        steps.append(1)
        time.sleep(0.001)

    engine.sampler.model.register_forward_pre_hook(count_and_slow_down)

    class Client:
        def __init__(self, leave_after: int):
            self.leave_after = leave_after  # forward passes; < 0 = gone before it starts

        async def is_disconnected(self) -> bool:
            return self.leave_after < 0 or len(steps) >= self.leave_after > 0

    req = serve.CompletionRequest(prompt="x", n=4, max_tokens=1900, seed=5)
    with pytest.raises(serve.APIError) as info:
        asyncio.run(engine.generate(Client(5), ["x"], req, 1900))
    assert info.value.status == 499
    assert 0 < len(steps) < 1900  # stopped at the cancel, not at max_tokens
    assert not engine.lock.locked()
    done = asyncio.run(engine.generate(Client(0), ["x"], serve.CompletionRequest(prompt="x"), 3))
    assert len(done) == 1 and done[0][0].completion_tokens <= 3
    # a request whose client left while it waited never starts
    before = len(steps)
    with pytest.raises(serve.APIError):
        asyncio.run(engine.generate(Client(-1), ["x"], req, 1900))
    assert len(steps) == before
    engine.shutdown.set()
    with pytest.raises(serve.APIError) as info:
        asyncio.run(engine.generate(Client(0), ["x"], req, 1900))
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
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=60)  # bounds a hang: the generation alone would run for minutes
    finally:
        proc.kill()
    # uvicorn shuts down gracefully, then re-raises the signal: exit by SIGTERM, no traceback
    assert rc in (0, -signal.SIGTERM), rc
    assert b"Traceback" not in proc.stderr.read()
