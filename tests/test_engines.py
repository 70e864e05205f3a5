"""Engine options reach the engines: vLLM's (through a stand-in `vllm` module: no GPU here) and the
openai backend's headers, extra_body and API key from the environment (a real loopback server)."""

from __future__ import annotations

import importlib.machinery
import json
import sys
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from pydantic import ValidationError

from pivotrl.sampling import SamplerError, SamplingParams, get_sampler


class _Tokenizer:
    """One token per character; a BOS (id 1) only when special tokens are added."""

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": ([1] if add_special_tokens else []) + [ord(c) for c in text]}


def fake_vllm(monkeypatch, max_model_len=16):
    calls: dict = {}

    class LLM:
        def __init__(self, model, **kwargs):
            calls["init"] = {"model": model, **kwargs}
            cfg = types.SimpleNamespace(max_model_len=kwargs.get("max_model_len") or max_model_len)
            self.llm_engine = types.SimpleNamespace(model_config=cfg)

        def get_tokenizer(self):
            return _Tokenizer()

        def generate(self, prompts, params, use_tqdm=False):
            calls["prompts"], calls["params"] = prompts, params
            out = []
            for p, sp in zip(prompts, params):
                outs = [types.SimpleNamespace(text=f"s{sp.seed}#{j}", token_ids=[5, 6],
                                              finish_reason="stop") for j in range(sp.n)]
                out.append(types.SimpleNamespace(outputs=outs))
            return out

    module = types.ModuleType("vllm")
    module.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    module.LLM, module.SamplingParams = LLM, lambda **kw: types.SimpleNamespace(**kw)
    monkeypatch.setitem(sys.modules, "vllm", module)
    return calls


def test_vllm_engine_options_reach_the_engine(monkeypatch):
    calls = fake_vllm(monkeypatch)
    s = get_sampler("vllm", "m", tensor_parallel_size=2, max_model_len=12, dtype="bfloat16",
                    gpu_memory_utilization=0.5, enable_prefix_caching=False, batch_size=8,
                    extra={"enforce_eager": True})
    assert calls["init"] == {"model": "m", "tensor_parallel_size": 2, "max_model_len": 12,
                             "gpu_memory_utilization": 0.5, "dtype": "bfloat16",
                             "enable_prefix_caching": False, "enforce_eager": True}
    assert s.max_model_len == 12 and s.max_prompt_tokens() == 11
    out = s.sample(["ab", "c"], 2, SamplingParams(max_new_tokens=3), seeds=[4, 5])
    assert [c.text for c in out[1]] == ["s5#0", "s5#1"] and out[0][0].prompt_tokens == 2
    # token ids without an added BOS: the template's text is the whole prompt
    assert calls["prompts"] == [{"prompt_token_ids": [97, 98]}, {"prompt_token_ids": [99]}]
    assert [p.max_tokens for p in calls["params"]] == [3, 3]
    defaults = fake_vllm(monkeypatch)
    get_sampler("vllm", "m")
    assert defaults["init"]["enable_prefix_caching"] is True and "max_model_len" not in defaults["init"]


def test_vllm_rejects_unknown_options_and_long_prompts(monkeypatch):
    fake_vllm(monkeypatch, max_model_len=4)
    with pytest.raises(ValidationError):
        get_sampler("vllm", "m", tensor_paralel_size=2)  # a typo is an error
    with pytest.raises(ValidationError):
        get_sampler("vllm", "m", gpu_memory_utilization=1.5)
    s = get_sampler("vllm", "m")
    with pytest.raises(SamplerError, match="max_model_len=4"):
        s.sample(["ok", "much too long"], 1, SamplingParams())


class _Recorder(BaseHTTPRequestHandler):
    seen: list = []

    def log_message(self, *args):
        pass

    def _send(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        type(self).seen.append(("GET", dict(self.headers), None))
        self._send({"object": "list", "data": [{"id": "served", "max_model_len": 4096}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        type(self).seen.append(("POST", dict(self.headers), body))
        self._send({"choices": [{"index": j, "text": "x", "finish_reason": "stop"}
                                for j in range(body["n"])],
                    "usage": {"prompt_tokens": 2, "completion_tokens": body["n"]}})


@pytest.fixture()
def recorder():
    _Recorder.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_openai_headers_extra_body_and_key_from_the_environment(recorder, monkeypatch):
    monkeypatch.setenv("MY_GATEWAY_KEY", "sk-test-123")
    s = get_sampler("openai", None, base_url=recorder, api_key_env="MY_GATEWAY_KEY",
                    headers={"X-Route": "pool-a"}, extra_body={"top_k": 20, "min_p": 0.1})
    assert s.model == "served" and s.max_prompt_tokens() == 4095  # from the model card
    s.sample(["p"], 2, SamplingParams(max_new_tokens=3), seeds=[1])
    method, headers, body = _Recorder.seen[-1]
    headers = {k.lower(): v for k, v in headers.items()}
    assert headers["authorization"] == "Bearer sk-test-123" and headers["x-route"] == "pool-a"
    assert (body["top_k"], body["min_p"], body["n"], body["max_tokens"]) == (20, 0.1, 2, 3)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-default")
    get_sampler("openai", "served", base_url=recorder).sample(["p"], 1, SamplingParams())
    assert {k.lower(): v for k, v in _Recorder.seen[-1][1].items()}["authorization"] == "Bearer sk-default"
    with pytest.raises(SamplerError, match="NOT_SET_ANYWHERE"):
        get_sampler("openai", "served", base_url=recorder, api_key_env="NOT_SET_ANYWHERE")


def test_profile_cli_passes_engine_options_and_reports_long_prompts(tmp_path, monkeypatch,
                                                                     tiny_model_dir):
    from transformers import AutoTokenizer
    from typer.testing import CliRunner

    from pivotrl.cli import app

    calls = fake_vllm(monkeypatch)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    monkeypatch.setattr(sys.modules["vllm"].LLM, "get_tokenizer", lambda self: tokenizer)
    turns = tmp_path / "turns.jsonl"
    turns.write_text("".join(json.dumps({
        "id": f"t{i}/1", "trajectory_id": f"t{i}", "turn": 1, "tools": [],
        "context": [{"role": "user", "content": "hi" + " and more" * (300 * (i == 1))}],
        "expected": {"role": "assistant", "content": "ok"}}) + "\n" for i in range(3)))
    out = tmp_path / "p.jsonl"
    args = ["profile", str(turns), "--model", str(tiny_model_dir), "--backend", "vllm",
            "--out", str(out), "--k", "2", "--verifier", "exact", "--max-new-tokens", "4",
            "--tensor-parallel-size", "2", "--max-model-len", "256", "--no-prefix-caching",
            "--dtype", "bfloat16", "--no-progress"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert {k: calls["init"][k] for k in ("tensor_parallel_size", "max_model_len",
                                          "enable_prefix_caching", "dtype")} == {
        "tensor_parallel_size": 2, "max_model_len": 256, "enable_prefix_caching": False,
        "dtype": "bfloat16"}
    assert len(out.read_text().splitlines()) == 2  # t1's prompt is longer than 256 tokens
    assert "prompts too long" in r.output
    again = CliRunner().invoke(app, args + ["--resume"])  # a resume does not trip on it either
    assert again.exit_code == 0, again.output
    bad = CliRunner().invoke(app, [*args[:6], "--out", str(tmp_path / "q.jsonl"), "--backend",
                                   "hf", "--header", "X: y"])
    # refused before anything loads, as a misused flag (exit 2): the hf backend would ignore it
    assert bad.exit_code == 2 and "do not apply to --backend hf" in " ".join(bad.output.split())
