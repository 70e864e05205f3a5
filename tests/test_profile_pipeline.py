"""Profiling keeps the engine busy and whole: chunk i+1 is sampled while chunk i is scored, and a
prompt longer than the engine's context is set aside and reported (rejects file), not a crash,
on the first run and on a resume."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from pivotrl.io.records import Profile, Turn, iter_valid, rejects_path
from pivotrl.profile.loop import ProfileConfig
from pivotrl.profile.runs import profile_file
from pivotrl.sampling.base import Completion
from pivotrl.sampling.hf import HFSampler
from pivotrl.sampling.pipeline import prefetch
from pivotrl.verifiers.base import Score


def write_turns(path: Path, n: int, long_ids: set[int] = frozenset()) -> Path:
    with path.open("w") as fh:
        for i in range(n):
            text = f"Where is order O-{i}?" + (" very long" * 400 if i in long_ids else "")
            fh.write(json.dumps({
                "id": f"t{i}/1", "trajectory_id": f"t{i}", "turn": 1, "tools": [],
                "context": [{"role": "user", "content": text}],
                "expected": {"role": "assistant", "content": "ok"}}) + "\n")
    return path


class ScriptedSampler:
    """Answers 'ok' k times per prompt; reports when each sample() call starts."""

    name = "scripted"

    def __init__(self, tokenizer, limit: int | None = None):
        self.tokenizer, self.limit = tokenizer, limit
        self.calls: list[int] = []
        self.started = [threading.Event() for _ in range(16)]

    def max_prompt_tokens(self):
        return self.limit

    def sample(self, prompts, n, params, seeds=None):
        self.started[len(self.calls)].set()
        self.calls.append(len(prompts))
        return [[Completion("ok", 3, 1, "stop") for _ in range(n)] for _ in prompts]


class WaitingVerifier:
    """Scoring the first chunk waits for the sampler to start on the second one."""

    name = "waiting"

    def __init__(self, sampler: ScriptedSampler):
        self.sampler, self.overlapped = sampler, None

    def score(self, turn: Turn, action) -> Score:
        if self.overlapped is None:
            self.overlapped = self.sampler.started[1].wait(timeout=30)
        return Score(1.0, True)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return HFSampler(str(tiny_model_dir)).tokenizer


def test_the_next_chunk_is_sampled_while_this_one_is_scored(tmp_path, tokenizer):
    turns = write_turns(tmp_path / "turns.jsonl", 6)
    sampler = ScriptedSampler(tokenizer)
    verifier = WaitingVerifier(sampler)
    cfg = ProfileConfig(k=2, chunk_turns=2, max_new_tokens=4)
    profile_file(turns, tmp_path / "p.jsonl", sampler, verifier, tokenizer, cfg, progress=False)
    assert verifier.overlapped is True  # chunk 2's sampling began before chunk 1's scoring ended
    got = [p.id for p in iter_valid(tmp_path / "p.jsonl", Profile)]
    assert got == [f"t{i}/1" for i in range(6)] and sampler.calls == [2, 2, 2]


def test_prefetch_keeps_order_and_raises_where_it_failed():
    assert list(prefetch(lambda x: x * 2, range(5))) == [0, 2, 4, 6, 8]
    assert list(prefetch(lambda x: x, [])) == []

    def fail_on_3(x):
        if x == 3:
            raise ValueError("bad chunk 3")
        return x

    seen = []
    with pytest.raises(ValueError, match="bad chunk 3"):
        for x in prefetch(fail_on_3, range(6)):
            seen.append(x)
    assert seen == [0, 1, 2]


def test_over_long_prompts_are_set_aside_and_reported(tmp_path, tokenizer):
    turns = write_turns(tmp_path / "turns.jsonl", 5, long_ids={1, 3})
    sampler = ScriptedSampler(tokenizer, limit=200)
    cfg = ProfileConfig(k=2, chunk_turns=2, max_new_tokens=4)
    out = tmp_path / "p.jsonl"
    from pivotrl.verifiers import get_verifier

    verifier = get_verifier("exact")
    doc = profile_file(turns, out, sampler, verifier, tokenizer, cfg, progress=False)
    assert [p.id for p in iter_valid(out, Profile)] == ["t0/1", "t2/1", "t4/1"]
    run = doc["runs"][-1]
    assert sorted(run["too_long"]) == ["t1/1", "t3/1"] and all(n > 200 for n in run["too_long"].values())
    rejects = [json.loads(line) for line in rejects_path(out).open()]
    assert [(r["line"], r["field"]) for r in rejects] == [(2, "context"), (4, "context")]
    assert "longer than the engine takes (200)" in rejects[0]["reason"]
    assert sum(sampler.calls) == 3  # the long prompts never reached the engine
    again = profile_file(turns, out, sampler, verifier, tokenizer, cfg.model_copy(update={"resume": True}),
                         progress=False)
    assert sorted(again["runs"][-1]["too_long"]) == ["t1/1", "t3/1"]
    assert again["runs"][-1]["turns_profiled"] == 0 and sum(sampler.calls) == 3
