"""A profile that profiled nothing is an error naming its cause and the fix for the backend in
use, and a flag the chosen backend would ignore is refused before anything loads.

The README's model (the testbed's shipped base) has a 2,048-token context: turns whose prompt is
longer are set aside. When every turn is, `pivotrl profile` exits 1 (its rejects file and stats
written), saying that the hf backend's context is the model's own (`--max-model-len` is vLLM's),
and `pivotrl select` on the empty file says why it is empty."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from pivotrl.cli import app
from pivotrl.sampling.pipeline import longer_context_fix

ROOT = Path(__file__).resolve().parents[1]
SHIPPED_BASE = ROOT / "src" / "pivotrl_testbed" / "testbed" / "shipped_base" / "base"


def run(*argv: object):
    result = CliRunner().invoke(app, [str(a) for a in argv], env={"COLUMNS": "200"})
    return result, " ".join(result.output.split())  # rich may wrap a long message


def write_turns(path: Path, words: list[int]) -> Path:
    """One turn per entry, its user message `n` words long (3,000 words: far past 2,048 tokens)."""
    path.write_text("".join(json.dumps({
        "id": f"t{i}/1", "trajectory_id": f"t{i}", "turn": 1, "tools": [],
        "context": [{"role": "user", "content": " ".join(f"word{j}" for j in range(n))}],
        "expected": {"role": "assistant", "content": "ok"}}) + "\n" for i, n in enumerate(words)))
    return path


def test_every_prompt_too_long_is_an_error_naming_the_hf_fix(tmp_path):
    turns, out = write_turns(tmp_path / "turns.jsonl", [3000, 3000]), tmp_path / "profile.jsonl"
    result, text = run("profile", turns, "--model", SHIPPED_BASE, "--k", "2", "--max-new-tokens", "4",
                       "--verifier", "exact", "--out", out, "--no-progress")
    assert result.exit_code == 1, text
    assert "0 turns profiled: all 2 turns' prompts are longer than the engine takes (2047 tokens" in text
    assert "no flag raises (--max-model-len is the vllm backend's)" in text
    rejects = [json.loads(line) for line in (tmp_path / "profile.rejects.jsonl").read_text().splitlines()]
    assert len(rejects) == 2 and all("the hf backend takes the model's own context" in r["reason"]
                                     and "raise max_model_len" not in r["reason"] for r in rejects)
    stats = json.loads((tmp_path / "profile.stats.json").read_text())
    assert stats["outcomes"]["turns"] == 0 and len(stats["runs"][-1]["too_long"]) == 2

    # select on what that run left says why the file is empty, not only that it is
    result, text = run("select", out, "--out", tmp_path / "pivots.jsonl", "--no-plot")
    assert result.exit_code == 1, text
    assert "0 profiles: the profile run that wrote it set all 2 turns aside as longer than the engine" in text


def test_some_prompts_too_long_is_a_note_with_the_fix(tmp_path):
    turns, out = write_turns(tmp_path / "turns.jsonl", [3, 3000]), tmp_path / "profile.jsonl"
    result, text = run("profile", turns, "--model", SHIPPED_BASE, "--k", "1", "--max-new-tokens", "4",
                       "--verifier", "exact", "--out", out, "--no-progress")
    assert result.exit_code == 0, text
    assert len(out.read_text().splitlines()) == 1
    assert "1 prompts longer than the engine takes set aside" in text
    assert "no flag raises" in text


def test_flags_the_backend_ignores_are_refused(tmp_path):
    turns = write_turns(tmp_path / "turns.jsonl", [3])
    common = ["profile", turns, "--model", SHIPPED_BASE, "--out", tmp_path / "p.jsonl", "--no-progress"]
    for flags, says in ((["--max-model-len", "4096"], "do not apply to --backend hf (it takes none"),
                        (["--max-model-len", "4096", "--dry-run"], "do not apply to --backend hf"),
                        (["--concurrency", "4"], "--concurrency is an option of --backend openai, and "
                                                 "--backend hf ignores it"),
                        (["--backend", "vllm", "--batch-size", "8"], "--batch-size is an option of "
                                                                     "--backend hf, and --backend vllm ignores it")):
        result, text = run(*common, *flags)
        assert result.exit_code == 2 and says in text, (flags, text)
    assert not (tmp_path / "p.jsonl").exists()

    result, text = run("evaluate", "--model", SHIPPED_BASE, "--turns", turns, "--out", tmp_path / "r.json",
                       "--served-model-name", "m")
    assert result.exit_code == 2 and "--served-model-name is an option of --backend openai" in text, text


def test_each_backend_names_its_own_fix():
    class Engine:
        def __init__(self, name):
            self.name = name

    assert "raise --max-model-len" in longer_context_fix(Engine("vllm"))
    assert "start the server with a longer context" in longer_context_fix(Engine("openai"))
    assert "which no flag raises" in longer_context_fix(Engine("hf"))
