"""Worlds rule on their own answers: every pair of final answers the testbed's experts treat as
the same scores 1 under the verifiers, and an answer with one fact changed scores 0."""

from __future__ import annotations

import functools
import itertools
import re

import pytest

from pivotrl_testbed.episodes import expert_turns
from pivotrl_testbed.testbed import terminal, toolshop
from pivotrl_testbed.testbed.experts import answer_forms, generate_trajectories
from pivotrl.io.records import Message, Turn
from pivotrl.sandbox.bwrap import sandbox_available
from pivotrl.verifiers import get_verifier
from pivotrl.verifiers.world import same_answer

N_TASKS = {"toolshop": 60, "terminal": 21}


@functools.cache
def _final_turns(world: str) -> list[tuple[Turn, list[str]]]:
    out = []
    for traj in generate_trajectories(world, "train", N_TASKS[world], seed=0):
        for t in expert_turns([traj]):
            if not t.expected.tool_calls:
                out.append((t, answer_forms(world, traj.metadata["task"], t.context)))
    return out


@pytest.fixture(scope="module", params=["toolshop", "terminal"])
def finals(request):
    if request.param == "terminal" and not sandbox_available():
        pytest.skip("bubblewrap unavailable")
    return request.param, _final_turns(request.param)


def _with_expected(t: Turn, text: str) -> Turn:
    return t.model_copy(update={"expected": Message(role="assistant", content=text)})


def say(text: str) -> Message:
    return Message(role="assistant", content=text)


def test_every_equivalent_answer_pair_scores_1(finals):
    world, turns = finals
    kinds = {t.metadata["task"]["kind"] for t, _ in turns if t.metadata.get("task")} or {None}
    pairs = 0
    for name in ("state", "toolcall"):
        v = get_verifier(name)
        for t, forms in turns:
            for a, b in itertools.permutations(forms, 2):
                got = v.score(_with_expected(t, a), say(b))
                assert got.reward == 1.0, (world, name, a, b, got.reason)
                pairs += 1
    assert pairs >= 40 and kinds  # the enumeration is not empty


def _mutations(text: str) -> list[str]:
    """The answer with one fact changed: a digit, a letter of a word or name, an id."""
    out = []
    for m in re.finditer(r"\d", text):
        out.append(text[:m.start()] + str((int(m.group()) + 1) % 10) + text[m.end():])
    for m in re.finditer(r"\b[a-z][a-z]+\b|\b[a-z]+\.(?:log|csv|txt|ini)\b", text):
        word = m.group()
        if word in _TEMPLATE_WORDS:
            continue
        i = 1 if len(word) > 1 else 0
        out.append(text[:m.start() + i] + ("q" if word[i] != "q" else "z") + text[m.start() + i + 1:])
    return out


# words of the templates themselves (changing them makes a text no template matches: the world
# then gives no ruling, and the message rule decides)
_TEMPLATE_WORDS = {w.lower() for answers in (terminal.ANSWERS, toolshop.ANSWERS)
                   for templates in answers.values() for tpl in templates
                   for w in re.findall(r"[A-Za-z]+", re.sub(r"\{\w+\}", " ", tpl))}


def test_one_fact_changed_scores_0(finals):
    world, turns = finals
    v = get_verifier("state")
    checked = 0
    for t, forms in turns:
        expected = t.expected.content
        for wrong in _mutations(expected):
            if wrong == expected:
                continue
            got = v.score(t, say(wrong))
            assert got.reward == 0.0, (world, expected, wrong, got.reason)
            checked += same_answer(t, expected, wrong) is False
    assert checked >= len(turns)  # the world itself ruled on most of them


def test_world_rules_named_examples():
    turns = [(t, f) for t, f in _final_turns("toolshop") if "city" in t.expected.content]
    t = turns[0][0]
    new = re.search(r"(?:now|to) (\w+)\.", t.expected.content).group(1)
    for a, b, want in [(f"Done, I updated your city to {new}.", f"Your city is now {new}.", True),
                       (f"Your city is now {new.lower()}.", f"Your city is now {new}.", True),
                       (f"Your city is now {new}.", "Your city is now Nizza.", False)]:
        assert same_answer(t, a, b) is want, (a, b)
    # a text the world does not know gets no ruling from it (the message rule decides)
    assert same_answer(t, t.expected.content, "Your address has been changed.") is None


@pytest.mark.skipif(not sandbox_available(), reason="bubblewrap unavailable")
def test_terminal_claims_are_checked_against_the_files():
    for t, forms in _final_turns("terminal"):
        if t.metadata["task"]["kind"] == "head":
            out, n = t.metadata["task"]["out"], t.metadata["task"]["n"]
            assert same_answer(t, f"Done, see {out}.", f"Saved the first {n} lines to {out}.")
            assert same_answer(t, f"Done, see {out}.",
                               f"Saved the first {n + 1} lines to {out}.") is False
            assert same_answer(t, f"Done, see {out}.", "Done, see nothere.txt.") is False
            return
    pytest.fail("no head task among the terminal tasks")


def test_hostile_answers_get_no_ruling_and_never_crash():
    t = _final_turns("toolshop")[0][0]
    for text in ["", "Your city is now .", "Your city is now " + "a" * 30000 + ".",
                 "Order o1 is cancelled. " * 2000, "You have \x00 shipped orders.",
                 "Done: your order " + " " * 5000 + "o1 is placed.", "{n} of your orders have shipped."]:
        got = same_answer(t, t.expected.content, text)
        assert got in (None, False), (text[:40], got)


def _harmless(text: str) -> list[str]:
    """The answer as a user may write it with nothing changed: "!" or no full stop at the end,
    a file named "./f" for "f"."""
    body = text[:-1] if text.endswith(".") else text
    out = [body, body + "!", body + "!!", text + " "]
    out += [re.sub(r"(?<=\s)(\w[\w-]*\.(?:log|csv|txt|ini))", r"./\1", text, count=1)]
    return [o for o in out if o != text]


def test_harmless_punctuation_and_dot_slash_read_as_the_same_answer(finals):
    world, turns = finals
    v = get_verifier("toolcall")
    dotted = 0
    for t, forms in turns[:12]:
        for text in _harmless(t.expected.content):
            got = v.score(t, say(text))
            assert got.reward == 1.0, (world, t.expected.content, text, got.reason)
            dotted += "./" in text
        # a question or another fact is still another answer
        question = t.expected.content.rstrip(".") + "?"
        assert v.score(t, say(question)).reward == 0.0, question
    assert world == "toolshop" or dotted > 0
