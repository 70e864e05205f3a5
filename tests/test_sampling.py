"""Sampler backends: the hf sampler's distribution, seeds and token counts; the openai backend's
retries and errors against real loopback HTTP servers; the vllm backend's missing-extra error."""

from __future__ import annotations

import importlib.util
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from pivotrl.sampling import SamplerError, SamplingParams, get_sampler
from pivotrl.sampling.generate import pick_tokens
from pivotrl.sampling.hf import HFSampler

PROMPTS = ["<|im_start|>user\nWhere is order O-1?<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nPlease cancel order O-22 because it is late<|im_end|>\n"
           "<|im_start|>assistant\n",
           "<|im_start|>user\nls<|im_end|>\n<|im_start|>assistant\n"]


@pytest.fixture(scope="module")
def sampler(tiny_model_dir):
    return HFSampler(str(tiny_model_dir), batch_size=16)


def test_pick_tokens_follows_the_distribution():
    probs = torch.tensor([0.6, 0.25, 0.1, 0.05])
    rows = 4000
    scores = probs.log().expand(rows, 4).clone()
    u = torch.rand(rows, generator=torch.Generator().manual_seed(0))
    choice = pick_tokens(scores, u, temperature=1.0, top_p=1.0)
    freq = torch.bincount(choice, minlength=4).float() / rows
    assert torch.allclose(freq, probs, atol=0.03), freq
    # top-p 0.8 keeps the smallest prefix reaching 0.8: tokens 0 and 1, renormalised.
    choice = pick_tokens(scores, u, 1.0, 0.8)
    freq = torch.bincount(choice, minlength=4).float() / rows
    assert freq[2:].sum() == 0 and abs(freq[0] - 0.6 / 0.85) < 0.03
    # The nucleus is by probability, not by vocabulary position.
    shuffled = scores[:, [3, 1, 0, 2]]
    choice = pick_tokens(shuffled, u, 1.0, 0.8)
    assert set(choice.tolist()) == {1, 2}
    # temperature 0 is greedy; a low temperature sharpens.
    assert pick_tokens(scores, u, 0.0, 1.0).eq(0).all()
    cold = pick_tokens(scores, u, 0.25, 1.0)
    assert (cold == 0).float().mean() > 0.95


def test_seeded_samples_do_not_depend_on_batching(sampler):
    params = SamplingParams(max_new_tokens=12)
    a = sampler.sample(PROMPTS, 3, params, seeds=[11, 22, 33])
    b = sampler.sample(PROMPTS[::-1], 3, params, seeds=[33, 22, 11])  # other order, other batches
    sampler.batch_size = 3  # one prompt per generate call
    try:
        c = sampler.sample(PROMPTS[1:2], 3, params, seeds=[22])
    finally:
        sampler.batch_size = 16
    assert a[0] == b[2] and a[2] == b[0] and a[1] == b[1] == c[0]
    # The n samples of a prompt differ (a random model over 512 tokens: collisions are ~impossible).
    assert len({x.text for x in a[0]}) == 3
    d = sampler.sample(PROMPTS, 3, params, seeds=[12, 22, 33])
    assert d[0] != a[0] and d[1] == a[1]


def test_shared_prefill_gives_the_same_samples(sampler):
    params = SamplingParams(max_new_tokens=10, seed=5)
    a = sampler.sample(PROMPTS, 4, params)
    sampler.share_prefix = False
    try:
        b = sampler.sample(PROMPTS, 4, params)
    finally:
        sampler.share_prefix = True
    assert a == b


def test_token_counts_and_finish_reasons(sampler, tiny_model_dir):
    tok = sampler.tokenizer
    params = SamplingParams(max_new_tokens=9, seed=0)
    out = sampler.sample(PROMPTS, 2, params)
    for prompt, comps in zip(PROMPTS, out):
        n_prompt = len(tok(prompt, add_special_tokens=False)["input_ids"])
        for c in comps:
            assert c.prompt_tokens == n_prompt
            assert (c.finish_reason == "length") == (c.completion_tokens == 9) or c.finish_reason == "stop"
            assert 1 <= c.completion_tokens <= 9
    # Force a stop: with greedy decoding, make the first greedy token the stop token.
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    first = sampler.sample(PROMPTS[:1], 1, greedy)[0][0]
    first_id = tok(first.text, add_special_tokens=False)["input_ids"][0]
    stopper = HFSampler(sampler.model, tokenizer=tok, stop_token_ids=[first_id])
    c = stopper.sample(PROMPTS[:1], 2, greedy)[0]
    assert all(x.finish_reason == "stop" and x.completion_tokens == 1 and x.text == "" for x in c)


def test_unseeded_sampling_still_works(sampler):
    out = sampler.sample(PROMPTS[:2], 2, SamplingParams(max_new_tokens=4))
    assert [len(r) for r in out] == [2, 2]


def test_get_sampler_errors():
    with pytest.raises(ValueError, match="unknown sampler backend"):
        get_sampler("tgi", "x")
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(SamplerError, match="pip install"):
            get_sampler("vllm", "some/model")


# ---------------------------------------------------------------- openai backend, real HTTP


class _Flaky(BaseHTTPRequestHandler):
    """A real loopback server: answers 503 to the first `fail` POSTs, then a valid completion."""

    fail = 2
    calls: list[dict] = []

    def log_message(self, *args):
        pass

    def _send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send(200, {"object": "list", "data": [{"id": "flaky-model", "object": "model"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        type(self).calls.append(body)
        if len(type(self).calls) <= type(self).fail:
            return self._send(503, {"error": "warming up"})
        n = body["n"]
        self._send(200, {"choices": [{"index": j, "text": f"{body['prompt']}#{j}",
                                      "finish_reason": "stop"} for j in reversed(range(n))],
                         "usage": {"prompt_tokens": 4, "completion_tokens": 7}})


@pytest.fixture()
def flaky_server():
    _Flaky.calls = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_openai_retries_5xx_then_parses(flaky_server):
    s = get_sampler("openai", None, base_url=flaky_server, max_retries=3,
                    concurrency=1)
    assert s.model == "flaky-model"  # asked /v1/models
    out = s.sample(["a"], 3, SamplingParams(max_new_tokens=5, temperature=0.7), seeds=[9])
    assert [c.text for c in out[0]] == ["a#0", "a#1", "a#2"]  # ordered by index
    assert sum(c.completion_tokens for c in out[0]) == 7 and out[0][0].prompt_tokens == 4
    assert len(_Flaky.calls) == 3  # two 503s, then success
    last = _Flaky.calls[-1]
    assert last["seed"] == 9 and last["n"] == 3 and last["max_tokens"] == 5
    assert last["temperature"] == 0.7 and last["model"] == "flaky-model"


def test_openai_gives_up_with_the_url(flaky_server):
    _Flaky.fail = 100
    try:
        s = get_sampler("openai", "m", base_url=flaky_server, max_retries=1)
        with pytest.raises(SamplerError, match="HTTP 503") as err:
            s.sample(["a"], 1, SamplingParams(max_new_tokens=2))
        assert flaky_server in str(err.value)
    finally:
        _Flaky.fail = 2


def test_openai_unreachable_names_the_url():
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(SamplerError, match="unreachable") as err:
        get_sampler("openai", None, base_url=url, max_retries=1)
    assert url in str(err.value)


def test_completion_text_keeps_special_tokens(sampler, monkeypatch):
    # gpt-oss's and DeepSeek's call delimiters are special tokens: the sampler must not drop
    # them, or a call would read as prose. The final end token is still not part of the text.
    import pivotrl.sampling.hf as hf
    from pivotrl.sampling.generate import Generated

    tok = sampler.tokenizer
    special = tok.convert_tokens_to_ids(tok.all_special_tokens[0])
    word = tok("hello", add_special_tokens=False)["input_ids"]
    end = sampler.stop_token_ids[0]
    fake = [[Generated(tokens=word + [special] + word + [end], finish_reason="stop")]]
    monkeypatch.setattr(hf, "generate", lambda *a, **k: fake)
    text = sampler.sample(["hi"], 1, SamplingParams(max_new_tokens=8, seed=0))[0][0].text
    assert tok.all_special_tokens[0] in text and text.count("hello") == 2
    assert not text.endswith(tok.convert_ids_to_tokens(end))
