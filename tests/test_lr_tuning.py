"""The lr-tuning run: each method's lr chosen on dev by the demo's rule, flagged at the grid's
edge or the cap, written to lr_choice.json by `pivotrl demo` with `eval_split: false`, and read
back as the default's per-method grids."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pivotrl_testbed.demo_config import TUNED_LEARNING_RATES, DemoConfig
from pivotrl_testbed.lr_tuning import at_cap, lr_choice


def rows(method, lr, step, wins, n=100, world="toolshop"):
    return [{"method": method, "world": world, "seed": 0, "lr": lr, "step": step, "split": "dev",
             "measure": "episode", "item": i, "cluster": i, "outcome": float(i < wins)}
            for i in range(n)]


def test_the_smaller_lr_within_the_band_is_chosen_and_a_best_edge_is_flagged():
    cfg = DemoConfig(methods=["sft"], learning_rates=[3e-5, 1e-4, 3e-4])
    items = rows("base", 0.0, 0, 30)
    items += rows("sft", 3e-5, 5, 30) + rows("sft", 3e-5, 10, 32)
    items += rows("sft", 1e-4, 5, 40) + rows("sft", 1e-4, 10, 60)
    items += rows("sft", 3e-4, 5, 58) + rows("sft", 3e-4, 10, 50)
    got = lr_choice(items, cfg)["sft"]
    # 1e-4's best step is 10 (0.60); 3e-4's earliest within δ of its best is 5 (0.58): both
    # lrs within δ ≈ 0.049 of each other, so the smaller is chosen; 3e-5 is far below
    assert got["lr"] == pytest.approx(1e-4) and got["steps"] == {"toolshop": {0: 10}}
    assert got["by_lr"]["3e-05"] == {"steps": {"toolshop": {0: 5}}, "dev_score": pytest.approx(0.30)}  # 0.32 at 10: within δ
    assert not got["at_grid_edge"] and not got["at_cap"]
    items += rows("sft", 3e-4, 15, 90)  # the largest lr now scores best by far: widen the grid
    got = lr_choice(items, cfg)["sft"]
    assert got["lr"] == pytest.approx(3e-4) and got["at_grid_edge"]


def test_a_chosen_step_at_the_cap_is_flagged():
    assert at_cap({0: 60}, 60) and not at_cap({0: 50}, 60)
    assert at_cap({"terminal": {0: 60}, "toolshop": {0: 10}}, 60)  # steps kept per world


def test_the_default_trains_each_arm_at_its_tuned_lr_and_ablations_at_pivotrls():
    cfg = DemoConfig()
    assert {m: cfg.lrs(m) for m in TUNED_LEARNING_RATES} == {m: [lr] for m, lr in TUNED_LEARNING_RATES.items()}
    assert cfg.lrs("pivotrl_exact") == cfg.lrs("pivotrl")
    assert DemoConfig(learning_rates=[1e-3]).lrs("sft") == [1e-3]  # a list: every method's grid
    with pytest.raises(ValueError, match="unknown methods"):
        DemoConfig(learning_rates={"sfft": [1e-4]})
    with pytest.raises(ValueError, match="has no lr for 'sft'"):
        DemoConfig(learning_rates={"pivotrl": [1e-4]}).lrs("sft")
    tuning = DemoConfig.from_yaml(Path(__file__).parent.parent / "configs" / "demo_lr_tuning.yaml")
    assert not tuning.eval_split and len(tuning.lrs("e2e_rl")) == 3 and tuning.seeds == [0]


@pytest.mark.slow
def test_an_lr_tuning_run_through_the_cli_writes_its_choice_and_no_eval_split(tmp_path, quick_testbed,
                                                                              monkeypatch):
    import pivotrl_testbed.testbed.build as build
    from pivotrl.cli import app
    from pivotrl_testbed.testbed.build import TestbedConfig

    testbed, _ = quick_testbed  # the quick build's config, not the shipped one's: no rebuild
    monkeypatch.setattr(build, "load_testbed_config", lambda path: TestbedConfig().quick())
    config = tmp_path / "tune.yaml"
    config.write_text("worlds: [toolshop]\nmethods: [sft]\nseeds: [0]\nlearning_rates: [0.001, 0.003]\n"
                      "eval_split: false\nsteps: 2\neval_every: 1\nearly_until: 0\nk: 2\n"
                      "profile_trajectories: 2\nsft_batch_size: 2\ndev_tasks: 2\n"
                      "dev_ood_per_family: 2\nkl_prompts: 4\nworkers: 1\nsampled: {k: 0}\n"
                      "eval: {episodes: 2, turn_trajectories: 1, ood_per_family: 2, "
                      "max_new_tokens: 24, batch_size: 8}\n")
    out = tmp_path / "tune"
    res = CliRunner().invoke(app, ["demo", "--out", str(out), "--config", str(config),
                                   "--testbed", str(testbed)])
    assert res.exit_code == 0, res.output
    choice = json.loads((out / "lr_choice.json").read_text())
    assert choice["sft"]["lr"] in (0.001, 0.003) and set(choice["sft"]["by_lr"]) == {"0.001", "0.003"}
    items = [json.loads(line) for line in (out / "items.jsonl").read_text().splitlines()]
    assert items and {r["split"] for r in items} == {"dev"}  # the eval split was never scored
    assert not (out / "report.md").exists() and "lr choice:" in res.output
