"""The variants' reply conventions: parallel to the world's forms, never readable as the world's,
drawn uniformly and independently of the names, translated slot for slot."""

from __future__ import annotations

import string
from collections import Counter

import pytest

from pivotrl.io.records import FunctionCall, Message, ToolCall
from pivotrl_testbed.testbed.build import TestbedConfig
from pivotrl_testbed.testbed.common import read_answer
from pivotrl_testbed.testbed.experts import ExpertConfig, run_expert
from pivotrl_testbed.testbed.replies import ALTERNATIVES, WORLD_ANSWERS, draw_replies, translate_reply
from pivotrl_testbed.testbed.tasks import make_tasks
from pivotrl_testbed.testbed.variants import make_variant, translate, translate_message

WORLDS = ("toolshop", "terminal")
# Slot values as the worlds write them (one word each); `rest` holds a whole buy answer.
VALUES = {"city": "Lyon", "n": "3", "oid": "o12", "qty": "2", "product": "sock", "refund": "14",
          "new": "o99", "rest": "Order o99 is placed for 2 sock.", "f": "data.csv",
          "out": "out.txt", "level": "ERROR", "key": "port", "value": "8080", "d": "logs"}


def _slots(template: str) -> set[str]:
    return {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}


@pytest.mark.parametrize("world", WORLDS)
def test_each_alternative_is_parallel_to_the_worlds_forms(world):
    own = WORLD_ANSWERS[world]
    assert set(ALTERNATIVES[world]) == set(own)
    for kind, alternatives in ALTERNATIVES[world].items():
        for forms in alternatives:
            assert len(forms) == len(own[kind])
            assert [_slots(f) for f in forms] == [_slots(f) for f in own[kind]], (kind, forms)


@pytest.mark.parametrize("world", WORLDS)
def test_no_alternative_reads_as_any_of_the_worlds_answers(world):
    """A base that writes another convention in the world states nothing the world's checker
    can read: it is wrong there, never lucky."""
    own = WORLD_ANSWERS[world]
    for kind, alternatives in ALTERNATIVES[world].items():
        for forms in alternatives:
            for form in forms:
                text = form.format(**VALUES)
                assert read_answer(text, own) is None, (kind, text)
    # and the world's own forms do read (the check above is not vacuous)
    assert all(read_answer(f.format(**VALUES), own) is not None
               for forms in own.values() for f in forms)


def test_shared_replies_draw_each_convention_alike_and_leave_names_and_prompt_alone():
    for world in WORLDS:
        own = WORLD_ANSWERS[world]
        plain = [make_variant(world, i, names="shared", prompts="composed") for i in range(400)]
        drawn = [make_variant(world, i, names="shared", prompts="composed", replies="shared")
                 for i in range(400)]
        assert [(v.tools, v.keys, v.system) for v in drawn] == [(v.tools, v.keys, v.system) for v in plain]
        assert all(v.replies is None for v in plain)
        for kind in own:
            counts = Counter(tuple(v.replies[kind]) for v in drawn)
            assert len(counts) == 4 and tuple(own[kind]) in counts
            assert all(60 <= c <= 140 for c in counts.values()), (kind, counts)
        # kinds are drawn independently: not every variant takes the world's forms together
        together = sum(all(v.replies[k] == own[k] for k in own) for v in drawn)
        assert together < 5
    assert draw_replies("toolshop", 0, 0, "world") is WORLD_ANSWERS["toolshop"]
    with pytest.raises(ValueError, match="reply style"):
        draw_replies("toolshop", 0, 0, "free")


def test_a_reply_translates_slot_for_slot_and_a_non_answer_is_left_alone():
    forms = {k: v[0] for k, v in ALTERNATIVES["toolshop"].items()}
    assert translate_reply("Done: your order o99 is placed.", "toolshop", forms) == "Your order o99 is in."
    swap = "Order o12 is cancelled. Order o99 is placed for 2 sock."
    assert translate_reply(swap, "toolshop", forms) == "Cancelled order o12. Placed order o99 for 2 sock."
    assert translate_reply("I think so, maybe.", "toolshop", forms) is None
    forms = {k: v[2] for k, v in ALTERNATIVES["terminal"].items()}
    assert translate_reply("There are 3 ERROR lines.", "terminal", forms) == "3 ERROR lines in total."


@pytest.mark.parametrize("world", WORLDS)
def test_a_translated_trajectory_changes_its_final_answer_and_nothing_else(world):
    v = make_variant(world, 5, names="shared", replies="shared")
    plain = make_variant(world, 5, names="shared")
    changed = 0
    for task in make_tasks(world, "train", 30):
        traj = run_expert(task, 0, ExpertConfig())
        got, ref = translate(traj, v), translate(traj, plain)
        for a, b, orig in zip(got.messages, ref.messages, traj.messages):
            if orig.role == "assistant" and not orig.tool_calls and read_answer(orig.content, WORLD_ANSWERS[world]):
                kind = read_answer(orig.content, WORLD_ANSWERS[world])[0]
                assert read_answer(a.content, v.replies) is not None
                changed += a.content != orig.content
                assert (a.content == orig.content) == (v.replies[kind] == WORLD_ANSWERS[world][kind])
            else:
                assert a == b
    assert changed > 0
    # text beside a call is no final answer: left in the world's words
    answer = next(iter(WORLD_ANSWERS[world].values()))[0].format(**VALUES)
    call = Message(role="assistant", content=answer, tool_calls=[ToolCall(
        id="c1", function=FunctionCall(name=next(iter(v.tools)), arguments="{}"))])
    assert translate_message(call, v).content == answer


def test_the_reply_style_is_hashed_only_when_set():
    assert TestbedConfig(variant_replies="world").digest() == TestbedConfig().digest()
    assert TestbedConfig(variant_replies="shared").digest() != TestbedConfig().digest()
