"""The openai backend against a real HTTP server on loopback: `pivotrl serve` (a subprocess) serving
the tiny model. Profile through it and compare with profiling in-process; then stop it."""

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


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pivotrl.cli", "serve", "--model", str(tiny_model_dir),
         "--port", str(port), "--served-model-name", "tiny"],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.time() + 180
    while True:
        if proc.poll() is not None:
            pytest.fail("pivotrl serve exited: " + proc.stderr.read().decode()[-2000:])
        try:
            if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.time() > deadline:
            proc.kill()
            pytest.fail("pivotrl serve did not come up in 180 s")
        time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(timeout=30)


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
    bad = httpx.post(f"{server}/completions", json={"prompt": "x", "n": 0}, timeout=30)
    assert bad.status_code == 422


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
