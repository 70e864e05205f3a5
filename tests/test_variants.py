"""World variants: the worlds' trajectories under other names, with nothing of the world left."""

from __future__ import annotations

import pytest

from pivotrl_testbed.testbed.build import TestbedConfig
from pivotrl_testbed.testbed.criteria import in_domain_examples, world_list_examples
from pivotrl_testbed.testbed.experts import ExpertConfig, run_expert
from pivotrl_testbed.testbed.tasks import make_tasks, world_module
from pivotrl_testbed.testbed.variants import VariantSpec, make_variant, translate, translate_all

WEAK = ExpertConfig(noise=0.5, habit=0.7)  # mistakes of every kind, malformed calls included


def _names(traj):
    called = {c.function.name for m in traj.messages for c in (m.tool_calls or [])}
    keys = {k for m in traj.messages for c in (m.tool_calls or []) for k in c.args()}
    return called, keys


@pytest.mark.parametrize("names", ["pools", "open"])
@pytest.mark.parametrize("world", ["toolshop", "terminal"])
def test_a_translated_trajectory_keeps_nothing_of_the_world(world, names):
    mod = world_module(world)
    own_tools = {t["function"]["name"] for t in mod.TOOLS}
    own_keys = {k for t in mod.TOOLS for k in t["function"]["parameters"]["properties"]}
    trajs = [run_expert(t, 1, WEAK) for t in make_tasks(world, "train", 12, 100_000)]
    out = translate_all(trajs, world, VariantSpec(3, names=names))
    assert in_domain_examples(world, trajs) == len(trajs)
    assert in_domain_examples(world, out) == 0
    for before, after in zip(trajs, out):
        v = make_variant(world, after.metadata["variant"], names=names)
        called, keys = _names(after)
        assert not called & own_tools and not keys & own_keys
        assert called <= set(v.tools.values()) and keys <= set(v.keys.values())
        assert {t["function"]["name"] for t in after.tools} == set(v.tools.values())
        assert len(after.messages) == len(before.messages)
        # same mechanics: the same values in the same places, the user's words untouched
        for m0, m1 in zip(before.messages, after.messages):
            assert m0.role == m1.role
            if m0.role == "user":
                assert m0.content == m1.content
            for c0, c1 in zip(m0.tool_calls or [], m1.tool_calls or []):
                assert list(c0.args().values()) == list(c1.args().values())


def test_observations_and_cut_off_calls_are_renamed_consistently():
    v = make_variant("toolshop", 0)
    trajs = [run_expert(t, 1, WEAK) for t in make_tasks("toolshop", "train", 40, 100_000)]
    out = [translate(t, v) for t in trajs]
    tool_texts = [m.content for t in out for m in t.messages if m.role == "tool"]
    # an id is read under the key it is passed as
    assert any(f'"{v.key("customer_id")}":' in o for o in tool_texts)
    assert not any('"customer_id":' in o for o in tool_texts)
    cut = [m.content for t in out for m in t.messages
           if m.role == "assistant" and isinstance(m.content, str) and "<tool_call>" in m.content]
    assert cut, "the weak expert writes cut-off calls at noise 0.5"
    for text in cut:
        head = text.split('"arguments":')[0]
        assert '"name": "' in head  # the envelope's key stays
        assert not any(f'"{name}"' in text for name in v.tools)


def test_variants_differ_and_are_deterministic():
    vs = [make_variant("toolshop", i) for i in range(8)]
    assert len({tuple(v.tools.values()) for v in vs}) == 8
    assert make_variant("toolshop", 3) == vs[3]
    assert all(len(set(v.keys.values())) == len(v.keys) for v in vs)


def test_the_variants_field_leaves_the_default_hash_alone():
    assert TestbedConfig(variants=0).digest() == TestbedConfig().digest()
    assert TestbedConfig(variants=8).digest() != TestbedConfig().digest()


def test_a_configs_hash_does_not_depend_on_which_values_are_defaults():
    """A candidate made the default keeps the hash it was built (and shipped) under."""

    class CandidateAsDefault(TestbedConfig):
        variants: int = 2000
        variant_names: str = "shared"
        tokenizer_isolate_names: bool = True

    as_set = TestbedConfig(variants=2000, variant_names="shared", tokenizer_isolate_names=True)
    assert CandidateAsDefault().digest() == as_set.digest() != TestbedConfig().digest()


def test_open_names_are_not_memorisable_and_never_the_worlds_own():
    """2,000 open variants: almost every name new, none a world's or a pool's name."""
    own = {n for w in ("toolshop", "terminal") for t in world_module(w).TOOLS
           for n in [t["function"]["name"], *t["function"]["parameters"]["properties"]]}
    names = [n for i in range(2000) for v in [make_variant("toolshop", i, names="open")]
             for n in [*v.tools.values(), *v.keys.values()]]
    assert not own & set(names)
    # pools give 69 names in all; here a name recurs ~1.4 times, each time for a random tool
    assert len(set(names)) > 0.6 * len(names)
    with pytest.raises(ValueError, match="unknown name space"):
        make_variant("toolshop", 0, names="letters")


@pytest.mark.parametrize("world", ["toolshop", "terminal"])
def test_shared_names_meet_the_worlds_names_but_never_the_world(world):
    """`shared`: the world's own names occur, each in other worlds; its tool list and system
    prompt never do (criterion 1b), while the world's own trajectories hold them (the count can
    fail)."""
    trajs = [run_expert(t, 1, WEAK) for t in make_tasks(world, "train", 12, 100_000)]
    assert world_list_examples(world, trajs) == len(trajs)
    out = translate_all(trajs * 50, world, VariantSpec(600, names="shared"))
    assert world_list_examples(world, out) == 0
    assert in_domain_examples(world, out) > 0 if world == "toolshop" else True
    own = {t["function"]["name"] for t in world_module(world).TOOLS}
    seen = {t["function"]["name"] for traj in out for t in traj.tools}
    assert own <= seen


def test_the_worlds_own_share_sets_how_often_its_names_occur():
    share = lambda s: sum(v.tools[t] == t for i in range(1000)
                          for v in [make_variant("toolshop", i, names="shared", own_share=s)]
                          for t in v.tools) / 10_000
    assert share(None) == pytest.approx(1 / 7, abs=0.02)  # one choice of 7 (6 pool names + own)
    assert share(0.3) == pytest.approx(0.3, abs=0.02)
    assert make_variant("toolshop", 3, names="shared", own_share=0.3) != make_variant(
        "toolshop", 3, names="shared")


def test_composed_prompts_are_many_never_the_worlds_and_leave_the_names_alone():
    for world in ("toolshop", "terminal"):
        own = world_module(world).SYSTEM_PROMPT
        fixed = [make_variant(world, i, names="shared") for i in range(300)]
        composed = [make_variant(world, i, names="shared", prompts="composed") for i in range(300)]
        assert len({v.system for v in composed}) >= 50 > len({v.system for v in fixed})
        assert own not in {v.system for v in composed}
        assert [(v.tools, v.keys) for v in composed] == [(v.tools, v.keys) for v in fixed]
        assert all(v.tool(next(iter(v.tools))) in v.system for v in composed if world == "terminal")
    with pytest.raises(ValueError, match="prompt style"):
        make_variant("terminal", 0, prompts="free")


def test_the_tokenizer_options_make_names_and_values_copyable():
    """A call's name and key are the same tokens as in the tool list (`isolate_names`); a
    letter run joined to a digit is spelled out, as its digits are (`spell_values`)."""
    from pivotrl_testbed.testbed.tiny import build_tokenizer

    tools = ('{"type": "function", "function": {"name": "find_customer", "parameters": {"type": '
             '"object", "properties": {"email": {"type": "string"}}}}}')
    call = '{"name": "find_customer", "arguments": {"email": "Gus7@shop.io"}}'
    texts = [f"{tools}\nI am Gus7@shop.io.\n{call}"] * 50

    def pieces(tok, s):
        return [tok.decode([i]) for i in tok(s, add_special_tokens=False)["input_ids"]]

    merged = build_tokenizer(texts, vocab_size=400)
    assert "find_customer" not in pieces(merged, call)  # fused with the JSON around it
    split = build_tokenizer(texts, vocab_size=400, isolate_names=True, spell_values=True)
    assert {"find_customer", "email"} <= set(pieces(split, call)) & set(pieces(split, tools))
    assert pieces(split, "Gus7@shop.io")[:4] == ["G", "u", "s", "7"]
    assert pieces(split, "ls -A") == pieces(merged, "ls -A")  # no digit: as before
