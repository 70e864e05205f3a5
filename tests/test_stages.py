"""Further pretraining stages: a recipe one can rebuild from scratch or start from a kept build."""

from __future__ import annotations

import hashlib
import json

import pytest
from pydantic import ValidationError

from pivotrl_testbed.testbed import build as build_mod
from pivotrl_testbed.testbed import mixture, shipped
from pivotrl_testbed.testbed.build import TestbedConfig, build_testbed, load_testbed_config
from pivotrl_testbed.testbed.pretrain import PretrainConfig
from pivotrl_testbed.testbed.stages import PretrainStage, stage_config

STAGE_DATA = {"weak_seed": 5, "weak_task_start": 200_000}


def staged(cfg: TestbedConfig, n: int = 1) -> TestbedConfig:
    stages_ = [PretrainStage(data={**STAGE_DATA, "weak_seed": 5 + i}, pretrain=PretrainConfig(
        steps=10, warmup=2, threads=1, tokens_per_batch=1024, seed=3 + i, lr=3e-4)) for i in range(n)]
    return cfg.model_copy(update={"pretrain_stages": stages_})


def unmeasured(monkeypatch) -> None:
    """Builds in these tests skip measuring the base (seconds each): their weights are the point."""
    import pivotrl_testbed.evaluate

    monkeypatch.setattr(pivotrl_testbed.evaluate, "evaluate_model", lambda *a, **k: {})
    monkeypatch.setattr(build_mod, "position_success", lambda *a, **k: {})


def weights(build_dir) -> str:
    return hashlib.sha256((build_dir / "base" / "model.safetensors").read_bytes()).hexdigest()


def ids(path) -> list[str]:
    return [json.loads(line)["id"] for line in path.read_text().splitlines()]


def test_a_stage_changes_the_mixture_and_nothing_else():
    with pytest.raises(ValidationError, match=r"cannot change \['model', 'vocab_size'\]"):
        PretrainStage(data={"model": {}, "vocab_size": 10, "weak_seed": 2})
    cfg = staged(TestbedConfig().quick())
    assert cfg.with_stages(0).digest() == TestbedConfig().quick().digest()  # no stages, old hash
    assert cfg.digest() != cfg.with_stages(0).digest()
    mix = stage_config(cfg, 0)
    assert (mix.weak_seed, mix.weak_task_start) == (5, 200_000)
    assert mix.model == cfg.model and mix.vocab_size == cfg.vocab_size and not mix.pretrain_stages
    bad = {**cfg.model_dump(), "pretrain_stages": [{"data": {"variant_own_share": 1.5}}]}
    with pytest.raises(ValidationError, match="(?s)stage 1.*variant_own_share.*less than 1"):
        TestbedConfig.model_validate(bad)  # a stage's mixture is checked with the config


def test_the_candidate_configs_with_stages_start_from_their_kept_builds():
    for name, kept in (("s", "r3"), ("s2", "r3"), ("t", "r3")):
        cfg = load_testbed_config(f"docs/results/candidates/{name}/config.yaml")
        assert cfg.pretrain_stages, name
        record = json.loads(open(f"docs/results/candidates/{kept}/build.json").read())
        assert cfg.with_stages(0).digest() == record["config_hash"], name


def test_a_staged_build_from_a_kept_first_stage_equals_one_from_scratch(quick_testbed, tmp_path,
                                                                         monkeypatch):
    built, _ = quick_testbed
    unmeasured(monkeypatch)
    cfg = staged(TestbedConfig().quick())
    kept = build_testbed(tmp_path / "kept", cfg, base_from=built)
    assert kept["base_source"].startswith(f"continued from {built}")
    assert weights(tmp_path / "kept") != weights(built)  # the stage trained on
    stage = kept["pretrain_stages"][0]
    assert stage["steps"] == 10 and stage["data"] == STAGE_DATA
    assert set(stage["world_lists"]) == set(cfg.worlds)
    fresh = ids(tmp_path / "kept" / "pretrain" / "stage1" / "toolshop.jsonl")
    assert len(fresh) == cfg.n_weak and not set(fresh) & set(ids(built / "pretrain" / "toolshop.jsonl"))
    assert not list((tmp_path / "kept" / "pretrain").glob("state*.pt"))
    shipped.ship(tmp_path / "kept", tmp_path / "root")  # its stage was trained here: shippable

    # From scratch, killed as its stage starts: the rerun resumes, not repeats, the first stage.
    real = mixture.stage_mixture
    monkeypatch.setattr(mixture, "stage_mixture", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("killed")))
    with pytest.raises(RuntimeError, match="killed"):
        build_testbed(tmp_path / "scratch", cfg, use_shipped_base=False)
    assert (tmp_path / "scratch" / "pretrain" / "state.pt").is_file()
    monkeypatch.setattr(mixture, "stage_mixture", real)
    scratch = build_testbed(tmp_path / "scratch", cfg, use_shipped_base=False)
    assert scratch["base_source"] == "pretrained"
    assert scratch["pretrain"]["resumed_from"] == cfg.pretrain.steps
    assert weights(tmp_path / "scratch") == weights(tmp_path / "kept")


def test_a_kept_staged_build_is_continued_by_a_config_with_more_stages(quick_testbed, tmp_path,
                                                                       monkeypatch):
    built, _ = quick_testbed
    unmeasured(monkeypatch)
    one, two = staged(TestbedConfig().quick()), staged(TestbedConfig().quick(), 2)
    first = build_testbed(tmp_path / "one", one, base_from=built)
    chained = build_testbed(tmp_path / "chained", two, base_from=tmp_path / "one")
    assert chained["base_source"].startswith(f"continued from {tmp_path / 'one'}")
    assert "1 further stages" in chained["base_source"]
    assert chained["pretrain_stages"][0] == first["pretrain_stages"][0]
    assert [s["data"]["weak_seed"] for s in chained["pretrain_stages"]] == [5, 6]
    assert not (tmp_path / "chained" / "pretrain" / "stage1").exists()  # only the new stage ran
    direct = build_testbed(tmp_path / "direct", two, base_from=built)
    assert weights(tmp_path / "direct") == weights(tmp_path / "chained") != weights(tmp_path / "one")


def test_a_build_continues_from_the_shipped_base_its_first_stages_are(quick_testbed, tmp_path,
                                                                      monkeypatch):
    """The default's last stage continues from S2's shipped weights, so a build whose later
    stages differ from the default's starts from those weights, not from scratch."""
    built, _ = quick_testbed
    unmeasured(monkeypatch)
    shipped.ship(built, tmp_path / "s2")
    monkeypatch.setattr(shipped, "SHIPPED", tmp_path / "nothing_shipped")
    monkeypatch.setattr(shipped, "SHIPPED_S2", tmp_path / "s2")
    cfg = staged(TestbedConfig().quick())
    got = build_testbed(tmp_path / "continued", cfg)
    assert got["base_source"].startswith(f"continued from {tmp_path / 's2'}")
    assert "1 further stages" in got["base_source"]
    direct = build_testbed(tmp_path / "direct", cfg, base_from=built)
    assert weights(tmp_path / "continued") == weights(tmp_path / "direct") != weights(built)
    assert build_testbed(tmp_path / "scratch", cfg, use_shipped_base=False)["base_source"] == "pretrained"


def test_base_from_a_build_that_is_neither_this_config_nor_a_prefix_of_it_stops(quick_testbed, tmp_path):
    built, _ = quick_testbed
    other = staged(TestbedConfig().quick().model_copy(update={"ood_repeat": 3}))
    with pytest.raises(ValueError, match="--base-from .*config hash"):
        build_testbed(tmp_path / "other", other, base_from=built)


def test_weak_kinds_draw_the_first_tasks_of_those_kinds():
    from pivotrl_testbed.testbed.tasks import make_tasks

    some = make_tasks("toolshop", "train", 10, 200_000, ["swap", "return"])
    every = make_tasks("toolshop", "train", 80, 200_000)
    assert [t.id for t in some] == [t.id for t in every if t.metadata["task"]["kind"] in ("swap", "return")][:10]
    with pytest.raises(ValueError, match=r"no task kinds \['fly'\]"):
        make_tasks("terminal", "train", 1, kinds=["fly"])
