"""The demo end to end on a miniature grid: every stage runs, every arm trains on the same
trajectories, results.json has the contract shape with paired verdicts, items.jsonl holds the
per-item outcomes, and a second run reuses the cache instead of training again."""

import json
import time

import pytest

import pivotrl_testbed.demo as demo
from pivotrl_testbed.demo import HEADLINE_ARMS, METHODS, DemoConfig, run_demo
from pivotrl_testbed.testbed.common import WORLDS
from pivotrl_testbed.decoding import DecodingRule
from pivotrl_testbed.evaluate import EvalConfig, SampledConfig
from pivotrl_testbed.testbed.build import TestbedConfig


def ensure_pivots(original):
    """The quick testbed's barely-trained base may yield no mixed turns with K=2; the demo then
    (correctly) skips the pivot arms. To exercise every arm here, fall back to the first four
    profiled turns as the pivot set, exactly once, before training."""
    def prepare(testbed, out, world, cfg):
        stats = original(testbed, out, world, cfg)
        if not stats["kept"]:
            wdir = out / "data" / world
            lines = (wdir / "profile.jsonl").read_text().splitlines()[:4]
            (wdir / "pivots.jsonl").write_text("\n".join(lines) + "\n")
            stats["kept"] = len(lines)
            (wdir / "pivots.stats.json").write_text(json.dumps(stats))
        return stats
    return prepare


@pytest.mark.slow
def test_demo_miniature_end_to_end_and_cached(tmp_path, monkeypatch, quick_testbed):
    testbed, _ = quick_testbed  # the demo only reads its testbed (checked below)
    before = sorted((str(p), p.stat().st_mtime_ns) for p in testbed.rglob("*"))
    monkeypatch.setattr(demo, "prepare_world", ensure_pivots(demo.prepare_world))
    cfg = DemoConfig(worlds=["toolshop"], methods=list(METHODS), seeds=[0], learning_rates=[1e-3],
                     steps=2, e2e_steps=3, eval_every=1, k=2, profile_trajectories=2, num_generations=2,
                     pivots_per_step=2, max_completion_length=24, sft_batch_size=2,
                     e2e_tasks_per_step=1, dev_tasks=2, dev_ood_per_family=2,
                     eval=EvalConfig(episodes=2, turn_trajectories=1, ood_per_family=2,
                                     max_new_tokens=24, batch_size=8),
                     kl_prompts=4, theory_turns=4, theory_samples=2, workers=1,
                     sampled=SampledConfig(k=2),
                     decoding=DecodingRule(k=2, pass_samples=4, pass_k=[2, 4]))
    out = tmp_path / "demo"
    results = run_demo(out, cfg, testbed=testbed, testbed_config=TestbedConfig().quick(),
                       log=lambda m: None)
    assert sorted((str(p), p.stat().st_mtime_ns) for p in testbed.rglob("*")) == before
    saved = json.loads((out / "results.json").read_text())
    logged = (out / "demo.log").read_text()  # progress is on file too, every stage and job with its ETA
    assert all(f"{k}/5 " in logged for k in range(1, 6)) and f"[{len(METHODS) - 1}/" in logged and "ETA" in logged
    assert "] eval split: " in logged  # the eval split's checkpoints report progress too
    assert set(saved["methods"]) == {"base", *METHODS}
    for name, m in saved["methods"].items():
        assert set(m["in_domain"]) == {"toolshop"}
        assert 0.0 <= m["in_domain"]["toolshop"]["success"] <= 1.0
        assert set(m["ood"]) and all(0 <= v["accuracy"] <= 1 for v in m["ood"].values())
        if name != "base":
            assert [c["step"] for c in m["checkpoints"]] == [1, 2]
            for c in m["checkpoints"]:  # the dev curve in the selection's decoding
                assert {"step", "lr", "rollout_turns", "in_domain", "ood", "kl_to_base"} <= set(c)
                assert c["decoding"] == "greedy" and c["turn_accuracy"] is not None
                assert c["in_domain"] is not None  # episodes, the selection measure, scored greedy
    ck = {n: m["checkpoints"] for n, m in saved["methods"].items()}
    assert all(c["rollout_turns"] == 0 for c in ck["sft"])
    # Every arm's data: the first 2 trajectories; PivotRL's candidates are all of their turns.
    data = out / "data" / "toolshop"
    trajs = {json.loads(line)["id"] for line in (data / "trajectories.jsonl").read_text().splitlines()}
    turns = [json.loads(line) for line in (data / "turns.jsonl").read_text().splitlines()]
    assert len(trajs) == 2 and {t["trajectory_id"] for t in turns} == trajs
    assert saved["pivots"]["toolshop"]["trajectories"] == 2
    # PivotRL pays for profiling (every turn × K=2) plus G × pivots_per_step rollouts per step.
    assert ck["pivotrl"][0]["rollout_turns"] == len(turns) * 2 + 2 * 2 * 1
    assert ck["pivotrl_no_filter"][1]["rollout_turns"] == 2 * 2 * 2
    assert ck["e2e_rl"][1]["rollout_turns"] > ck["e2e_rl"][0]["rollout_turns"] > 0
    # Every checkpoint row carries the tokens its trainer counted, growing with the steps (E2E RL
    # skips the forward of a step whose groups all tie, as all do on this base: 0 is what it
    # trained); SFT generates none.
    for done in (out / "runs").glob("toolshop/*/*/rows.json"):
        got = json.loads(done.read_text())
        trained, generated = [r["train_tokens"] for r in got], [r["rollout_tokens"] for r in got]
        method = got[0]["method"]
        assert trained == sorted(trained) and (trained[0] > 0 or method == "e2e_rl"), got
        assert (generated == [0] * len(got)) if method == "sft" else 0 < generated[0] and generated == sorted(generated)
    arms = saved["compute"]["arms"]
    assert saved["compute"]["note"] is None and all(c["training_tokens"] is not None for c in arms.values())
    assert all(c["training_tokens"] > 0 for m, c in arms.items() if m != "e2e_rl"), arms
    # Per-item outcomes of every arm on both splits; verdicts between dev-chosen checkpoints.
    items = [json.loads(line) for line in (out / "items.jsonl").read_text().splitlines()]
    keys = {"method", "world", "seed", "lr", "step", "split", "measure", "item", "cluster", "outcome",
            "decoding"}
    assert all(set(r) == keys | ({"position", "kind"} if r["measure"] == "turn" else set())
               for r in items if r["decoding"] != "pass")
    assert all(set(r) == keys | {"position", "samples", "successes"} and r["samples"] == 4
               and r["outcome"] == r["successes"] / 4 for r in items if r["decoding"] == "pass")
    # Dev is scored greedy (the selection's decoding) and sampled at every checkpoint, eval both
    # ways; at the chosen checkpoints, dev at the decoding grid's other temperatures
    # and pass@k's samples on eval (the base and the headline arms only); eval at 0.5 only for
    # the arms whose dev-best it is.
    assert set(saved["decoding"]["best"]) == {"base", *METHODS}
    at_half = {m for m, t in saved["decoding"]["best"].items() if t == 0.5}
    assert {(r["method"], r["split"], r["decoding"]) for r in items} == {
        (m, s, d) for m in ("base", *METHODS) for s, d in
        (("dev", "sampled"), ("eval", "greedy"), ("eval", "sampled"), ("dev", "greedy"),
         ("dev", "T0.5"))} | {(m, "eval", "T0.5") for m in at_half} | {
        (m, "eval", "pass") for m in ("base", *HEADLINE_ARMS)}
    # the grid scores dev episodes (the selection measure) and turns; eval at an arm's own
    # temperature gets episodes too, at the training temperature only the episodes
    assert {r["measure"] for r in items if r["decoding"] == "T0.5" and r["split"] == "dev"} == {"turn", "episode"}
    assert {r["measure"] for r in items if r["decoding"] == "T0.5" and r["split"] == "eval"} \
        == ({"turn", "ood", "episode"} if at_half else set())
    at_one = {m for m, t in saved["decoding"]["best"].items() if t == 1.0}
    assert {r["method"] for r in items if r["decoding"] == "sampled" and r["measure"] == "episode"
            and r["split"] == "eval"} == at_one
    assert {r["measure"] for r in items if r["decoding"] == "pass"} == {"turn"}
    assert set(saved["decoding"]["pass"]["pivotrl"]) >= {"pass@2", "pass^4"}
    assert {r["measure"] for r in items} == {"episode", "turn", "ood"}
    # Sampled at every checkpoint: turn accuracy and OOD only (episodes: the grid's, above), each
    # a mean over k=2 samples.
    sampled = [r for r in items if r["decoding"] == "sampled"]
    assert {r["measure"] for r in sampled if r["measure"] != "episode"} == {"turn", "ood"}
    assert all(r["outcome"] in (0.0, 0.5, 1.0) for r in sampled)
    assert {v["decoding"] for v in saved["verdicts"]} == {"dev-best", "greedy", "sampled"}
    assert saved["verdicts"][0]["decoding"] == "dev-best"  # the headline
    # The budget rule ran every job and says where it stopped; the frontier verdicts are there.
    # E2E RL has its own cap (3 here); every other arm stops by the shared one (2).
    assert {(s["method"], s["stop_step"]) for s in saved["budget"]} <= {
        (m, st) for m in METHODS for st in ((1, 2, 3) if m == "e2e_rl" else (1, 2))}
    assert len(saved["budget"]) == len(METHODS)
    assert set(saved["joint"]["verdicts"]) == {"ood_at_matched_gain", "gain_at_matched_ood",
                                               "ood_at_matched_kl", "gain_at_matched_kl"}
    assert saved["verdicts"] and all(v["verdict"] in ("met", "not met", "within noise", "not measurable")
                                     for v in saved["verdicts"])
    assert "grad_norm_vs_std_corr" in saved["theory"] and "null_grad_norm_vs_std_corr" in saved["theory"]
    assert saved["wall_seconds"] > 0 and {"pivotrl", "e2e_rl"} <= set(saved["turns_to_match_e2e"])
    report = (out / "report.md").read_text()
    assert "## The paper's claims against ours" in report
    assert "## Decoding: each arm at its dev-best temperature" in report
    assert "| arm | turn accuracy (eval) | training tokens (forward + backward) | rollout tokens |" in report
    assert (out / "frontier.png").exists() and (out / "compute.png").exists()
    assert (out / "joint_frontier.png").exists() and "## The joint claim on the frontier" in report

    finished = {p: p.stat().st_mtime_ns for p in out.rglob("rows.json")}
    assert finished
    again = run_demo(out, cfg, testbed=testbed, testbed_config=TestbedConfig().quick(),
                     log=lambda m: None)
    assert again["methods"]["pivotrl"]["checkpoints"] == results["methods"]["pivotrl"]["checkpoints"]
    # nothing retrained: every job's rows.json is reused as it was, and no job was added
    assert {p: p.stat().st_mtime_ns for p in out.rglob("rows.json")} == finished


def test_demo_yaml_is_the_default_and_typos_are_errors(tmp_path):
    from pathlib import Path

    shipped = Path(__file__).parent.parent / "configs" / "demo.yaml"
    assert DemoConfig.from_yaml(shipped) == DemoConfig()
    bad = tmp_path / "demo.yaml"
    bad.write_text("learning_rate: [0.001]\n")  # the field is learning_rates
    with pytest.raises(ValueError, match=r"demo.yaml: learning_rate: Extra inputs"):
        DemoConfig.from_yaml(bad)
    bad.write_text("steps: [\n")
    with pytest.raises(ValueError, match="demo.yaml"):
        DemoConfig.from_yaml(bad)
    bad.write_text("methods: [sft, pivot_rl]\n")
    with pytest.raises(ValueError, match="unknown methods \\['pivot_rl'\\]"):
        DemoConfig.from_yaml(bad)
    # --full adds the ablation arms and seeds on top of the same per-run budget (cache reuse)
    full = DemoConfig().full()
    assert full.methods == list(METHODS) and full.seeds == list(range(3))
    assert (full.steps, full.learning_rates) == (DemoConfig().steps, DemoConfig().learning_rates)
    assert full.ablation_seeds == 1  # ablations on seed 0 only: 1 seed, indicative (2-h budget)
    assert full.ablation_worlds == ["toolshop"]  # in the world without a sandbox (2-h budget)
    # the default trains one world (its ~20-min budget); --full every world of the testbed
    assert DemoConfig().worlds == ["toolshop"] and full.worlds == list(WORLDS)
    # the default's eval split, so a --full into the default's folder reuses its testbed and base
    assert full.eval == DemoConfig().eval
    from pivotrl_testbed.testbed.build import load_testbed_config

    testbed = load_testbed_config(None)
    assert full.sized_testbed(testbed) == DemoConfig().sized_testbed(testbed)
    default = DemoConfig().sized_testbed(testbed)  # 100 dev + 100 eval tasks: more than it ships
    assert default.n_eval == DemoConfig().dev_tasks + DemoConfig().eval.episodes
    assert default.model_copy(update={"n_eval": testbed.n_eval}) == testbed
    assert full.sized_testbed(testbed).weights_digest() == testbed.weights_digest()
    from pivotrl_testbed.demo import plan_jobs

    planned = plan_jobs(full, {w: {"kept": 5} for w in WORLDS}, log=lambda m: None)
    # the headline arms on three seeds in both worlds; each ablation once, toolshop seed 0
    assert len(planned) == 3 * len(HEADLINE_ARMS) * len(WORLDS) + (len(METHODS) - len(HEADLINE_ARMS))
    assert {j.seed for j in planned if j.method not in HEADLINE_ARMS} == {0}


def test_strict_exact_is_the_raw_text_ablation():
    """The demo's exact arm: key order, case and message spacing all count; the default
    normalised `exact` forgives them."""
    import json as _json

    from pivotrl.io.records import Turn
    from pivotrl.scoring import score_completion
    from pivotrl.verifiers import get_verifier

    def call(args):
        return "<tool_call>\n" + _json.dumps({"name": "get_order", "arguments": args}) + "\n</tool_call>"

    turn = Turn(id="t/1", trajectory_id="t", turn=1, context=[], expected={
        "role": "assistant", "tool_calls": [{"id": "a", "function": {
            "name": "get_order", "arguments": _json.dumps({"order_id": "o1", "verbose": True})}}]})
    strict, loose = get_verifier("exact", strict=True), get_verifier("exact")
    same = call({"order_id": "o1", "verbose": True})
    reordered = call({"verbose": True, "order_id": "o1"})
    assert score_completion(strict, turn, same).reward == 1.0
    assert score_completion(strict, turn, reordered).reward == 0.0
    assert score_completion(loose, turn, reordered).reward == 1.0
    msg = Turn(id="t/2", trajectory_id="t", turn=2, context=[],
               expected={"role": "assistant", "content": "Done.  Booked!"})
    assert score_completion(strict, msg, "Done.  Booked!").reward == 1.0
    assert score_completion(strict, msg, "done. booked!").reward == 0.0
    assert score_completion(loose, msg, "done. booked!").reward == 1.0


def test_grpo_default_batch_is_four_pivots_per_step():
    from pivotrl.train.config import GRPORunConfig

    common = dict(model="m", output_dir="o", pivots="p")
    assert GRPORunConfig(**common).pivots_per_step() == 4.0
    assert GRPORunConfig(**common, num_generations=8).pivots_per_step() == 4.0
    assert GRPORunConfig(**common, num_generations=8, per_device_train_batch_size=8).pivots_per_step() == 1.0


def test_base_pretraining_is_reproducible(tiny_model_dir):
    """Same config → same weights: seeded init, seeded batch order, fixed thread count. (Two
    whole quick builds, 20 steps, were measured bitwise equal too; this is the cheap guard.)"""
    import torch

    from conftest import sample_texts
    from pivotrl_testbed.testbed.pretrain import PretrainConfig, pretrain
    from pivotrl_testbed.testbed.tiny import TinyModelConfig, build_model, load_tiny

    _, tok = load_tiny(tiny_model_dir)
    examples = [{"messages": [{"role": "user", "content": t[:60]}, {"role": "assistant", "content": t[60:120]}],
                 "tools": None} for t in sample_texts(24)]
    cfg = PretrainConfig(steps=4, warmup=1, threads=1, tokens_per_batch=512)

    def run(seed=0):
        model = build_model(tok, TinyModelConfig(max_positions=2048, seed=seed))
        pretrain(model, tok, examples, cfg)
        return [p.detach().clone() for p in model.parameters()]

    a, b = run(), run()
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, run(seed=1)))  # the seed does matter


def test_cached_base_is_repeated_under_every_seed_of_the_run(tmp_path):
    """The base is scored once per world; a rerun with more seeds repeats it under each of them
    (a cache written for one seed must not leave the other seeds without their step 0)."""
    from pivotrl_testbed.demo import base_rows, score_base

    item = {"split": "eval", "measure": "turn", "item": 0, "cluster": "t0", "outcome": 1}
    (tmp_path / "runs" / "base").mkdir(parents=True)
    (tmp_path / "runs" / "base" / "toolshop.json").write_text(
        json.dumps({"row": {"kl_to_base": 0.0}, "items": [item]}))
    cfg = DemoConfig(worlds=["toolshop"], seeds=[0, 1, 2], workers=1)
    scored = score_base(tmp_path / "no-testbed", tmp_path, "toolshop", cfg)  # the cache, read
    rows, items, seconds = base_rows({"toolshop": scored}, cfg)
    assert seconds == {"toolshop": 0.0}  # a cache written without its time: no cost known
    assert [(r["seed"], r["step"], r["method"]) for r in rows] == [(s, 0, "base") for s in (0, 1, 2)]
    assert sorted(r["seed"] for r in items) == [0, 1, 2] and all(r["outcome"] == 1 for r in items)


def test_profiling_and_the_base_scoring_share_one_pool(tmp_path, monkeypatch):
    """Stages 2 and 3 read nothing of each other, so every task of both is in the pool before
    the first result is waited on: a worker done with its world's profile takes the base's
    scoring instead of idling while the other world profiles."""
    events = []

    class Deferred:
        def __init__(self, fn, args):
            self.fn, self.args = fn, args

        def result(self):
            events.append(("ran", self.fn.__name__))
            return self.fn(*self.args)

    class RecordingPool:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def submit(self, fn, *args):
            events.append(("submitted", fn.__name__))
            return Deferred(fn, args)

    def prepare_world_in_worker(testbed, out, world, cfg):
        return {"kept": 3, "trajectories": 1}

    def score_base(testbed, out, world, cfg):
        return {"row": {"kl_to_base": 0.0}, "items": [], "seconds": 7.0}

    def grid_at(job, world, step, testbed, out, cfg):
        return []

    for fn in (prepare_world_in_worker, score_base, grid_at):
        monkeypatch.setattr(demo, fn.__name__, fn)
    monkeypatch.setattr(demo, "workers_pool", lambda n: RecordingPool())
    # the deferred results are not Futures to wait on: they complete in order when read
    monkeypatch.setattr(demo, "completed", lambda futures, *a, **k: enumerate(futures, start=1))
    cfg = DemoConfig(worlds=["toolshop", "terminal"], seeds=[0, 1])
    pivot_stats, rows, items, seconds = demo.prepare_and_score_base(tmp_path, tmp_path, cfg, lambda m: None)
    first_wait = next(i for i, (what, _) in enumerate(events) if what == "ran")
    assert sorted(name for what, name in events[:first_wait]) == sorted(
        ["prepare_world_in_worker", "score_base", "grid_at"] * 2)
    assert {w: s["kept"] for w, s in pivot_stats.items()} == {"toolshop": 3, "terminal": 3}
    assert seconds == {"toolshop": 7.0, "terminal": 7.0}
    assert sorted((r["world"], r["seed"]) for r in rows) == [
        ("terminal", 0), ("terminal", 1), ("toolshop", 0), ("toolshop", 1)]
    assert sum(what == "ran" for what, _ in events) == 6  # the grids' results are waited on too


def test_ablation_arms_train_on_the_first_ablation_seeds_only():
    from pivotrl_testbed.demo import plan_jobs

    cfg = DemoConfig(worlds=["toolshop"], methods=list(METHODS), seeds=[0, 1, 2],
                     learning_rates=[1e-4], ablation_seeds=1)
    jobs = plan_jobs(cfg, {"toolshop": {"kept": 5}}, log=lambda m: None)
    seeds = {m: sorted(j.seed for j in jobs if j.method == m) for m in METHODS}
    assert seeds["pivotrl"] == seeds["sft"] == seeds["e2e_rl"] == [0, 1, 2]
    assert seeds["pivotrl_no_filter"] == seeds["pivotrl_random"] == seeds["pivotrl_exact"] == [0]
    every = plan_jobs(cfg.model_copy(update={"ablation_seeds": 0}), {"toolshop": {"kept": 5}},
                      log=lambda m: None)
    assert len(every) == len(METHODS) * 3


def test_ablation_arms_train_in_the_ablation_worlds_only():
    from pivotrl_testbed.demo import plan_jobs

    cfg = DemoConfig(worlds=["toolshop", "terminal"], methods=list(METHODS), seeds=[0, 1],
                     ablation_worlds=["toolshop"])
    kept = {"toolshop": {"kept": 5}, "terminal": {"kept": 5}}
    worlds = {m: sorted({j.world for j in plan_jobs(cfg, kept, log=lambda m: None) if j.method == m})
              for m in METHODS}
    assert worlds["sft"] == worlds["pivotrl"] == worlds["e2e_rl"] == ["terminal", "toolshop"]
    assert worlds["pivotrl_no_filter"] == worlds["pivotrl_random"] == worlds["pivotrl_exact"] == ["toolshop"]
    every = plan_jobs(cfg.model_copy(update={"ablation_worlds": []}), kept, log=lambda m: None)
    assert len(every) == len(METHODS) * 2 * 2
    with pytest.raises(ValueError, match=r"ablation_worlds \['shop'\] are not in worlds"):
        DemoConfig(worlds=["toolshop"], ablation_worlds=["shop"])


def test_jobs_start_longest_first_the_costlier_world_first_within_a_method():
    from pivotrl_testbed.demo import plan_jobs

    cfg = DemoConfig(worlds=["toolshop", "terminal"], seeds=[0, 1])
    kept = {"toolshop": {"kept": 5}, "terminal": {"kept": 5}}
    jobs = plan_jobs(cfg, kept, lambda m: None, {"toolshop": 40.0, "terminal": 70.0})
    assert [(j.method, j.world, j.seed) for j in jobs] == [
        (m, w, s) for m in ("e2e_rl", "pivotrl", "sft") for w in ("terminal", "toolshop") for s in (0, 1)]
    # Without a measured cost the config's world order stands.
    plain = plan_jobs(cfg, kept, lambda m: None)
    assert [(j.method, j.world) for j in plain][:2] == [("e2e_rl", "toolshop"), ("e2e_rl", "terminal")]


@pytest.mark.parametrize("method, strategy", [("pivotrl_no_filter", "all"), ("pivotrl_random", "random")])
def test_the_ablation_arms_train_on_what_select_strategy_keeps(method, strategy, tmp_path, monkeypatch):
    """One all/random ablation switch: the library's `pivotrl select --strategy`; the demo's arms
    train on exactly what it writes for the same profile and seed."""
    import json

    from typer.testing import CliRunner

    import pivotrl.train.grpo as grpo
    from pivotrl.cli import app
    from pivotrl.io.records import Profile, Sample, Turn, iter_valid
    from pivotrl.profile.loop import make_profile
    from pivotrl_testbed.demo import DemoConfig
    from pivotrl_testbed.jobs import Job, train_job

    wdir = tmp_path / "out" / "data" / "toolshop"
    wdir.mkdir(parents=True)
    outcomes = ([1.0, 0.0], [0.0, 0.0], [1.0, 1.0])  # mixed (a pivot), all-fail, all-pass
    rows = [make_profile(Turn.model_validate({"id": f"t{i}/1", "trajectory_id": f"t{i}", "turn": 1,
                                              "context": [{"role": "user", "content": f"q{i}"}],
                                              "expected": {"role": "assistant", "content": f"a{i}"}}),
                         [Sample(completion="", reward=r, valid=True) for r in outcomes[i % 3]])
             for i in range(30)]
    (wdir / "profile.jsonl").write_text("".join(json.dumps(p.model_dump(mode="json")) + "\n" for p in rows))
    run = CliRunner().invoke
    assert run(app, ["select", str(wdir / "profile.jsonl"), "--out", str(wdir / "pivots.jsonl")]).exit_code == 0
    seen = {}
    monkeypatch.setattr(grpo, "train", lambda cfg, **_: seen.setdefault("cfg", cfg))
    train_job(Job("toolshop", method, 1e-4, 3), tmp_path, tmp_path / "out", DemoConfig())
    expected = tmp_path / "selected.jsonl"
    # random: as many turns as the pivot arm trains on (10 pivots here)
    size = ["--budget", "10"] if strategy == "random" else []
    result = run(app, ["select", str(wdir / "profile.jsonl"), "--out", str(expected), "--strategy", strategy,
                       "--seed", "3", "--no-plot", *size])
    assert result.exit_code == 0, result.output
    ids = [p.id for p in iter_valid(seen["cfg"].pivots, Profile)]
    assert ids == [p.id for p in iter_valid(expected, Profile)]
    assert len(ids) == (30 if strategy == "all" else 10)


def test_each_checkpoint_row_carries_the_tokens_its_trainer_logged_at_that_step(tmp_path, monkeypatch):
    """rows.json: `train_tokens` / `rollout_tokens` as metrics.jsonl has them at the checkpoint's
    own step; a step the trainer did not log them at has none (never a nearby step's count)."""
    import pivotrl_testbed.jobs as jobs

    cfg = DemoConfig(worlds=["toolshop"], eval_every=10, steps=20, early_until=0)

    def fake_train(job, testbed, out, cfg, until=None):
        run = out / "runs" / job.name
        (run / f"checkpoint-{until}").mkdir(parents=True)
        (run / f"checkpoint-{until}" / "config.json").write_text("{}")
        with (run / "metrics.jsonl").open("a") as f:
            for step in range(until - 9, until + (job.method == "sft")):  # pivotrl: its last step unlogged
                f.write(json.dumps({"step": step, "train_tokens": 100 * step,
                                    **({} if job.method == "sft" else {"rollout_tokens": 7 * step})}) + "\n")

    def scored(key, checkpoints, evaluator, extra):
        (step, _), = checkpoints.items()
        item = {**key, "step": step, "split": "dev", "measure": cfg.select_on, "item": 0, "cluster": 0,
                "decoding": cfg.select_decoding, "outcome": step / 100}
        return [{**key, "step": step, **extra(step)}], [item]

    monkeypatch.setattr(jobs, "train_job", fake_train)
    monkeypatch.setattr(jobs, "score_dev", scored)
    monkeypatch.setattr(jobs, "Evaluator", lambda testbed, cfg: object())
    rows, _ = jobs.run_job(jobs.Job("toolshop", "sft", 1e-4, 0), tmp_path, tmp_path, cfg, {}, start=0.0)
    assert [(r["step"], r["train_tokens"], r["rollout_tokens"]) for r in rows] == [(10, 1000, 0), (20, 2000, 0)]
    rows, _ = jobs.run_job(jobs.Job("toolshop", "pivotrl", 1e-4, 0), tmp_path, tmp_path, cfg,
                           {"profile_rollout_turns": 0}, start=0.0)
    assert "train_tokens" not in rows[0] and "rollout_tokens" not in rows[1]


def test_a_job_stops_on_its_own_dev_score_never_where_its_other_world_run_stopped(tmp_path, monkeypatch):
    """Each world's run is its own: toolshop's run of the same arm, lr and seed stopped at step 20,
    and terminal's, its dev score still rising, trains on to its cap. A cached run stopped where
    this rule would not stop it goes on from its last checkpoint; one it would stop is reused."""
    import pivotrl_testbed.jobs as jobs

    cfg = DemoConfig(worlds=["toolshop", "terminal"], eval_every=10, steps=60, early_until=0)
    trained = []

    def fake_train(job, testbed, out, cfg, until=None):
        trained.append(until)
        (out / "runs" / job.name / f"checkpoint-{until}").mkdir(parents=True)
        (out / "runs" / job.name / f"checkpoint-{until}" / "config.json").write_text("{}")

    def rising(key, checkpoints, evaluator, extra):
        (step, _), = checkpoints.items()
        item = {**key, "step": step, "split": "dev", "measure": cfg.select_on, "item": 0, "cluster": 0,
                "decoding": cfg.select_decoding, "outcome": step / 100}
        return [{**key, "step": step}], [item]

    monkeypatch.setattr(jobs, "train_job", fake_train)
    monkeypatch.setattr(jobs, "score_dev", rising)
    monkeypatch.setattr(jobs, "Evaluator", lambda testbed, cfg: object())
    sibling = tmp_path / "runs" / jobs.Job("toolshop", "sft", 1e-4, 0).name
    sibling.mkdir(parents=True)
    (sibling / "rows.json").write_text(json.dumps([{"step": 10}, {"step": 20, "stop_step": 20}]))
    rows, _ = jobs.run_job(jobs.Job("terminal", "sft", 1e-4, 0), tmp_path, tmp_path, cfg, {}, start=0.0)
    assert trained == [10, 20, 30, 40, 50, 60] and rows[-1]["stop_reason"] == "cap"
    # a finished run the rule agrees with is reused: nothing trains
    trained.clear()
    assert jobs.run_job(jobs.Job("terminal", "sft", 1e-4, 0), tmp_path, tmp_path, cfg, {}, start=0.0)[0] == rows
    assert trained == []
    # a cached run recorded as stopped at 20 while its score still rose goes on from there
    job = jobs.Job("terminal", "pivotrl", 1e-4, 0)
    cut = cfg.model_copy(update={"steps": 20})
    jobs.run_job(job, tmp_path, tmp_path, cut, {}, start=0.0)
    trained.clear()
    rows, items = jobs.run_job(job, tmp_path, tmp_path, cfg, {}, start=0.0)
    assert trained == [30, 40, 50, 60] and rows[-1]["stop_step"] == 60
    assert [r["step"] for r in rows] == [10, 20, 30, 40, 50, 60] == [r["step"] for r in items]
    # the default schedule: every 5 steps over the first 20
    trained.clear()
    jobs.run_job(jobs.Job("terminal", "e2e_rl", 1e-4, 0), tmp_path, tmp_path,
                 cfg.model_copy(update={"early_until": 20, "e2e_steps": 40}), {}, start=0.0)
    assert trained == [5, 10, 15, 20, 30, 40]
