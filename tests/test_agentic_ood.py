"""Agentic-format OOD probes: exact checkers both ways, the split by question, the tool lists
(the worlds' own on eval, never on pretraining), records that old files still load, the build's
config hash, and evaluation through the worlds' chat template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pivotrl_testbed.testbed import agentic_ood as aood
from pivotrl_testbed.testbed import ood
from pivotrl_testbed.testbed.tasks import world_module
from pivotrl_testbed.testbed.variants import VariantSpec

WORLDS = ["toolshop", "terminal"]


def names(tools) -> frozenset[str]:
    return frozenset(t["function"]["name"] for t in tools or [])


def call(name: str, **args) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


@pytest.mark.parametrize("family", aood.AGENTIC_FAMILIES)
def test_generation_is_deterministic_family_prefixed_and_selectable(family):
    a = aood.generate(family, "eval", 20, seed=0)
    assert a == aood.generate(family, "eval", 20, seed=0)
    assert a != aood.generate(family, "eval", 20, seed=1)
    assert all(t.family == family and aood.family_of(t.id) == family and aood.is_agentic(t.id)
               for t in a)
    assert {t.world.split("~")[0] for t in a} == set(WORLDS)  # the worlds in turn
    assert not aood.is_agentic("next-0-3") and aood.family_of("next-0-3") == "next"
    assert all("-" not in f for f in aood.AGENTIC_FAMILIES)  # the item id's family rule
    with pytest.raises(KeyError):
        aood.generate("next", "eval", 1)
    with pytest.raises(ValueError):
        aood.generate(family, "dev", 1)


def test_plain_with_tools_checker_both_ways():
    tasks = aood.generate("plain_with_tools", "eval", 30, seed=0)
    assert {t.inner for t in tasks} == set(aood.INNER_FAMILIES)
    for t in tasks:
        tool = names(t.tools)
        assert aood.check(t, t.answer) and aood.check(t, f" {t.answer}.<|im_end|>")
        assert ood.check(t.inner, t.answer, t.answer)  # the inner family's own checker agrees
        assert not aood.check(t, t.answer + "x")  # a wrong answer
        assert not aood.check(t, f"The answer is {t.answer}")
        assert not aood.check(t, call(sorted(tool)[0], command=t.answer))  # a tool call
        assert not aood.check(t, t.answer + "\n" + call(sorted(tool)[0]))  # the answer, and a call
        assert not aood.check(t, "<tool_call>\n{" + t.answer)  # unparseable
        assert not aood.check(t, "") and not aood.check(t, None)  # type: ignore[arg-type]


def test_no_tool_fits_checker_is_exact():
    tasks = aood.generate("no_tool_fits", "eval", 20, seed=0)
    assert {t.answer for t in aood.generate("no_tool_fits", "train", 200)} == set(aood.REFUSALS)
    for t in tasks:
        for form in aood.REFUSALS:
            assert aood.check(t, form) and aood.check(t, f"\n  {form}  <|im_end|>")
        refusal = aood.REFUSALS[0]
        for near in ("Sorry, I can't do that.", refusal.lower(), refusal.rstrip("."),
                     refusal + " Anything else?", "I cannot help with that."):
            assert not aood.check(t, near), near  # a near miss is a miss
        tool = sorted(names(t.tools))[0]
        assert not aood.check(t, refusal + "\n" + call(tool))  # declined, then called anyway
        assert not aood.check(t, call(tool))
        assert not aood.check(t, refusal + "<tool_call>")  # a cut-off call: unparseable


def test_held_out_world_pays_only_the_experts_first_call_as_the_variant_names_it():
    from pivotrl_testbed.testbed.experts import STEPS, FixedChooser
    from pivotrl_testbed.testbed.tasks import make_task

    tasks = aood.generate("held_out_world", "eval", 40, seed=0)
    assert {t.world.split("~")[0] for t in tasks} == set(WORLDS)
    for t in tasks:
        forms = json.loads(t.answer)
        assert forms and all(f["name"] in names(t.tools) for f in forms)
        for f in forms:
            assert aood.check(t, call(f["name"], **f["arguments"]))
            args = dict(reversed(list(f["arguments"].items())))  # key order is not the answer
            assert aood.check(t, " " + call(f["name"], **args) + "<|im_end|>")
            assert not aood.check(t, call(f["name"], **f["arguments"]) + "\n" + call(f["name"], **f["arguments"]))
            assert aood.check(t, "Sure.\n" + call(f["name"], **f["arguments"]))  # words beside it
            assert not aood.check(t, call(f["name"], **{k: v + "x" for k, v in f["arguments"].items()}))
            assert not aood.check(t, call(f["name"], **f["arguments"], extra=1))
            assert not aood.check(t, call(f["name"] + "_x", **f["arguments"]))
        # the world's own first call (the names the demo's arms train on) fails here
        world, task_id = t.world.split("~")[0], aood.question_key(t).split(" ")[1]
        step = STEPS[world](make_task(world, task_id).metadata["task"], [], FixedChooser(0))
        assert not aood.check(t, call(step[1], **step[2]))
        assert not aood.check(t, forms[0]["arguments"].get("command", "ls"))  # text
        assert not aood.check(t, "<tool_call>\n{" + json.dumps(forms[0]))  # unparseable
    assert aood.reply_text(tasks[0]) == call(json.loads(tasks[0].answer)[0]["name"],
                                             **json.loads(tasks[0].answer)[0]["arguments"])


def test_score_routes_each_task_to_its_checker():
    plain = ood.generate("next", "eval", 1)[0]
    agentic = aood.generate("no_tool_fits", "eval", 1)[0]
    assert aood.score(plain, plain.answer) and not aood.score(plain, aood.REFUSALS[0])
    assert aood.score(agentic, aood.REFUSALS[1]) and not aood.score(agentic, plain.answer)
    with pytest.raises(KeyError):
        aood.check(plain, plain.answer)


@pytest.mark.parametrize("family", aood.AGENTIC_FAMILIES)
def test_split_by_question_whatever_the_tool_list(family):
    train = aood.generate(family, "train", 400, seed=0, spec=VariantSpec(3))
    ev = aood.generate(family, "eval", 100, seed=0)
    assert len({t.key for t in train}) == 400 and len({t.key for t in ev}) == 100
    questions = {aood.question_key(t) for t in train}
    assert questions and not questions & {aood.question_key(t) for t in ev}
    assert all(ood.split_of(aood.question_key(t)) == "eval" for t in ev)
    if family == "plain_with_tools":  # the same questions, on the same side, as the plain families
        plain_train = {t.key for f in aood.INNER_FAMILIES for t in ood.generate(f, "train", 400)}
        assert not plain_train & {aood.question_key(t) for t in ev}


@pytest.mark.parametrize("space", ["pools", "open", "shared"])
@pytest.mark.parametrize("variants", [0, 3])
def test_eval_uses_the_worlds_own_lists_and_pretraining_never(space, variants):
    own = {w: (names(world_module(w).TOOLS), world_module(w).SYSTEM_PROMPT) for w in WORLDS}
    for family in aood.AGENTIC_FAMILIES:
        train = aood.generate(family, "train", 60, spec=VariantSpec(variants, 2, space))
        for t in aood.generate(family, "eval", 20, spec=VariantSpec(variants, 2, space)):
            assert [m.role for m in t.messages] == ["system", "user"]
            if family != "held_out_world":
                assert (names(t.tools), t.system) == own[t.world]
                assert t.tools == world_module(t.world).TOOLS
                continue
            # held out: a variant past every build's index, never the world's own list (in the
            # small pools a name set can recur; in the open space every name is new)
            world, index = t.world.split("~")
            assert int(index) >= aood.HELD_OUT_VARIANT_START
            assert names(t.tools) != own[world][0] and t.system != own[world][1]
            if space == "open":
                assert not names(t.tools) & {n for x in train for n in names(x.tools)}
        assert len({t.world for t in train}) == 2 * (variants or aood.DEFAULT_VARIANTS)
        for t in train:
            world = t.world.split("~")[0]
            assert names(t.tools) not in {n for n, _ in own.values()}
            assert t.system not in {s for _, s in own.values()} and t.system
            assert len(t.tools) == len(world_module(world).TOOLS)


def test_records_round_trip_and_old_files_still_load(tmp_path):
    extra = {"train": aood.generate("no_tool_fits", "train", 4),
             "eval": aood.generate("plain_with_tools", "eval", 3)}
    counts = ood.write_ood(tmp_path / "ood", n_train=2, n_eval=2, families=["next"], extra=extra)
    assert counts == {"train": 6, "eval": 5}
    back = ood.load_ood(tmp_path / "ood" / "eval.jsonl")
    assert back == ood.generate("next", "eval", 2) + extra["eval"]
    rec = json.loads((tmp_path / "ood" / "eval.jsonl").read_text().splitlines()[-1])
    assert rec["messages"][0] == {"role": "system", "content": extra["eval"][-1].system}
    # A plain record is written as before the agentic fields existed, and such a record loads.
    plain = ood.generate("next", "eval", 1)[0]
    assert set(plain.to_json()) == {"id", "family", "prompt", "answer", "split", "key", "messages"}
    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps({"id": "next-0-1", "family": "next", "prompt": "Next number after 4?",
                               "answer": "5", "split": "eval", "key": "next 4"}) + "\n")
    (task,) = ood.load_ood(old)
    assert task.tools is None and task.system == "" and [m.role for m in task.messages] == ["user"]


def test_config_field_keeps_the_default_hash_and_feeds_pretraining():
    from pivotrl_testbed.testbed.build import TestbedConfig
    from pivotrl_testbed.testbed.mixture import agentic_tasks, pretrain_examples
    default = TestbedConfig()
    assert "agentic_ood_families" in default.model_dump()
    assert default.digest() == "3f290861694211d1"  # the plain recipe's hash before the field
    on = TestbedConfig(agentic_ood_families=["plain_with_tools", "no_tool_fits"])
    assert on.digest() != default.digest()
    with pytest.raises(ValueError):
        TestbedConfig(agentic_ood_families=["plain-with-tools"])
    assert agentic_tasks(default) == {"train": [], "eval": []}

    small = on.model_copy(update={"ood_train": 6, "ood_eval": 4})
    got = agentic_tasks(small)
    assert [len(got["train"]), len(got["eval"])] == [12, 8]
    plain = ood.generate("next", "train", 2)
    examples = pretrain_examples({}, plain + got["train"], ood_repeat=2)
    assert len(examples) == 2 * 14
    assert examples[0] == {"messages": [{"role": "user", "content": plain[0].prompt},
                                        {"role": "assistant", "content": plain[0].answer}],
                           "tools": None}  # the plain tasks' examples as before
    agentic = examples[2:14]
    own = {names(world_module(w).TOOLS) for w in WORLDS}
    assert all(e["messages"][0]["role"] == "system" and e["tools"] for e in agentic)
    assert not {names(e["tools"]) for e in agentic} & own
    assert all(e["messages"][-1]["content"] == t.answer for e, t in zip(agentic, got["train"]))


def test_held_out_world_pretrains_and_drifts_on_its_call(tiny_model_dir):
    from pivotrl_testbed.drift import ood_texts
    from pivotrl_testbed.testbed.build import TestbedConfig
    from pivotrl_testbed.testbed.mixture import agentic_tasks, pretrain_examples
    from pivotrl_testbed.testbed.tiny import load_tiny

    got = agentic_tasks(TestbedConfig(agentic_ood_families=["held_out_world"], ood_train=4,
                                      ood_eval=2, variants=3))
    for e, t in zip(pretrain_examples({}, got["train"]), got["train"]):
        (c,) = e["messages"][-1]["tool_calls"]  # a call, not the answer's JSON as text
        assert "content" not in e["messages"][-1]
        assert {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])} \
            == json.loads(t.answer)[0]
    _, tok = load_tiny(tiny_model_dir)
    (text,) = ood_texts(tok, got["eval"][:1])
    assert aood.reply_text(got["eval"][0]) in text


def test_evaluation_renders_tools_and_scores_by_the_parser(tiny_model_dir, monkeypatch):
    from pivotrl.formats.chat import prompt_text
    from pivotrl_testbed.episodes import ModelPolicy
    from pivotrl_testbed.drift import ood_texts
    from pivotrl_testbed.evaluate import evaluate_ood
    from pivotrl_testbed.testbed.tiny import load_tiny

    model, tok = load_tiny(tiny_model_dir)
    pw = aood.generate("plain_with_tools", "eval", 2)
    nf = aood.generate("no_tool_fits", "eval", 2)
    nx = ood.generate("next", "eval", 1)
    ho = aood.generate("held_out_world", "eval", 2)
    tasks = pw + nf + nx + ho
    completions = [pw[0].answer, call("run", command="echo " + pw[1].answer),  # text; a call
                   aood.REFUSALS[2], "<tool_call>\n{broken", nx[0].answer,  # refusal; unparseable
                   aood.reply_text(ho[0]), ho[1].prompt]  # the held-out call; text
    prompts: list[str] = []

    def fake(self, contexts, tools):
        prompts.extend(prompt_text(self.tokenizer, c, t) for c, t in zip(contexts, tools))
        return completions[:len(contexts)]

    monkeypatch.setattr(ModelPolicy, "act_batch", fake)
    items: list[dict] = []
    got = evaluate_ood(model, tok, tasks, items=items)
    assert [r["outcome"] for r in items] == [1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0]
    assert {f: v["accuracy"] for f, v in got.items()} == {
        "plain_with_tools": 0.5, "no_tool_fits": 0.5, "next": 1.0, "held_out_world": 0.5}
    for task, prompt in zip(tasks, prompts):
        if task.family == "held_out_world":  # the variant's own system prompt and tools
            assert task.system in prompt and all(n in prompt for n in names(task.tools))
            continue
        mod = world_module(task.world) if task.world else None
        if mod is None:  # the plain family: one user message, no tools
            assert prompt == prompt_text(tok, task.messages, [])
            assert "<tools>" not in prompt
        else:  # the worlds' system prompt and tools, through the worlds' template
            assert mod.SYSTEM_PROMPT in prompt and task.prompt in prompt
            assert all(n in prompt for n in names(mod.TOOLS))
    texts = ood_texts(tok, [nf[0], nx[0]])
    assert nf[0].system in texts[0] and all(n in texts[0] for n in names(nf[0].tools))
    assert nx[0].prompt in texts[1] and "<tools>" not in texts[1]


def test_a_shared_variant_with_the_worlds_own_names_is_passed_over():
    from pivotrl_testbed.testbed.variants import make_variant

    kept = [seed for seed in range(20)
            if any(make_variant("terminal", i, seed, "shared").tools["run"] == "run" for i in range(3))]
    assert kept  # the shared space does draw terminal's own tool name: there is something to skip
    for seed in kept:
        offered = aood.offers("terminal", "train", VariantSpec(3, seed, "shared"))
        assert len(offered) == 3 and all(names(o.tools) != {"run"} for o in offered)


def test_held_out_world_opens_with_the_false_start_and_trains_only_the_call_after_it(
        tiny_model_dir, tmp_path):
    from pivotrl_testbed.testbed.build import TestbedConfig
    from pivotrl_testbed.testbed.mixture import agentic_tasks, pretrain_examples
    from pivotrl_testbed.testbed.pretrain import encode_examples
    from pivotrl_testbed.testbed.tiny import load_tiny

    cfg = TestbedConfig(agentic_ood_families=["held_out_world"], ood_train=4, ood_eval=4,
                        variants=3, weak_false_starts=0.6)
    opened, plain = agentic_tasks(cfg), agentic_tasks(cfg.model_copy(update={"weak_false_starts": 0}))
    for split in ("train", "eval"):
        # the same tasks and answers; only the context grows by the false start and its error
        assert [(t.id, t.answer) for t in opened[split]] == [(t.id, t.answer) for t in plain[split]]
        for t, p in zip(opened[split], plain[split]):
            assert [m.role for m in p.messages] == ["system", "user"]
            assert [m.role for m in t.messages] == ["system", "user", "assistant", "tool"]
            (wrong,) = t.messages[2].tool_calls
            assert wrong.function.name in names(t.tools)  # named as the task's list names it
            assert "no customer" in t.messages[3].content or "No such file" in t.messages[3].content
            assert not aood.check(t, call(wrong.function.name, **wrong.args()))  # never paid
            assert aood.expected_reply(t).tool_calls[0].id == "call_1"
    ood.write_ood(tmp_path / "ood", n_train=1, n_eval=1, families=["next"], extra=opened)
    assert ood.load_ood(tmp_path / "ood" / "eval.jsonl")[1:] == opened["eval"]
    assert [m.role for m in ood.load_ood(tmp_path / "ood" / "eval.jsonl")[1].messages][2:] \
        == ["assistant", "tool"]

    _, tok = load_tiny(tiny_model_dir)
    examples = pretrain_examples({}, opened["train"] + plain["train"])
    assert [e.get("context_messages") for e in examples] == [4] * 4 + [None] * 4
    cut = encode_examples(tok, examples[:1], 2048)
    whole = encode_examples(tok, [{k: v for k, v in examples[0].items() if k != "context_messages"}], 2048)
    ((ids, mask),), ((ids2, mask2),) = cut, whole
    assert ids == ids2
    trained = tok.decode([i for i, m in zip(ids, mask) if m])
    assert aood.reply_text(opened["train"][0]) in trained
    assert opened["train"][0].messages[2].tool_calls[0].function.name not in trained
    assert sum(mask2) > sum(mask)  # without the cut the false start would be taught too


def test_ood_fraction_keeps_each_familys_first_tasks_and_the_older_hashes():
    """A stage may rehearse a share of each OOD family: its first ceil(share × n) tasks, every
    family alike (plain and agentic-format), `ood_repeat` times; at 1.0 (the default) the
    mixture and every older config's hash are as before."""
    from pivotrl_testbed.testbed.build import TestbedConfig, load_testbed_config
    from pivotrl_testbed.testbed.mixture import agentic_tasks, pretrain_examples

    on = TestbedConfig(agentic_ood_families=["plain_with_tools", "no_tool_fits"], ood_train=10, ood_eval=2)
    tasks = ood.generate("next", "train", 10) + ood.generate("reverse", "train", 10) + agentic_tasks(on)["train"]
    every = pretrain_examples({}, tasks, ood_repeat=2)
    tenth = pretrain_examples({}, tasks, ood_repeat=2, ood_fraction=0.1)
    assert len(every) == 2 * 40 and len(tenth) == 2 * 4  # one task of each of the 4 families
    firsts = [t for i, t in enumerate(tasks) if i % 10 == 0]
    assert [e["messages"][-1] for e in tenth[:4]] == [e["messages"][-1] for e in pretrain_examples({}, firsts)]
    assert len(pretrain_examples({}, tasks, ood_fraction=0.25)) == 4 * 3  # ceil(2.5)
    assert TestbedConfig(ood_fraction=1.0).digest() == TestbedConfig().digest() == "3f290861694211d1"
    assert TestbedConfig(ood_fraction=0.1).digest() != TestbedConfig().digest()
    with pytest.raises(ValueError):
        TestbedConfig(ood_fraction=0.0)
    candidates = Path(__file__).parent.parent / "docs" / "results" / "candidates"
    assert load_testbed_config(candidates / "w" / "config.yaml").digest() == "f98409f68428b105"
    assert load_testbed_config(candidates / "x" / "config.yaml").digest() == "3f32ea123b58e5d5"
    assert load_testbed_config(candidates / "y" / "config.yaml").digest() == "efdc315362a9f520"
    assert load_testbed_config(candidates / "z" / "config.yaml").digest() == "d5244677a1d2ff2b"
