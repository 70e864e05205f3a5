"""One train/eval split everywhere: `extract --eval-fraction` records it (TURNS.split.json), and
every later stage applies it — the trainers (PivotRL, SFT, E2E RL) never see an eval trajectory,
`evaluate --turns` scores only eval ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pivotrl.extract import ExtractOptions, extract_file
from pivotrl.io.records import Trajectory, Turn, iter_valid
from pivotrl.io.split import HeldOut, find_split, read_split, resolve_split, split_path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "trajectories.jsonl"


@pytest.fixture
def extracted(tmp_path):
    """examples/ extracted with a fifth held out, whole rows (so the two files can be joined)."""
    turns = tmp_path / "turns.jsonl"
    summary = extract_file(EXAMPLE, turns, ExtractOptions(eval_fraction=0.2, seed=0, compact=False))
    return turns, tmp_path / "turns.eval.jsonl", summary


def test_extract_records_both_sides_of_the_split(extracted):
    turns, eval_turns, summary = extracted
    split = read_split(split_path(turns))
    assert summary.split_file == str(split_path(turns))
    ids = [t.id for t in iter_valid(EXAMPLE, Trajectory)]
    assert sorted(split.train + split.eval) == sorted(ids) and not set(split.train) & set(split.eval)
    assert len(split.eval) == summary.trajectories_eval > 0
    assert {t.trajectory_id for t in iter_valid(eval_turns, Turn)} == set(split.eval)
    assert {t.trajectory_id for t in iter_valid(turns, Turn)} <= set(split.train)
    assert (split.fraction, split.seed, split.source) == (0.2, 0, str(EXAMPLE))


def test_no_split_file_without_held_out_trajectories(tmp_path):
    extract_file(EXAMPLE, tmp_path / "t.jsonl", ExtractOptions())
    assert not split_path(tmp_path / "t.jsonl").exists()


def test_the_sft_baseline_never_trains_on_an_eval_trajectory(extracted, tiny_model_dir, monkeypatch):
    import pivotrl.train.sft as sft
    from pivotrl.train.config import SFTRunConfig

    turns, _, _ = extracted
    split = read_split(split_path(turns))
    trained: list[str] = []
    real = sft.tokenize_trajectory

    def spy(tokenizer, traj, *args, **kwargs):
        trained.append(traj.id)
        return real(tokenizer, traj, *args, **kwargs)

    class Stop(Exception):
        pass

    def no_training(*args, **kwargs):
        raise Stop

    monkeypatch.setattr(sft, "tokenize_trajectory", spy)
    monkeypatch.setattr(sft, "build_sft_trainer", no_training)
    cfg = SFTRunConfig(data=EXAMPLE, split=split_path(turns), model=str(tiny_model_dir),
                       output_dir=turns.parent / "sft", max_length=None)
    with pytest.raises(Stop):
        sft.train_sft(cfg)
    assert set(trained) == set(split.train)  # every train trajectory, no eval one
    assert not set(trained) & set(split.eval)


def test_pivotrl_drops_pivots_of_eval_trajectories_found_beside_the_file(extracted):
    from pivotrl.train.config import GRPORunConfig
    from pivotrl.train.grpo import load_pivot_set

    turns, eval_turns, _ = extracted
    mixed = turns.parent / "pivots.jsonl"  # a pivots file that wrongly holds eval turns too
    mixed.write_text(turns.read_text() + eval_turns.read_text())
    n_eval = sum(1 for _ in iter_valid(eval_turns, Turn))
    held_out = HeldOut(resolve_split(None, [mixed]))  # turns.split.json is the one in the folder
    cfg = GRPORunConfig(pivots=mixed, model="m", output_dir=turns.parent / "out")
    kept = load_pivot_set(cfg, held_out)
    assert held_out.dropped == n_eval > 0
    assert not {t.trajectory_id for t in kept} & set(held_out.split.eval)
    assert len(kept) == sum(1 for _ in iter_valid(turns, Turn))


def test_the_e2e_baseline_drops_eval_tasks_and_tasks_without_a_world(extracted):
    from pivotrl_testbed.e2e import E2ERunConfig, load_tasks

    turns, _, _ = extracted
    split = read_split(split_path(turns))
    cfg = E2ERunConfig(tasks=EXAMPLE, split=split_path(turns), model="m", output_dir=turns.parent / "e2e")
    tasks, dropped = load_tasks(cfg)
    ids = {t.id for t in tasks}
    assert ids and not ids & set(split.eval)
    weather = {i for i in split.train if i.startswith("weather")}  # no registered world
    assert ids == set(split.train) - weather and dropped["no_world"] == len(weather)


def test_evaluate_scores_only_held_out_turns(extracted, tiny_model_dir):
    from transformers import AutoTokenizer

    from pivotrl.evaluate.turns import TurnEvalConfig, evaluate_turns_file
    from pivotrl.sampling.base import Completion
    from pivotrl.verifiers import get_verifier

    class Silent:
        name = "silent"

        def sample(self, prompts, n, params, seeds=None):
            return [[Completion("no action", 2, 1, "stop")] * n for _ in prompts]

    turns, eval_turns, _ = extracted
    split = read_split(split_path(turns))
    both = turns.parent / "all.jsonl"
    both.write_text(turns.read_text() + eval_turns.read_text())
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = TurnEvalConfig(max_new_tokens=4)
    result = evaluate_turns_file(both, turns.parent / "r.json", Silent(), get_verifier("toolcall"), tok,
                                 cfg, split=split)
    n_eval = sum(1 for _ in iter_valid(eval_turns, Turn))
    assert result["turns"] == n_eval and result["split"]["turns_not_held_out"] == sum(1 for _ in iter_valid(turns, Turn))
    with pytest.raises(ValueError, match="eval trajectory"):  # the train file: nothing held out in it
        evaluate_turns_file(turns, turns.parent / "r2.json", Silent(), get_verifier("toolcall"), tok,
                            cfg, split=split)


def test_find_split_prefers_its_own_and_refuses_to_guess(tmp_path):
    data = tmp_path / "a.jsonl"
    assert find_split(data) is None
    (tmp_path / "x.split.json").write_text("{}")
    assert find_split(data) == tmp_path / "x.split.json"
    (tmp_path / "y.split.json").write_text("{}")
    with pytest.raises(ValueError, match="--split"):
        find_split(data)
    (tmp_path / "a.split.json").write_text("{}")
    assert find_split(data) == tmp_path / "a.split.json"
    with pytest.raises(ValueError, match="not a split"):
        read_split(tmp_path / "a.split.json")
    (tmp_path / "b.split.json").write_text(json.dumps({"fraction": 0.5, "seed": 1, "eval": ["t"]}))
    assert read_split(tmp_path / "b.split.json").eval_ids() == {"t"}
