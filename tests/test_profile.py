"""Profiling with the tiny model: statistics against a direct computation, kill -9 + resume equals
an uninterrupted run, shards + merge, re-profiling."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pivotrl.formats.chat import prompt_text
from pivotrl.io.records import (
    Message,
    Profile,
    Turn,
    iter_valid,
    read_records,
    stats_path,
)
from pivotrl.io.turn_files import shard_of
from pivotrl.profile.loop import ProfileConfig, turn_seed
from pivotrl.profile.runs import MergeError, merge_profiles, profile_file
from pivotrl.sampling.hf import HFSampler
from pivotrl.scoring import score_completion
from pivotrl.select import outcome
from pivotrl.train.reprofile import ReprofileHook, reprofile
from pivotrl.verifiers import Score, get_verifier, register

TOOLS = [{"type": "function", "function": {
    "name": "get_order", "description": "Look up an order.",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}},
                   "required": ["order_id"]}}}]


@register("test_parity")
class ParityVerifier:
    """Throwaway: reward 1 when the action text has even length (a random model gets mixed
    outcomes); 'easy' turns always pass; content containing 'Z' makes it raise (hostile text)."""

    name = "test_parity"

    def __init__(self, **config):
        self.config = config

    def score(self, turn: Turn, action: Message | None) -> Score:
        if action is None:
            return Score(0.0, False, "unparseable")
        if turn.metadata.get("easy"):
            return Score(1.0, True)
        text = (action.content or "") if isinstance(action.content, str) else ""
        if "Z" in text:
            raise RuntimeError("verifier bug on hostile text")
        return Score(1.0 if len(text) % 2 == 0 else 0.0, True)


def write_turns(path: Path, n: int, bad_lines: bool = False, easy: set[int] = frozenset()) -> Path:
    with path.open("w") as fh:
        for i in range(n):
            fh.write(json.dumps({
                "id": f"traj{i}/1", "trajectory_id": f"traj{i}", "turn": 1,
                "domain": "shop" if i % 2 else "bank", "tools": TOOLS,
                "context": [{"role": "user", "content": f"Where is order O-{i}?" + " fast" * (i % 3)}],
                "expected": {"role": "assistant", "tool_calls": [{"id": "c0", "type": "function",
                             "function": {"name": "get_order",
                                          "arguments": json.dumps({"order_id": f"O-{i}"})}}]},
                "metadata": {"easy": i in easy},
            }) + "\n")
            if bad_lines and i == 1:
                fh.write('{"id": "broken", "turn": \n')
                fh.write(json.dumps({"id": "traj0/1", "trajectory_id": "x", "turn": 1,
                                     "context": [], "expected": {"role": "assistant",
                                                                 "content": "dup"}}) + "\n")
    return path


@pytest.fixture(scope="module")
def sampler(tiny_model_dir):
    return HFSampler(str(tiny_model_dir), batch_size=32)


def samples_by_id(path: Path) -> list[tuple[str, list[tuple[str, float, bool]]]]:
    return [(p.id, [(s.completion, s.reward, s.valid) for s in p.samples])
            for p in iter_valid(path, Profile)]


def test_statistics_match_a_direct_computation(tmp_path, sampler):
    turns_path = write_turns(tmp_path / "turns.jsonl", 6, bad_lines=True)
    out = tmp_path / "profile.jsonl"
    cfg = ProfileConfig(k=4, verifier="test_parity", seed=3, max_new_tokens=10, chunk_turns=4)
    verifier = get_verifier("test_parity")
    doc = profile_file(turns_path, out, sampler, verifier, sampler.tokenizer, cfg, progress=False)

    profiles = list(iter_valid(out, Profile))
    turns = {t.id: t for _, t in read_records(turns_path, Turn)
             if isinstance(t, Turn) and t.trajectory_id != "x"}
    assert [p.id for p in profiles] == [f"traj{i}/1" for i in range(6)]  # input order, dup rejected
    rejects = [json.loads(x) for x in (tmp_path / "profile.rejects.jsonl").read_text().splitlines()]
    assert [r["line"] for r in rejects] == [3, 4] and "duplicate id" in rejects[1]["reason"]

    counts = {"all_fail": 0, "all_pass": 0, "mixed": 0}
    invalid = tokens = 0
    for p in profiles:
        turn = turns[p.id]
        # The samples are exactly what the sampler draws for this turn's derived seed.
        direct = sampler.sample([prompt_text(sampler.tokenizer, turn.context, turn.tools)], 4,
                                cfg.sampling(), seeds=[turn_seed(3, p.id)])[0]
        assert [s.completion for s in p.samples] == [c.text for c in direct]
        rewards = []
        for s in p.samples:
            try:
                want = score_completion(verifier, turn, s.completion)
            except RuntimeError:
                want = Score(0.0, False, "verifier error")
            assert (s.reward, s.valid) == (want.reward, want.valid)
            rewards.append(s.reward)
            invalid += not s.valid
            tokens += s.tokens
            assert 1 <= s.tokens <= 10
        assert p.k == len(p.samples) == 4
        assert p.reward_mean == pytest.approx(statistics.fmean(rewards))
        assert p.reward_std == pytest.approx(statistics.pstdev(rewards))
        counts[outcome(rewards)] += 1
    assert counts["mixed"] > 0  # the parity verifier on random text does give mixed turns
    run = doc["runs"][-1]
    assert run["rollout_turns"] == 24 and run["turns_profiled"] == 6
    assert run["invalid_samples"] == invalid and run["generated_tokens"] == tokens
    assert run["rejected_lines"] == 2
    assert {k: doc["outcomes"][k] for k in counts} == counts
    assert json.loads(stats_path(out).read_text())["totals"]["rollout_turns"] == 24
    # Resuming a finished run profiles nothing and keeps the file as it was.
    before = out.read_bytes()
    again = profile_file(turns_path, out, sampler, verifier, sampler.tokenizer,
                         cfg.model_copy(update={"resume": True}), progress=False)
    assert again["runs"][-1]["turns_profiled"] == 0 and out.read_bytes() == before
    assert again["totals"]["rollout_turns"] == 24 and len(again["runs"]) == 2
    # Other settings on the same output are refused (samples would mix).
    with pytest.raises(ValueError, match="other settings"):
        profile_file(turns_path, out, sampler, verifier, sampler.tokenizer,
                     cfg.model_copy(update={"k": 5, "resume": True}), progress=False)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "pivotrl.cli", "profile", *args]


def test_kill_9_then_resume_equals_an_uninterrupted_run(tmp_path, sampler, tiny_model_dir):
    n = 14
    turns_path = write_turns(tmp_path / "turns.jsonl", n)
    (tmp_path / "cfg.yaml").write_text("chunk_turns: 1\n")
    out = tmp_path / "killed.jsonl"
    cmd = _cli(str(turns_path), "--model", str(tiny_model_dir), "--k", "4", "--verifier", "toolcall",
               "--out", str(out), "--seed", "7", "--max-new-tokens", "12", "--config",
               str(tmp_path / "cfg.yaml"), "--no-progress")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None:
        if out.exists() and out.read_bytes().count(b"\n") >= 3:
            break
        time.sleep(0.02)
    assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    written = out.read_bytes().count(b"\n")
    assert 3 <= written < n
    with out.open("a") as fh:  # as if killed mid-write: a torn last line
        fh.write('{"id": "traj13/1", "trajectory_id": "tr')

    # The same command again (in-process through the CLI app: no second interpreter start-up).
    from typer.testing import CliRunner

    from pivotrl.cli import app

    resumed = CliRunner().invoke(app, cmd[3:] + ["--resume"])
    assert resumed.exit_code == 0, resumed.output[-2000:]
    doc = json.loads(stats_path(out).read_text())
    assert doc["runs"][-1]["turns_done_before"] == written
    assert doc["runs"][-1]["turns_profiled"] == n - written

    whole = tmp_path / "whole.jsonl"
    cfg = ProfileConfig(k=4, verifier="toolcall", seed=7, max_new_tokens=12)
    profile_file(turns_path, whole, sampler, get_verifier("toolcall"), sampler.tokenizer, cfg,
                 progress=False)
    got, want = samples_by_id(out), samples_by_id(whole)
    assert [i for i, _ in got] == [i for i, _ in want] == [f"traj{i}/1" for i in range(n)]
    assert got == want


def test_shards_merge_to_the_unsharded_run_and_catch_missing_or_doubled(tmp_path, sampler):
    turns_path = write_turns(tmp_path / "turns.jsonl", 8)
    verifier = get_verifier("test_parity")
    cfg = ProfileConfig(k=2, verifier="test_parity", seed=1, max_new_tokens=6)
    shards = []
    for i in range(3):
        path = tmp_path / f"p.{i}.jsonl"
        profile_file(turns_path, path, sampler, verifier, sampler.tokenizer,
                     cfg.model_copy(update={"shard": f"{i}/3"}), progress=False)
        ids = [p.id for p in iter_valid(path, Profile)]
        assert all(shard_of(x, 3) == i for x in ids)
        shards.append(path)
    assert sum(len(samples_by_id(s)) for s in shards) == 8
    merged = tmp_path / "merged.jsonl"
    doc = merge_profiles(turns_path, shards, merged)
    whole = tmp_path / "whole.jsonl"
    profile_file(turns_path, whole, sampler, verifier, sampler.tokenizer, cfg, progress=False)
    assert samples_by_id(merged) == samples_by_id(whole)
    assert doc["totals"]["rollout_turns"] == 16 and doc["outcomes"]["turns"] == 8

    with pytest.raises(MergeError, match="missing"):
        merge_profiles(turns_path, shards[:2], tmp_path / "m2.jsonl")
    with pytest.raises(MergeError, match="doubled"):
        merge_profiles(turns_path, shards + [shards[0]], tmp_path / "m3.jsonl")
    assert not (tmp_path / "m2.jsonl").exists() and not (tmp_path / "m3.jsonl").exists()

    from typer.testing import CliRunner

    from pivotrl.cli import app

    res = CliRunner().invoke(app, ["profile", str(turns_path), "--merge", "--out",
                                   str(tmp_path / "m4.jsonl"), str(shards[0]), str(shards[1])])
    assert res.exit_code == 1 and not (tmp_path / "m4.jsonl").exists()


def test_shard_assignment_is_stable():
    # Fixed values: a scheduler on another machine/Python must cut the same shards.
    assert [shard_of(f"traj{i}/1", 4) for i in range(6)] == [3, 1, 2, 0, 3, 3]


def test_reprofile_drops_turns_that_became_all_pass(tmp_path, sampler):
    turns = list(iter_valid(write_turns(tmp_path / "t.jsonl", 6, easy={1, 4}), Turn))
    verifier = get_verifier("test_parity")
    # seed 1: a draw where some easy turn's 4 samples all parse (a JSON call cut short is invalid)
    kept, counts = reprofile(turns, sampler, verifier, sampler.tokenizer,
                             ProfileConfig(k=4, max_new_tokens=6, seed=1))
    # Easy turns pass whenever the sample parses; those whose 4 samples all parse are dropped.
    assert counts["before"] == 6 and counts["all_pass"] >= 1
    assert counts["after"] == len(kept) == 6 - counts["all_pass"]
    assert all(outcome([s.reward for s in p.samples]) != "all_pass" for p in kept)

    # The hook fires when the batch reward saturates, at most once every 3 steps.
    # As the training helper builds it: a ProfileConfig, the verifier by name.
    hook2 = ReprofileHook(threshold=0.8, every_n_steps=3,
                          profile=ProfileConfig(verifier="test_parity", k=2, max_new_tokens=4))
    assert hook2.profile.sampling().max_new_tokens == 4 and isinstance(hook2.verifier, ParityVerifier)
    decisions = []
    for r in (0.5, 0.9, 0.95, 0.9, 0.2, 0.9):
        go = hook2.should_run(r)
        decisions.append(go)
        if go:
            sampler.model.train()  # as inside a training loop
            left = hook2.run(sampler.model, sampler.tokenizer, turns)
            assert sampler.model.training  # mode restored
            assert len(left) < len(turns)
    sampler.model.eval()
    assert decisions == [False, True, False, False, False, True]
    assert [h["step"] for h in hook2.history] == [2, 6]
