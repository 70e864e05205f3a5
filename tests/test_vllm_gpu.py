"""The vllm backend with the real engine (a CUDA machine with vLLM installed; skipped elsewhere):
engine options reach vLLM, and an over-long prompt is set aside and reported, on a run and on its
resume, instead of failing the chunk."""

from __future__ import annotations

import json

import pytest

from pivotrl.io.records import Profile, iter_valid, rejects_path
from pivotrl.profile.loop import ProfileConfig
from pivotrl.profile.runs import profile_file


@pytest.mark.gpu
def test_vllm_engine_options_and_over_long_prompts(tmp_path, tiny_model_dir):
    pytest.importorskip("vllm")
    from pivotrl.sampling import get_sampler
    from pivotrl.verifiers import get_verifier

    sampler = get_sampler("vllm", str(tiny_model_dir), max_model_len=256, dtype="float32",
                          gpu_memory_utilization=0.3, enable_prefix_caching=True,
                          extra={"enforce_eager": True})
    assert sampler.max_model_len == 256
    turns = tmp_path / "turns.jsonl"
    turns.write_text("".join(json.dumps({
        "id": f"t{i}/1", "trajectory_id": f"t{i}", "turn": 1, "tools": [],
        "context": [{"role": "user", "content": "hi" + " and more" * (400 * (i == 1))}],
        "expected": {"role": "assistant", "content": "ok"}}) + "\n" for i in range(3)))
    out = tmp_path / "p.jsonl"
    cfg = ProfileConfig(k=4, max_new_tokens=8, verifier="exact")
    doc = profile_file(turns, out, sampler, get_verifier("exact"), sampler.tokenizer, cfg,
                       progress=False)
    assert [p.id for p in iter_valid(out, Profile)] == ["t0/1", "t2/1"]
    assert list(doc["runs"][-1]["too_long"]) == ["t1/1"]
    assert [json.loads(line)["line"] for line in rejects_path(out).open()] == [2]
    again = profile_file(turns, out, sampler, get_verifier("exact"), sampler.tokenizer, cfg,
                         progress=False)
    assert again["runs"][-1]["turns_profiled"] == 0
