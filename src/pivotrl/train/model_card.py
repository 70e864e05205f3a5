"""The run folder's README.md: a model card pivotrl writes in place of TRL's stock one (TRL's names
no base model, `[None](https://huggingface.co/None)`, and says nothing of PivotRL). It says what
made the model: the method, the base model, the data and its split, the pivots and how they were
selected, the steps and learning rate, the final and best metrics, how to load it and the command
that made it. Pure text from `CardFacts`; the verbs gather the facts (`pivotrl.train.run_card`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from pivotrl.io.records import write_text_atomic

CARD_FILE = "README.md"
# What each verb's method is called on the card
METHODS = {"train": "PivotRL: GRPO on the pivot turns of agent trajectories (arXiv 2603.21383)",
           "sft": "SFT baseline: supervised fine-tuning on the same trajectories, loss on assistant turns",
           "e2e": "E2E RL baseline: GRPO over whole multi-turn episodes, reward = the world's success"}
TAGS = {"train": ["pivotrl", "grpo", "trl"], "sft": ["pivotrl", "sft", "trl"], "e2e": ["pivotrl", "e2e-rl"]}


class CardFacts(BaseModel):
    """What the card says about one run."""

    verb: str = Field(..., description="The verb that trained it: train, sft or e2e (METHODS).")
    output_dir: str = Field(..., description="The run folder (the model loads from it).")
    base_model: str = Field(..., description="The model training started from.")
    data: dict[str, str] = Field(default_factory=dict, description="Input files by role (pivots, "
                                 "data, tasks, split).")
    held_out: str | None = Field(None, description="What the split held out of training.")
    selection: str | None = Field(None, description="How the pivots were selected (train only).")
    items: str | None = Field(None, description="What it trained on, counted (e.g. '28 pivots').")
    steps: int = Field(0, description="Optimizer steps trained.")
    learning_rate: float | None = Field(None, description="Peak learning rate.")
    schedule: str | None = Field(None, description="Learning-rate schedule and warmup.")
    settings: dict[str, Any] = Field(default_factory=dict, description="Other run settings worth "
                                     "reading on the card (completions per pivot, budget, ...).")
    metrics: dict[str, dict[str, Any]] = Field(default_factory=dict, description="metric → final, "
                                               "best and best_step (train.metrics.final_and_best).")
    learning_signal: str | None = Field(None, description="RL runs: whether groups had mixed outcomes.")
    command: str | None = Field(None, description="The command line that started the run.")
    config_file: str | None = Field(None, description="The run config as used, in the run folder.")
    curves: str | None = Field(None, description="The learning-curve plot, in the run folder.")
    finished: bool = Field(True, description="False while the run trains (a checkpoint's card).")


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _front_matter(facts: CardFacts) -> list[str]:
    lines = ["---", "library_name: transformers", "tags:", *[f"- {t}" for t in TAGS.get(facts.verb, ["pivotrl"])]]
    # The Hub reads base_model as a Hub id: a local folder is named in the text only.
    if not Path(facts.base_model).expanduser().exists():
        lines.append(f"base_model: {facts.base_model}")
    return lines + ["---", ""]


def card_text(facts: CardFacts) -> str:
    """The model card (Markdown with the Hub's YAML front matter) for `facts`."""
    name = Path(facts.output_dir).name or facts.output_dir
    out = _front_matter(facts) + [f"# {name}", "",
                                  f"**Method:** {METHODS.get(facts.verb, facts.verb)}, trained with pivotrl.", "",
                                  f"**Base model:** `{facts.base_model}`", ""]
    if not facts.finished:
        out += [f"*Training in progress: this card describes the run at step {facts.steps}; the final "
                "card replaces it when the run ends.*", ""]
    out += ["## Data", ""]
    out += [f"- {role}: `{path}`" for role, path in facts.data.items()]
    out += [f"- {line}" for line in (facts.items, facts.held_out and f"held out: {facts.held_out}") if line]
    if facts.selection:
        out += ["", "## Pivots", "", facts.selection]
    out += ["", "## Training", "", f"- optimizer steps: {facts.steps}"]
    if facts.learning_rate is not None:
        out.append(f"- learning rate: {facts.learning_rate:g}" + (f" ({facts.schedule})" if facts.schedule else ""))
    out += [f"- {key}: {_number(value)}" for key, value in facts.settings.items()]
    if facts.learning_signal:
        out.append(f"- learning signal: {facts.learning_signal}")
    out += ["", "## Metrics", ""]
    if facts.metrics:
        out += ["| metric | final | best | best at step |", "|---|---|---|---|"]
        out += [f"| {key} | {_number(m['final'])} | {_number(m['best'])} | {m['best_step']} |"
                for key, m in facts.metrics.items()]
    else:
        out.append("No step was logged.")
    out += ["", "Every logged step is in `metrics.jsonl`"
            + (f"; the curves are in `{facts.curves}`." if facts.curves else ".")]
    out += ["", "## How to load it", "", "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "", f'model = AutoModelForCausalLM.from_pretrained("{facts.output_dir}")',
            f'tokenizer = AutoTokenizer.from_pretrained("{facts.output_dir}")', "```", "",
            "Held-out turn accuracy, scored as it was trained (its `template_settings.json`):", "", "```bash",
            f"pivotrl evaluate --model {facts.output_dir} --turns TURNS.eval.jsonl --out RESULT.json", "```"]
    out += ["", "## How it was made", ""]
    if facts.command:
        out += ["```bash", facts.command, "```", ""]
    if facts.config_file:
        again = Path(facts.output_dir) / facts.config_file
        out.append(f"The run config as used is `{facts.config_file}` in this folder (absolute paths): "
                   f"`pivotrl {facts.verb} --config {again} --output-dir NEW_DIR` runs it again.")
    return "\n".join(out) + "\n"


def write_model_card(output_dir: str | Path, facts: CardFacts) -> Path:
    """Write the card as OUTPUT_DIR/README.md (atomically: a reader never sees half of it)."""
    path = Path(output_dir) / CARD_FILE
    write_text_atomic(path, card_text(facts))
    return path
