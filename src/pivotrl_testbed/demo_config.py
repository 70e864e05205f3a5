"""`pivotrl demo`'s one config: the grid, the budget, the decoding and the evaluation, every field
with its help and the measurement its default rests on (configs/demo.yaml writes it out)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pivotrl.io.yaml_config import field_like, load_model
from pivotrl.verifiers.options import VerifierOptions
from pivotrl_testbed.budget import BudgetRule
from pivotrl_testbed.decoding import DecodingRule
from pivotrl_testbed.evaluate import EvalConfig, SampledConfig
from pivotrl_testbed.frontier import FrontierConfig
from pivotrl_testbed.testbed.common import WORLDS

if TYPE_CHECKING:
    from pivotrl_testbed.testbed.build import TestbedConfig

METHODS = ("sft", "pivotrl", "pivotrl_no_filter", "pivotrl_random", "pivotrl_exact", "e2e_rl")
PIVOT_SET_ARMS = ("pivotrl", "pivotrl_exact", "pivotrl_random")  # sized by the pivot set
# The arms whose training set is chosen by the base's profile, so its K samples per turn are their
# cost (compute reports, rollout-turn ratios); pivotrl_random only borrows the pivot count, which
# needs no sample of its own turns, and pivotrl_no_filter trains on every turn.
PROFILED_ARMS = ("pivotrl", "pivotrl_exact")
HEADLINE_ARMS = ("sft", "pivotrl", "e2e_rl")  # the paper's comparison; the rest are ablations
# Each headline arm's lr, as the committed lr-tuning run chose it on dev (configs/
# demo_lr_tuning.yaml: 1 seed, both worlds, the grid 3e-5 / 1e-4 / 3e-4 on the shipped base, Z;
# docs/results/z_lr_tuning/lr_choice.json and the commit that wrote these values are the record,
# docs/RESULTS.md "The lr-tuning run on Z"). Every arm's pooled dev episode success peaked at the
# grid's middle, 1e-4 (no edge, no chosen checkpoint at its cap). The ablations take PivotRL's lr.
TUNED_LEARNING_RATES = {"sft": 1e-4, "pivotrl": 1e-4, "e2e_rl": 1e-4}
# Where those values come from, as results.json and the report name it.
TUNED_LR_SOURCE = ("the lr-tuning run on dev (configs/demo_lr_tuning.yaml, 1 seed, grid 3e-5 / 1e-4 / "
                   "3e-4, run at commit acf5244; docs/results/z_lr_tuning/lr_choice.json), written into "
                   "TUNED_LEARNING_RATES by commit 293113f")


class DemoConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt YAML key is an error, not ignored

    worlds: list[str] = Field(default_factory=lambda: ["toolshop"], description="Agentic "
                              "worlds; one model is trained per world, as the paper trains one "
                              "model per domain. The default trains toolshop only, the cheaper "
                              "world to verify (no sandbox), so the demo fits ~20 min on 2 "
                              "cores; --full adds terminal (every world of the testbed).")
    methods: list[str] = Field(
        default_factory=lambda: ["sft", "pivotrl", "e2e_rl"], description="Arms to train (the "
        "base is always scored). The default grid holds the paper's three headline arms; the "
        "ablations (pivotrl_no_filter: every turn; pivotrl_random: random turns, as many as the "
        "pivots; pivotrl_exact: strict string-match reward) are in --full.")
    seeds: list[int] = Field(default_factory=lambda: [0], description="Training seeds (--full: 3).")
    ablation_seeds: int = Field(0, ge=0, description="The ablation arms (pivotrl_no_filter, "
                                "pivotrl_random, pivotrl_exact) train on the first N seeds only "
                                "(0: every seed). Their verdicts pair them with PivotRL on those "
                                "seeds; the headline arms' power is what the seeds are for.")
    ablation_worlds: list[str] = Field(default_factory=list, description="The ablation arms "
                                       "train in these worlds only (empty: every world). Their "
                                       "verdicts pair them with PivotRL on those worlds' items. "
                                       "--full: toolshop, the world without a sandbox: the "
                                       "terminal ablations were 9 of 36 runs and 57 of 145 "
                                       "training CPU-minutes in a two-world --full "
                                       "(docs/RESULTS.md), which then did not fit 2 h.")
    learning_rates: list[float] | dict[str, list[float]] = Field(
        default_factory=lambda: {m: [lr] for m, lr in TUNED_LEARNING_RATES.items()},
        description="Each method's lr grid (a list: the same grid for every method; a mapping: "
        "per method, and an ablation arm without its own entry takes PivotRL's, the method it "
        "varies). A grid of several lrs is chosen on dev (`stats.choose`: the smallest within δ "
        "of the best). The default is the choice of the committed lr-tuning run "
        "(`TUNED_LEARNING_RATES`, configs/demo_lr_tuning.yaml), so every arm trains at the lr "
        "its own dev scores chose. docs/DESIGN.md: keep RL at ≤ 3e-4 on these tiny models (a "
        "constant 1e-3 collapsed one-turn GRPO within 10 steps, OOD 0.96 → 0.28).")
    eval_split: bool = Field(True, description="Score the eval split at the dev-chosen "
                             "checkpoints and judge the arms there. Off for an lr-tuning run "
                             "(configs/demo_lr_tuning.yaml): it reads dev only, stops after the "
                             "choice and writes it to lr_choice.json, which the default and "
                             "--full then read through `TUNED_LEARNING_RATES`.")
    select_on: Literal["turn", "episode"] = Field(
        "episode", description="Dev measure that chooses each run's checkpoint, each method's lr "
        "and each arm's temperature, stops a run (`budget`) and matches the frontiers. Episode "
        "success: the paper's measure (task success); turn accuracy is scored and chosen the "
        "same way beside it. On turn accuracy a --full showed both arms ahead of the base on "
        "turns and behind it on whole tasks (docs/RESULTS.md).")
    select_decoding: Literal["greedy", "sampled"] = Field(
        "greedy", description="Decoding of that dev measure at every checkpoint (both are scored "
        "and judged). Greedy: episodes are scored greedily at every checkpoint (sampled, k "
        "episodes per task, only over the decoding grid at chosen checkpoints); an arm's "
        "temperature is then chosen over the grid (`decoding`). Sampled turn accuracy, at the "
        "training temperature, is what GRPO optimises; with greedy turn selection on the shipped "
        "base every run stopped by step 30 while PivotRL's sampled dev score still rose "
        "(docs/RESULTS.md).")
    steps: int = Field(60, description="The cap: most optimizer steps per training run. A dev probe "
                       "(toolshop, 3 seeds): PivotRL (16 pivots/step, lr 3e-4) peaked by step 40, SFT's dev "
                       "accuracy still rose at 30 and matched it near 60.")
    e2e_steps: int = Field(250, description="E2E RL's own cap (the budget rule still stops it when "
                           "dev stops improving). At the shared cap of 60 the schedule could show "
                           "at most 2.09x fewer rollout turns for PivotRL with its profiling "
                           "(candidate D4, docs/RESULTS.md): the paper's 4x was ruled out before "
                           "any run. At 2 tasks per step 250 lets E2E RL spend ~4.6x PivotRL's "
                           "turns at its first checkpoint (toolshop, K = 8 profiling), so the "
                           "runs decide it; the demo prints the bound before training.")
    budget: BudgetRule = Field(default_factory=BudgetRule, description="Each run stops when its dev "
                               "score has not improved for `patience` checkpoints (experiment/"
                               "budget.py), the same rule for every arm.")
    match_tolerance: float = Field(0.02, description="Frontier matching: largest dev difference for "
                                   "two checkpoints to count as matched (experiment/frontier.py).")
    decoding: DecodingRule = Field(default_factory=DecodingRule, description="The decoding "
                                   "each arm is judged at, fixed by rule: the dev-best temperature "
                                   "of a grid at its chosen checkpoints, and pass@k / pass^k at "
                                   "the training temperature (pivotrl_testbed/decoding.py).")
    sampled: SampledConfig = Field(default_factory=lambda: SampledConfig(k=2), description="Sampled "
                                   "scoring beside greedy: k samples per item at the training "
                                   "temperature (turn accuracy and OOD; episodes off: k episodes per "
                                   "task). k = 2, not 4: sampled scoring was most of a checkpoint's "
                                   "dev cost (17 s on toolshop); the items' clusters, not k, set the "
                                   "verdicts' intervals.")
    dev_greedy: bool = Field(False, description="Score the dev split greedily too at every "
                             "checkpoint (episodes, turns, OOD), beside the sampled scoring. Off, "
                             "nothing the demo decides loses an input: the budget rule, each "
                             "checkpoint and lr choice and the frontier's matching read the dev split "
                             "in `select_decoding`, and every verdict reads the eval split, scored "
                             "both ways where it is read. Greedy dev scoring was half of each "
                             "checkpoint's dev evaluation (terminal: 12 of 17.6 s); on, the dev "
                             "curves are drawn greedy as well. Always on with greedy selection.")
    dev_sampled: bool = Field(False, description="Score the dev split sampled too at every "
                              "checkpoint (the measures of `sampled`), beside greedy. Off, nothing "
                              "the demo decides loses an input: with greedy selection the budget "
                              "rule, the choices and the frontier's matching read greedy dev, the "
                              "decoding grid scores dev at the training temperature itself at the "
                              "chosen checkpoints, and the verdicts read the eval split, scored "
                              "both ways. Sampled dev scoring was about half of each checkpoint's "
                              "dev generations (k = 2 samples of every turn and OOD task), and "
                              "dev scoring most of a training run's time. Always on with sampled "
                              "selection.")
    eval_every: int = Field(10, description="Checkpoint every N steps; every checkpoint is scored "
                            "on dev, the dev-chosen one on eval (experiment/checkpoint_eval.py).")
    early_every: int = Field(5, ge=1, description="Over the first `early_until` steps, a "
                             "checkpoint every N steps instead (every arm alike): the rollout "
                             "ratio reads the step where PivotRL first reaches E2E RL's target, "
                             "and at 10-step checkpoints PivotRL reached it at its first one, so "
                             "the ratio's interval had the estimate as its bound (docs/RESULTS.md).")
    early_until: int = Field(20, ge=0, description="The steps `early_every` applies to (0: none).")
    k: int = Field(8, description="Profiling samples per turn (the paper profiles with K samples of π0).")
    profile_trajectories: int = Field(100, description="Expert trajectories per world that every "
                                      "arm trains on: all their turns are PivotRL's candidates "
                                      "(~430 turns, the profiling cost of the 480 turns measured "
                                      "before), SFT's data and E2E RL's tasks. 0 = all of "
                                      "train.jsonl.")
    dev_tasks: int = Field(100, description="The first N tasks of each world's eval.jsonl are "
                           "the dev split (checkpoint, lr and temperature choice); the next "
                           "`eval.episodes` are the eval split the verdicts are measured on. The "
                           "choice's band δ is one binomial standard error of a world's dev "
                           "score: at 40 tasks ±0.075 at a success rate of 0.35, wider than every "
                           "dev curve of the default on the shipped base (0.25–0.35), so every arm "
                           "was chosen at its first checkpoint; at 100, ±0.048 (docs/RESULTS.md).")
    dev_ood_per_family: int = Field(40, description="OOD dev tasks per family (the first N); the "
                                    "next `eval.ood_per_family` are the eval split.")
    verifier: str = field_like(VerifierOptions, "verifier", default="state", note="Here execution-based "
                               "equivalence in the world (the testbed worlds are executable).")
    num_generations: int = Field(8, description="G rollouts per pivot (paper: 16; 8 on 2 cores).")
    pivots_per_step: int = Field(8, description="Pivots per optimizer step (batch = G × this). "
                                 "A dev probe on the plain base (toolshop, 3 seeds): 4 pivots at lr ≤ 3e-4 "
                                 "left PivotRL flat (+0.014 turn accuracy); 16 at 3e-4 gained +0.057 "
                                 "greedy, +0.111 sampled by step 40; 2 were too noisy (probe_pivotrl.py). "
                                 "8, not 16, on the 4-layer default base: a step cost 7.4 s at 16 and "
                                 "2.8 s at 8 (toolshop, 1 thread), and 16 made the demo 48 min.")
    max_completion_length: int = Field(64, description="Tokens per one-turn rollout (a testbed "
                                       "action is < 60 tokens).")
    sft_batch_size: int = Field(8, description="Trajectories per SFT step.")
    e2e_tasks_per_step: int = Field(2, description="E2E RL: tasks per step, each with G episodes "
                                    "(a task is ~4.6 model turns, a pivot one: 2 tasks give about "
                                    "the rollout turns of PivotRL's 8 pivots per step, so both RL "
                                    "methods train on batches of about the same size).")
    eval: EvalConfig = Field(default_factory=lambda: EvalConfig(
        episodes=100, turn_trajectories=100, ood_per_family=60, batch_size=30,
        verifiers={"toolshop": "state", "terminal": "state"}),
        description="Evaluation of a checkpoint on the eval split: greedy episodes on 100 tasks per "
        "world and turn accuracy on the expert states of the same 100 tasks, 60 OOD tasks per "
        "family: with the 40 dev tasks, the testbed's whole eval file (140 per world, 100 OOD). "
        "Every seed is scored on the same items, so their clusters set the headline interval: "
        "at 60 tasks per world it stayed ±0.0215 from 5 to 8 seeds; at 100 it is ±0.016 at 6 "
        "(docs/RESULTS.md).")
    kl_prompts: int = Field(40, description="OOD texts (non-agentic families) for KL / rank "
                            "correlation to the base.")
    theory_turns: int = Field(32, description="Profiled states (half pivots, half not) in "
                              "the theory checks.")
    theory_samples: int = Field(16, description="Actions sampled per state in the theory checks.")
    workers: int = Field(2, description="Training jobs run in parallel (one per core, `threads` each).")
    threads: int = Field(1, ge=1, description="torch threads per worker. 1: one job per core, and "
                         "the float sums run in one order; another count reorders them (float "
                         "noise), which a choice by the dev band must not follow: rerunning the "
                         "default at `workers: 1, threads: 2` checks that it does not.")

    @classmethod
    def from_yaml(cls, path: Path) -> "DemoConfig":
        return load_model(cls, path)

    def lrs(self, method: str) -> list[float]:
        """The lr grid `method` trains over (`learning_rates`)."""
        if isinstance(self.learning_rates, list):
            return self.learning_rates
        grid = self.learning_rates.get(method)
        if grid is None and method in PIVOT_SET_ARMS + ("pivotrl_no_filter",):
            grid = self.learning_rates.get("pivotrl")
        if not grid:
            raise ValueError(f"learning_rates has no lr for {method!r}: give it one, or PivotRL one")
        return grid

    def cap(self, method: str) -> int:
        """The most optimizer steps a run of `method` may take."""
        return self.e2e_steps if method == "e2e_rl" else self.steps

    def checkpoint_steps(self, method: str) -> list[int]:
        """The steps a run of `method` is checkpointed and scored at: every `early_every` up to
        `early_until`, every `eval_every` after, to its cap."""
        cap = self.cap(method)
        early = range(self.early_every, min(self.early_until, cap) + 1, self.early_every)
        return sorted(set(early) | set(range(self.eval_every, cap + 1, self.eval_every)))

    def save_every(self) -> int:
        """The trainers' save interval: every checkpoint step is a multiple of it."""
        return math.gcd(self.eval_every, self.early_every) if self.early_until else self.eval_every

    def full(self) -> "DemoConfig":
        """Every arm (ablations included), every world of the testbed and three seeds, at the
        default's budget per run, so a --full run into a folder that holds the default run trains
        only what it adds (finished jobs and the base's scoring are cached: the eval split is the
        default's too). The headline arms train on three seeds in both worlds (3 × 3 runs per
        world), the three ablations on seed 0 in toolshop only: their verdicts are 1 seed,
        indicative, as the default's are. A --full that gave them all three seeds (9 runs and ~12
        eval-stage units) was projected at ~2 h 45 min on 2 cores, over its 2 h; in both worlds
        it took ~2 h 40 min before episodes were scored (docs/RESULTS.md). Turn accuracy is on
        the default's 100 eval trajectories per world: 300 narrowed its interval (±0.029 →
        ±0.016) when it was the headline, but the headline and every choice are episode success
        now, and at 300 a --full's eval stage scored each of its ~40 checkpoints for 2–4 min."""
        return self.model_copy(update={"seeds": list(range(3)), "methods": list(METHODS),
                                       "ablation_seeds": 1, "worlds": list(WORLDS),
                                       "ablation_worlds": ["toolshop"]})

    def sized_testbed(self, testbed: TestbedConfig) -> TestbedConfig:
        """`testbed` with eval files large enough for this demo's dev and eval
        splits: its own sizes, or more when the demo asks for more (the base stays the same:
        `TestbedConfig.weights_digest`)."""
        tasks = self.dev_tasks + max(self.eval.episodes, self.eval.turn_trajectories)
        ood = self.dev_ood_per_family + self.eval.ood_per_family
        return testbed.model_copy(update={"n_eval": max(testbed.n_eval, tasks),
                                          "ood_eval": max(testbed.ood_eval, ood)})

    def frontier_config(self) -> FrontierConfig:
        """The frontier rule on this demo's selection measure and decoding."""
        return FrontierConfig(measure=self.select_on, decoding=self.select_decoding,
                              tolerance=self.match_tolerance)

    @model_validator(mode="after")
    def _ablation_worlds_are_trained(self) -> "DemoConfig":
        stray = sorted(set(self.ablation_worlds) - set(self.worlds))
        if stray:
            raise ValueError(f"ablation_worlds {stray} are not in worlds {self.worlds}")
        return self

    @field_validator("learning_rates")
    @classmethod
    def _lr_grids(cls, lrs: list[float] | dict[str, list[float]]) -> list[float] | dict[str, list[float]]:
        grids = lrs.values() if isinstance(lrs, dict) else [lrs]
        if any(not grid or min(grid) <= 0 for grid in grids):
            raise ValueError("every lr grid needs at least one lr, each > 0")
        unknown = sorted(set(lrs) - set(METHODS)) if isinstance(lrs, dict) else []
        if unknown:
            raise ValueError(f"learning_rates for unknown methods {unknown}; choose from {list(METHODS)}")
        return lrs

    @field_validator("methods")
    @classmethod
    def _known_methods(cls, methods: list[str]) -> list[str]:
        unknown = sorted(set(methods) - set(METHODS))
        if unknown:
            raise ValueError(f"unknown methods {unknown}; choose from {list(METHODS)}")
        return methods
