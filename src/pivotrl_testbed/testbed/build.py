"""`pivotrl testbed build --out DIR`: the whole built-in testbed, built once and cached.

Writes (docs/DESIGN.md, contract):
    DIR/<world>/train.jsonl, eval.jsonl   expert Trajectory records (train / eval tasks)
    DIR/ood/train.jsonl, eval.jsonl       OOD tasks of every family
    DIR/base/                             the tiny base model + tokenizer (HF format)
    DIR/pretrain/<world>.jsonl            the weak expert's trajectories the base learned from
    DIR/pretrain/stage<N>/<world>.jsonl   those of each further stage (testbed/stages.py)
    DIR/build.json                        config, its hash, build seconds, parameter count,
                                          pretraining stats and the base's metrics

The base is made the way the issue asks: a tokenizer trained on the testbed's (train) text, a
random tiny Llama, then `pretrain` on a mixture of every OOD training task (so OOD accuracy is
high) and a weak expert's trajectories on other train tasks (a mistake on some turns: wrong ids,
early stops, malformed calls; habitual forms = its own style), so in-domain skill is partial.
Rerunning with the same config and complete outputs does nothing (the config hash in build.json).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from pivotrl_testbed.evaluate import EvalConfig
from pivotrl.io.records import write_atomic, write_text_atomic
from pivotrl.io.yaml_config import load_model
from pivotrl_testbed.testbed.common import WORLDS
from pivotrl_testbed.testbed.pretrain import PretrainConfig
from pivotrl_testbed.testbed.mixture import (agentic_tasks, pretrain_base, run_stages, trajectories,
                                             weak_trajectories)
from pivotrl_testbed.testbed.stages import PretrainStage, check_stages
from pivotrl_testbed.testbed.tiny import TinyModelConfig

BUILD_VERSION = 2  # bump when the build's code changes the data or the weights it writes
BUILD_LOG = "build.log"  # the stages and pretraining's progress, with times
# The build record's per-position skill measure: the demo's own profile of its shared data (the
# first 100 train trajectories per world, K = 8 samples at T = 1, the world's state verifier), so
# the record says where pivots can exist before any arm trains.
SKILL_TRAJECTORIES = 100
SKILL_K = 8
SKILL_MAX_NEW_TOKENS = 64


# Fields added after the first shipped build, with the value every build had before them: a
# field enters the hash only when it differs from that value, so an older config keeps its hash,
# and a config's hash does not depend on which of its values are the current defaults.
_HASHED_UNLESS: dict[str, Any] = {"variants": 0, "variant_seed": 0, "variant_names": "pools",
                                  "variant_own_share": None, "agentic_ood_families": [],
                                  "tokenizer_isolate_names": False, "tokenizer_spell_values": False,
                                  "variant_prompts": "fixed", "variant_replies": "world",
                                  "weak_slips": 0.0, "weak_false_starts": 0.0, "weak_grounding_slips": 0.0,
                                  "pretrain_stages": [], "weak_kinds": {}, "weak_grounding_terminal": "file",
                                  "ood_fraction": 1.0}
# Fields that size only the eval files. The base never reads them: the tokenizer and pretraining
# read the train side alone, and each split is drawn by itself (`write_data`, `ood.write_ood`),
# so the train files, the tokenizer and the weights are the same whatever they are
# (tests/test_shipped_base.py checks the files). A build that only asks for more eval tasks
# therefore reuses another build's weights (`weights_digest`).
EVAL_ONLY_FIELDS = ("n_eval", "ood_eval")


class TestbedConfig(BaseModel):
    """What `testbed build` makes. The field defaults are the plain recipe (a base pretrained on
    the worlds themselves, measured in docs/RESULTS.md); the default testbed is `testbed.default`."""

    __test__ = False  # not a pytest test class, despite the name

    worlds: list[str] = Field(default_factory=lambda: list(WORLDS),
                              description="Agentic worlds to include (pivotrl_testbed.testbed.tasks).")
    expert_seed: int = Field(0, description="Seed of the expert's random choice among equivalent forms.")
    n_train: int = Field(400, description="Expert trajectories per world on train tasks (SFT / pivots).")
    n_eval: int = Field(140, description="Expert trajectories per world on eval tasks: the demo's "
                        "40 dev tasks and 100 eval tasks (at 60, the eval clusters, not the seeds, "
                        "held the headline interval at ±0.0215; docs/RESULTS.md).")
    ood_train: int = Field(800, description="OOD training tasks per family (the base learns them all).")
    ood_repeat: int = Field(4, description="Times each OOD task appears per pretraining epoch: the "
                            "agentic trajectories are most of the batches (at 1×, with 600 weak "
                            "trajectories per world, the OOD skills fell to 0.58–0.65, measured).")
    ood_fraction: float = Field(1.0, gt=0, le=1, description="The share of each OOD family's "
                                "training tasks the mixture holds (its first N, each `ood_repeat` "
                                "times): a stage can rehearse OOD less than one pass of every task "
                                "per epoch. A last stage of 1,000 steps at 55% OOD examples left "
                                "OOD where the demo's SFT could not move it, at 0% erased it "
                                "(docs/RESULTS.md, candidates W and X).")
    ood_eval: int = Field(100, description="OOD eval tasks per family.")
    ood_families: list[str] = Field(
        default_factory=lambda: ["next", "reverse", "upper"],
        description="OOD families the base learns and is judged on: the ones the 2-layer base "
        "masters within the build. Measured in the 3,600-step build: reverse 0.96, upper 0.98, "
        "but add 0.28, sub 0.15, recall 0.11 — too low to show forgetting, so they are left out "
        "by default (all remain available).")
    agentic_ood_families: list[str] = Field(
        default_factory=list, description="Agentic-format OOD families (testbed/agentic_ood.py: "
        "plain_with_tools, no_tool_fits) the base is pretrained on, under the variants' tool "
        "lists, and judged on, under the worlds' own: the OOD that shares the worlds' format, "
        "where narrowing on the worlds can show up as forgetting. Empty: none, the build as "
        "before (its hash unchanged). `ood_train` / `ood_eval` tasks per family.")
    n_weak: int = Field(2000, description="Weak-expert trajectories per world in the base's "
                                          "pretraining mix (200 were memorised: train loss 0.14, "
                                          "toolshop turn accuracy 0.05; 4000 cost the OOD skills: "
                                          "upper 0.42, reverse 0.63, measured).")
    weak_noise: float = Field(0.1, description="Weak expert's mistake rate per turn (experts.ExpertConfig). "
                              "At 0.3 the base could not do toolshop's later turns (per-sample "
                              "success 0.03 at turn 3, 0 after) and solved 7% of its episodes; "
                              "at 0.1 every turn position is ≥ 0.2 (docs/RESULTS.md).")
    weak_habit: float = Field(0.7, description="Weak expert's habit: its own preferred form (experts.ExpertConfig).")
    weak_slips: float = Field(0.0, ge=0.0, le=1.0, description="Weak expert's slips "
                              "(experts.ExpertConfig, testbed/slips.py): the chance of its world's "
                              "one plausible wrong action at each step that has one, so the base "
                              "pretrains on a habit the demo's expert lacks. 0: none (no draw, the "
                              "data as before).")
    weak_false_starts: float = Field(0.0, ge=0.0, le=1.0, description="Weak expert's false "
                                     "starts (experts.ExpertConfig, testbed/slips.py): the chance "
                                     "that it opens a task with its world's wrong first call, then "
                                     "recovers; a habit at the step every task has; "
                                     "`held_out_world` tasks then open with the false start "
                                     "(testbed/agentic_ood.py). 0: none.")
    weak_grounding_slips: float = Field(0.0, ge=0.0, le=1.0, description="Weak expert's "
                                        "grounding slips (experts.ExpertConfig, testbed/slips.py): "
                                        "the share of its trajectories in which every value read "
                                        "from a listing (toolshop's order, terminal's file) is the "
                                        "listing's first entry, so the base lacks the step that "
                                        "decides most tasks. 0: none (no draw, the data as before).")
    weak_grounding_terminal: Literal["file", "output", "request"] = Field(
        "file", description="Terminal's grounding slip (experts.ExpertConfig.grounding_terminal): "
        "`file`, the listing's first file; `output`, the default output name `out.txt` where the "
        "request names another; `request`, a default for every value the request names (output "
        "file, folder, level; testbed/slips.py).")
    weak_seed: int = Field(1, description="Seed of the weak expert.")
    weak_kinds: dict[str, list[str]] = Field(default_factory=dict, description="Per world, the kinds "
                                             "of the weak expert's tasks (its KINDS; unnamed: all).")
    variants: int = Field(0, ge=0, description="0: the base is pretrained on the weak expert's "
                          "trajectories of the worlds themselves (it already knows them: no arm "
                          "could teach it anything, docs/RESULTS.md). N > 0: those trajectories "
                          "are translated into N other worlds with the same mechanics and other "
                          "tool names, argument keys and system prompts (testbed/variants.py), "
                          "round robin, and the tokenizer is trained on the pretraining text "
                          "only: the base meets the worlds only through the demo's data.")
    variant_seed: int = Field(0, description="Seed of the variants' names (variants > 0).")
    variant_names: Literal["pools", "open", "shared"] = Field(
        "pools", description="Where the variants' names come from (testbed/variants.py): small "
        "synonym pools without the world's names (the 2-layer base memorised them and never "
        "wrote an offered name it had not seen, docs/RESULTS.md), an open space of word "
        "compositions too large to memorise (no copying learnt either), or the pools with the "
        "world's own names added, never the world's whole tool list or system prompt.")
    variant_own_share: float | None = Field(
        None, ge=0.0, lt=1.0, description="`shared` only: the chance that a variant's name is "
        "the world's own (None: one choice of its pool as any other, 1 in 5–9). At None the "
        "4-layer base found toolshop's first call and terminal's first two at q < 0.1 "
        "(docs/RESULTS.md, candidate D4).")
    variant_prompts: Literal["fixed", "composed"] = Field(
        "fixed", description="The variants' system prompts (testbed/variants.py): one of three "
        "per world, or composed of an opener, a tools sentence and a closer (80 per world). With "
        "three, candidate G's base wrote one fixed tool name under terminal's own prompt "
        "(docs/RESULTS.md).")
    variant_replies: Literal["world", "shared"] = Field(
        "world", description="The variants' final-answer wording (testbed/replies.py): the "
        "world's own forms, or per kind one of three other conventions or the world's, uniformly "
        "(`shared`). Every other variant difference is in the context (tool list, prompt), so a "
        "base that reads it already knows the worlds, and SFT on the demo's data gained +0.01 "
        "over it; a reply convention is in no context and only the world's trajectories teach "
        "it. Measured (candidate M, docs/RESULTS.md): q at the reply positions fell to "
        "0.02–0.08 and SFT gained +0.03 / −0.02.")
    weak_task_start: int = Field(100_000, description="First task index of the weak expert's tasks "
                                                      "(disjoint from the expert's train tasks).")
    vocab_size: int = Field(2048, description="Tokenizer vocabulary (the testbed text saturates ~2k).")
    tokenizer_spell_values: bool = Field(
        False, description="A letter run joined to a digit (an e-mail's name, an id) is spelled "
        "letter by letter (testbed/tiny.py, build_tokenizer), as the digits are: candidate G's "
        "base copied the digit of the user's e-mail but not its name (docs/RESULTS.md).")
    tokenizer_isolate_names: bool = Field(
        False, description="Quoted identifiers (tool names, argument keys) are tokens of their "
        "own (testbed/tiny.py, build_tokenizer). False: merges span them, so a call's name and "
        "key are fused with the JSON around them into tokens the tool list never holds, and the "
        "base cannot copy them from the list (docs/RESULTS.md, \"Candidates\").")
    model: TinyModelConfig = Field(default_factory=TinyModelConfig, description="Base model shape.")
    pretrain: PretrainConfig = Field(default_factory=PretrainConfig, description="Base pretraining loop.")
    pretrain_stages: list[PretrainStage] = Field(
        default_factory=list, description="Further pretraining stages after `pretrain`, each on "
        "the previous stage's weights and a mixture remade with some data fields changed "
        "(testbed/stages.py). `--base-from` a finished build of `with_stages(k)` runs the rest.")
    eval: EvalConfig = Field(default_factory=lambda: EvalConfig(episodes=50, turn_trajectories=30),
                             description="How the base is measured for build.json.")
    workers: int = Field(4, description="Threads generating trajectories (terminal commands run "
                         "in a subprocess sandbox, so threads overlap them).")

    def variant_spec(self):
        """The variant fields as one `variants.VariantSpec`."""
        from pivotrl_testbed.testbed.variants import VariantSpec

        return VariantSpec(self.variants, self.variant_seed, self.variant_names, self.variant_own_share,
                           self.variant_prompts, self.variant_replies)

    def with_stages(self, k: int) -> "TestbedConfig":  # this config's first k further stages only
        return self.model_copy(update={"pretrain_stages": self.pretrain_stages[:k]})

    @model_validator(mode="after")
    def _stages_valid(self) -> "TestbedConfig":  # each stage's mixture, checked with the config
        return check_stages(self)

    @field_validator("agentic_ood_families")
    @classmethod
    def _known_agentic(cls, names: list[str]) -> list[str]:
        from pivotrl_testbed.testbed.agentic_ood import AGENTIC_FAMILIES

        unknown = [n for n in names if n not in AGENTIC_FAMILIES]
        if unknown:
            raise ValueError(f"unknown agentic OOD families {unknown}; known: {', '.join(AGENTIC_FAMILIES)}")
        return names

    def quick(self) -> "TestbedConfig":
        """A much smaller build for tests (~1 minute): same pipeline, tiny sizes."""
        tiny = {"steps": 20, "warmup": 5, "threads": 1, "tokens_per_batch": 1024}
        return self.model_copy(update={
            "n_train": 12, "n_eval": 8, "ood_train": 40, "ood_eval": 8, "n_weak": 12, "vocab_size": 512,
            "pretrain": self.pretrain.model_copy(update=tiny),
            "pretrain_stages": [s.model_copy(update={"pretrain": s.pretrain.model_copy(update=tiny)})
                                for s in self.pretrain_stages],
            "eval": EvalConfig(episodes=4, turn_trajectories=2, ood_per_family=8),
        })

    def digest(self) -> str:
        dump = {k: v for k, v in self.model_dump().items()
                if k not in _HASHED_UNLESS or v != _HASHED_UNLESS[k]}
        blob = json.dumps({"v": BUILD_VERSION, **dump}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def weights_digest(self) -> str:
        """The hash of what the base's weights depend on: the config's, with the eval sizes
        (`EVAL_ONLY_FIELDS`) at their defaults."""
        fields = type(self).model_fields
        return self.model_copy(update={f: fields[f].default for f in EVAL_ONLY_FIELDS}).digest()


def load_testbed_config(path: str | Path | None) -> TestbedConfig:
    """The config in a YAML file; None: the default testbed's (`testbed.default`)."""
    from pivotrl_testbed.testbed.default import DEFAULT_RECIPE

    return TestbedConfig.model_validate(DEFAULT_RECIPE) if path is None else load_model(TestbedConfig, path)


def expected_outputs(out: Path, cfg: TestbedConfig) -> list[Path]:
    files = [out / "build.json", out / "base" / "config.json", out / "base" / "tokenizer.json",
             out / "ood" / "train.jsonl", out / "ood" / "eval.jsonl"]
    for w in cfg.worlds:
        files += [out / w / "train.jsonl", out / w / "eval.jsonl"]
    return files


def is_built(out: str | Path, cfg: TestbedConfig) -> bool:
    out = Path(out)
    try:
        info = json.loads((out / "build.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return info.get("config_hash") == cfg.digest() and all(p.exists() for p in expected_outputs(out, cfg))


def write_data(out: Path, cfg: TestbedConfig, say: Callable[[str], None]) -> tuple[dict, dict, dict, list]:
    """Expert (train/eval) and weak trajectories per world, and the OOD tasks, written under
    `out`; returns (expert by (world, split), weak by world, OOD counts, OOD train tasks)."""
    from pivotrl_testbed.testbed import ood

    say("expert trajectories")
    expert, weak = {}, {}
    for w in cfg.worlds:
        for split, n in (("train", cfg.n_train), ("eval", cfg.n_eval)):
            trajs = trajectories(w, split, n, cfg.expert_seed, None, 0, cfg.workers)
            write_atomic(out / w / f"{split}.jsonl", trajs)
            expert[(w, split)] = trajs
        say(f"weak trajectories: {w}")
        weak[w] = weak_trajectories(cfg, w)
        write_atomic(out / "pretrain" / f"{w}.jsonl", weak[w])
    ood_counts = ood.write_ood(out / "ood", cfg.ood_train, cfg.ood_eval, seed=0,
                               families=cfg.ood_families, extra=agentic_tasks(cfg))
    return expert, weak, ood_counts, ood.load_ood(out / "ood" / "train.jsonl")


def train_tokenizer(cfg: TestbedConfig, expert: dict, weak: dict, ood_train: list):
    """The testbed tokenizer, trained on the rendered train text (expert — unless the base
    pretrains on variants —, weak and OOD)."""
    from pivotrl.formats.chat import template_messages
    from pivotrl_testbed.testbed.agentic_ood import expected_reply
    from pivotrl_testbed.testbed.tiny import build_tokenizer

    seed_tok = build_tokenizer([], vocab_size=300, isolate_names=cfg.tokenizer_isolate_names,
                               spell_values=cfg.tokenizer_spell_values)  # only to render texts

    def render(messages, tools):
        return seed_tok.apply_chat_template(template_messages(messages), tools=tools or None, tokenize=False)

    # With variants the worlds' own names stay out of the vocabulary's training text: a token
    # the base never saw in pretraining has an untrained embedding, and it could never write it.
    texts = [] if cfg.variants else [render(t.messages, t.tools) for (w, split), ts in expert.items()
                                      if split == "train" for t in ts]
    texts += [render(t.messages, t.tools) for ts in weak.values() for t in ts]
    texts += [render(task.messages + [expected_reply(task)], task.tools) for task in ood_train]
    return build_tokenizer(texts, vocab_size=cfg.vocab_size, isolate_names=cfg.tokenizer_isolate_names,
                           spell_values=cfg.tokenizer_spell_values)


def build_testbed(out_dir: str | Path, cfg: TestbedConfig | None = None, *, force: bool = False,
                  progress: Callable[[str], None] | None = None,
                  use_shipped_base: bool = True, base_from: str | Path | None = None) -> dict[str, Any]:
    """Build everything under `out_dir` (see module doc; `cfg` default: the default testbed's);
    returns build.json's content. The base
    comes from the package's shipped weights when they are exactly what pretraining would make
    here (`testbed.shipped`); `use_shipped_base=False` always pretrains. `base_from`: the weights
    of the finished build in that folder, under the same rule; a ValueError says why when they
    are not this build's."""
    from pivotrl_testbed.evaluate import evaluate_model
    from pivotrl_testbed.testbed import shipped
    from pivotrl_testbed.testbed.criteria import in_domain_examples, world_list_examples
    from pivotrl_testbed.testbed.tiny import load_tiny, parameter_count, save_tiny

    cfg = cfg or load_testbed_config(None)
    out = Path(out_dir)
    show = progress or (lambda msg: None)
    log_file = out / BUILD_LOG

    def say(msg: str) -> None:  # the stages, also in the build's log (pretraining: every 30 s)
        show(msg)
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with log_file.open("a", encoding="utf-8") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {msg}\n")

    if not force and is_built(out, cfg):
        return {**json.loads((out / "build.json").read_text(encoding="utf-8")), "cached": True}
    start = t0 = time.time()
    timings: dict[str, float] = {}

    def lap(name: str, t0: float) -> float:
        timings[name] = round(time.time() - t0, 1)
        return time.time()

    expert, weak, ood_counts, ood_train = write_data(out, cfg, say)
    t0 = lap("data", t0)
    say("tokenizer")
    tokenizer = train_tokenizer(cfg, expert, weak, ood_train)
    t0 = lap("tokenizer", t0)
    tokenizer.save_pretrained(out / "base")
    # Where the weights may come from: `base_from`, else the shipped bases (the default's, then
    # the one its last stage continues from), each used for the longest prefix of stages it is.
    roots = [Path(base_from)] if base_from is not None else (
        [shipped.SHIPPED, shipped.SHIPPED_S2] if use_shipped_base else [])
    ship, kept, source, stage_stats, done, root = None, None, "pretrained", [], 0, None
    for candidate in roots:
        k = kept_stages(cfg, out / "base", candidate)
        if k is not None:
            root, done = candidate, k
            break
    if base_from is not None and root is None:
        raise ValueError(f"--base-from {base_from}: not this build's base: "
                         f"{shipped.mismatch(cfg, out / 'base', Path(base_from))}")
    if root is not None:
        kept = shipped.shipped_info(root)
        name = f"kept ({base_from})" if base_from is not None else "shipped"
        if done == len(cfg.pretrain_stages):
            ship, source = kept, name
        else:
            source = (f"continued from {base_from or root} (build hash {kept['config_hash']}, "
                      f"{len(cfg.pretrain_stages) - done} further stages)")
    if ship is not None or kept is not None:
        shipped.install(out / "base", root)
        model, _ = load_tiny(out / "base")
    if ship is not None:
        source = f"{source} (build hash {ship['config_hash']})"
        say(f"base: the {source} weights (the same config, eval sizes aside; identical tokenizer)")
        stats, stage_stats = ship["pretrain"], ship.get("pretrain_stages", [])
    else:
        if kept is not None:
            say(f"base: {source}; then the rest")
            stats, stage_stats = kept["pretrain"], kept.get("pretrain_stages", [])
        else:
            model, stats = pretrain_base(cfg, tokenizer, weak, ood_train, say,
                                         checkpoint=out / "pretrain" / "state.pt",
                                         log_file=log_file, live=show)
        stage_stats = stage_stats + run_stages(out, cfg, model, tokenizer, say, log_file, show, done)
        save_tiny(model, tokenizer, out / "base")
        for state in (out / "pretrain").glob("state*.pt"):  # kept until every stage is done
            state.unlink()
    t0 = lap("pretrain", t0)

    info: dict[str, Any] = {
        "config": cfg.model_dump(), "config_hash": cfg.digest(),
        "parameters": parameter_count(model), "vocab": len(tokenizer),
        "counts": {**{f"{w}/{s}": len(v) for (w, s), v in expert.items()},
                   **{f"pretrain/{w}": len(v) for w, v in weak.items()},
                   **{f"ood/{k}": v for k, v in ood_counts.items()}},
        "weak_success": {w: sum(t.metadata.get("success", False) for t in v) / max(1, len(v))
                         for w, v in weak.items()},
        # criteria 1 and 1b: every stage's data counts
        **{key: {w: count(w, v) + sum(s[short][w] for s in stage_stats) for w, v in weak.items()}
           for key, short, count in (("pretrain_in_domain", "in_domain", in_domain_examples),
                                     ("pretrain_world_lists", "world_lists", world_list_examples))},
        "pretrain": stats,
        **({"pretrain_stages": stage_stats} if stage_stats else {}),
        "base_source": source,
    }
    say("measuring the base")
    info["base"] = evaluate_model(model, tokenizer, out, cfg.eval, progress=lambda m: say(f"base: {m}"))
    if ship is not None and "by_position" in ship.get("base", {}):
        # The same weights on the same data: the shipped build's profile (a minute of sampling,
        # which the demo's own profile of the same turns repeats); the cheap measures above are
        # redone, so a fresh build still checks that the weights measure the same.
        info["base"]["by_position"] = ship["base"]["by_position"]
    else:
        say("measuring the base: per-sample success by turn position")
        info["base"]["by_position"] = {
            w: position_success(model, tokenizer, out / w / "train.jsonl",
                                min(SKILL_TRAJECTORIES, cfg.n_train))
            for w in cfg.worlds}
    lap("evaluate", t0)
    info["timings"] = timings
    info["build_seconds"] = round(time.time() - start, 1)
    write_text_atomic(out / "build.json", json.dumps(info, indent=2) + "\n")
    return {**info, "cached": False}


def kept_stages(cfg: TestbedConfig, tokenizer_dir: Path, root: Path) -> int | None:
    """The most further stages k for which the base in `root` is what a build of
    `cfg.with_stages(k)` would make (`shipped.mismatch`), or None: the rest are trained here."""
    from pivotrl_testbed.testbed import shipped

    return next((k for k in range(len(cfg.pretrain_stages), -1, -1)
                 if not shipped.mismatch(cfg.with_stages(k), tokenizer_dir, root)), None)


def position_success(model, tokenizer, trajectories: Path, n: int = SKILL_TRAJECTORIES,
                     k: int = SKILL_K) -> dict[str, dict[str, float]]:
    """Per turn position (0-based assistant ordinal) of the first `n` trajectories: `turns`, `q`
    (mean over the turns of the share of k samples at T = 1 that the state verifier accepts: the
    base's per-sample success) and `mixed` (share of turns with some but not all samples accepted:
    where pivots can be)."""
    from pivotrl.extract import ExtractOptions, extract_turns
    from pivotrl.io.records import Trajectory, iter_valid
    from pivotrl.profile.loop import ProfileConfig, profile_stream
    from pivotrl.sampling import get_sampler
    from pivotrl.select import outcome, success_rate
    from pivotrl.verifiers import get_verifier

    turns = [t for i, traj in enumerate(iter_valid(trajectories, Trajectory)) if i < n
             for t in extract_turns(traj, ExtractOptions())[0]]
    cfg = ProfileConfig(k=k, verifier="state", seed=0, max_new_tokens=SKILL_MAX_NEW_TOKENS)
    sampler = get_sampler("hf", model, tokenizer=tokenizer, batch_size=64, device="cpu")
    by: dict[int, list] = {}
    for p in profile_stream(turns, sampler, get_verifier("state"), tokenizer, cfg):
        by.setdefault(p.turn, []).append(p)
    return {str(pos): {"turns": len(ps),
                       "q": round(sum(success_rate(p) for p in ps) / len(ps), 4),
                       "mixed": round(sum(outcome([s.reward for s in p.samples]) == "mixed"
                                          for p in ps) / len(ps), 4)}
            for pos, ps in sorted(by.items())}
