"""The shipped base is used only when it is exactly what pretraining would make here."""

from __future__ import annotations

import hashlib
import json

import pytest

from pivotrl_testbed.testbed import build as build_mod
from pivotrl_testbed.testbed import shipped
from pivotrl_testbed.testbed.build import TestbedConfig, build_testbed, load_testbed_config


def weights_digest(base_dir) -> str:
    return hashlib.sha256((base_dir / "model.safetensors").read_bytes()).hexdigest()


def test_the_shipped_base_is_the_default_configs():
    # Changing the default testbed config (or BUILD_VERSION) without rebuilding and reshipping
    # the base fails here: the shipped weights would silently stop being used.
    info = shipped.shipped_info()
    assert info is not None, "no shipped base in the package"
    assert info["config_hash"] == load_testbed_config(None).digest()
    assert not info["base_source"].startswith(("shipped", "kept"))  # weights this build trained
    assert (shipped.SHIPPED / "base" / "model.safetensors").is_file()


def test_the_written_out_configs_are_the_default_and_the_plain_recipe():
    assert load_testbed_config("configs/testbed.yaml") == load_testbed_config(None) != TestbedConfig()
    assert load_testbed_config("configs/testbed_plain.yaml") == TestbedConfig()


def test_a_shipped_build_is_reused_bit_for_bit(quick_testbed, tmp_path, monkeypatch):
    built, info = quick_testbed
    root = tmp_path / "shipped_base"
    shipped.ship(built, root)
    monkeypatch.setattr(shipped, "SHIPPED", root)
    monkeypatch.setattr(shipped.usable, "__defaults__", (root,))
    monkeypatch.setattr(shipped.install, "__defaults__", (root,))

    def no_pretraining(*args, **kwargs):
        raise AssertionError("pretrained although the shipped base matched")

    monkeypatch.setattr(build_mod, "pretrain_base", no_pretraining)
    # the costly per-position profile is the shipped record's (the same weights on the same data)
    monkeypatch.setattr(build_mod, "position_success", no_pretraining)
    again = build_testbed(tmp_path / "again", TestbedConfig().quick())
    assert again["base_source"].startswith("shipped")
    assert weights_digest(tmp_path / "again" / "base") == weights_digest(built / "base")
    # The same weights measure the same.
    assert again["base"]["in_domain"] == info["base"]["in_domain"]
    assert again["base"]["ood"] == info["base"]["ood"]
    assert again["base"]["by_position"] == info["base"]["by_position"]


def test_a_different_tokenizer_or_config_is_not_served(quick_testbed, tmp_path):
    built, info = quick_testbed
    root = tmp_path / "shipped_base"
    shipped.ship(built, root)
    quick = TestbedConfig().quick()
    assert shipped.usable(quick, built / "base", root) is not None
    assert shipped.usable(quick.model_copy(update={"ood_repeat": 3}), built / "base", root) is None
    # More eval tasks leave the weights as they are (test_eval_sizes_leave_the_base_untouched)
    assert shipped.usable(quick.model_copy(update={"n_eval": 20, "ood_eval": 12}), built / "base", root)
    other = tmp_path / "tok"
    other.mkdir()
    data = json.loads((built / "base" / "tokenizer.json").read_text())
    data["added_tokens"] = data.get("added_tokens", []) + [{"id": 99999, "content": "<x>"}]
    (other / "tokenizer.json").write_text(json.dumps(data))
    assert shipped.usable(quick, other, root) is None
    # A record whose config does not give its own hash here (another build version) serves nothing
    (root / "build.json").write_text(json.dumps({**info, "config_hash": "0" * 16}))
    assert shipped.usable(quick, built / "base", root) is None


def by_family(lines: list[str]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for line in lines:
        groups.setdefault(json.loads(line).get("family", ""), []).append(line)
    return groups


def test_eval_sizes_leave_the_base_untouched(tmp_path):
    """Why `EVAL_ONLY_FIELDS` may leave the weights' hash: a build with more eval tasks writes the
    same train, pretraining and OOD train files and trains the same tokenizer; its eval files
    start with the smaller build's (the demo's dev and eval splits are prefixes)."""
    from pivotrl_testbed.testbed.build import train_tokenizer, write_data

    quick = load_testbed_config(None).quick()  # the shipped recipe: variants, agentic OOD, false starts
    small, large = quick, quick.model_copy(update={"n_eval": 14, "ood_eval": 12})
    assert small.weights_digest() == large.weights_digest() and small.digest() != large.digest()
    toks = {}
    for name, cfg in (("small", small), ("large", large)):
        expert, weak, _, ood_train = write_data(tmp_path / name, cfg, lambda m: None)
        toks[name] = train_tokenizer(cfg, expert, weak, ood_train).backend_tokenizer.to_str()
    assert toks["small"] == toks["large"]
    for rel in sorted(p.relative_to(tmp_path / "small") for p in (tmp_path / "small").rglob("*.jsonl")):
        a, b = ((tmp_path / n / rel).read_text().splitlines() for n in ("small", "large"))
        if rel.name == "eval.jsonl":  # each world's tasks, each OOD family's, in order
            small_g, large_g = by_family(a), by_family(b)
            assert len(b) > len(a) and small_g.keys() == large_g.keys(), rel
            assert all(large_g[f][:len(lines)] == lines for f, lines in small_g.items()), rel
        else:
            assert a == b, rel


def test_a_shipped_base_is_never_reshipped(tmp_path, quick_testbed):
    built, _ = quick_testbed
    copy = tmp_path / "copy"
    (copy / "base").mkdir(parents=True)
    info = json.loads((built / "build.json").read_text())
    (copy / "build.json").write_text(json.dumps({**info, "base_source": "shipped (build hash x)"}))
    with pytest.raises(ValueError, match="not pretrained"):
        shipped.ship(copy, tmp_path / "root")


def test_a_kept_build_is_reused_with_base_from(quick_testbed, tmp_path, monkeypatch):
    """A candidate's weights, kept as a finished build's base/ and build.json, are what a later
    build of its config uses instead of pretraining again, bit for bit."""
    built, info = quick_testbed

    def no_pretraining(*args, **kwargs):
        raise AssertionError("pretrained although --base-from matched")

    monkeypatch.setattr(build_mod, "pretrain_base", no_pretraining)
    monkeypatch.setattr(build_mod, "position_success", no_pretraining)
    again = build_testbed(tmp_path / "again", TestbedConfig().quick(), base_from=built)
    assert again["base_source"].startswith(f"kept ({built})")
    assert weights_digest(tmp_path / "again" / "base") == weights_digest(built / "base")
    assert again["base"]["in_domain"] == info["base"]["in_domain"]
    assert again["base"]["by_position"] == info["base"]["by_position"]


def test_base_from_another_config_stops_with_the_reason(quick_testbed, tmp_path):
    built, _ = quick_testbed
    other = TestbedConfig().quick().model_copy(update={"ood_repeat": 3})
    with pytest.raises(ValueError, match="--base-from .*config hash"):
        build_testbed(tmp_path / "other", other, base_from=built)
    assert not (tmp_path / "other" / "build.json").exists()  # nothing pretrained or recorded
    with pytest.raises(ValueError, match="build.json: missing"):
        build_testbed(tmp_path / "none", TestbedConfig().quick(), base_from=tmp_path / "nowhere")
