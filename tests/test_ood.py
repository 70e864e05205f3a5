"""OOD task families: deterministic, split by problem, exact checkers."""

from __future__ import annotations

import re

import pytest

from pivotrl_testbed.testbed import ood


@pytest.mark.parametrize("family", ood.FAMILIES)
def test_generation_is_deterministic_and_split_by_problem(family):
    a = ood.generate(family, "train", 100, seed=0)
    assert a == ood.generate(family, "train", 100, seed=0)
    assert a != ood.generate(family, "train", 100, seed=1)
    ev = ood.generate(family, "eval", 50, seed=0)
    assert len({t.prompt for t in a}) == 100
    assert not {t.key for t in a} & {t.key for t in ev}
    assert all(ood.split_of(t.key) == "eval" for t in ev)
    # the key is the problem: the prompt's numbers / words appear in it
    assert all(set(re.findall(r"\d+", t.key)) == set(re.findall(r"\d+", t.prompt)) for t in ev)
    assert all(t.split == "eval" for t in ev) and all(t.family == family for t in ev)
    assert all(t.messages[0].role == "user" for t in ev)


@pytest.mark.parametrize("family", ood.FAMILIES)
def test_checker_accepts_right_and_rejects_wrong(family):
    for t in ood.generate(family, "eval", 30, seed=0):
        assert ood.check(family, t.answer, t.answer)
        assert ood.check(family, f"  {t.answer}\n", t.answer)
        assert ood.check(family, f"{t.answer}.<|im_end|>", t.answer)
        assert not ood.check(family, t.answer + "0", t.answer)
        assert not ood.check(family, "", t.answer)
        assert not ood.check(family, f"The answer is {t.answer}", t.answer)


def test_answers_are_right():
    for t in ood.generate("add", "train", 50):
        a, b = map(int, re.findall(r"\d+", t.prompt))
        assert int(t.answer) == a + b
    for t in ood.generate("sub", "train", 50):
        a, b = map(int, re.findall(r"\d+", t.prompt))
        assert int(t.answer) == a - b >= 0
    for t in ood.generate("next", "train", 50):
        (n,) = map(int, re.findall(r"\d+", t.prompt))
        assert int(t.answer) == n + 1
    for t in ood.generate("reverse", "train", 50):
        word = re.search(r"\b([a-u]{3,5})\b(?= backwards| in reverse|\.$)", t.prompt).group(1)
        assert t.answer == word[::-1]
    for t in ood.generate("upper", "train", 50):
        assert t.answer.lower() in t.prompt and t.answer == t.answer.upper()
        assert not ood.check("upper", t.answer.lower(), t.answer)  # case matters
    for t in ood.generate("recall", "train", 50):
        pairs = dict(re.findall(r"^(k\d)=(\d+)$", t.prompt, re.M))
        key = re.search(r"^(k\d)=\?$", t.prompt, re.M).group(1)
        assert t.answer == pairs[key]


def test_hostile_answers_and_unknown_family():
    assert not ood.check("add", None, "3")  # type: ignore[arg-type]
    assert not ood.check("add", "3" * 10000, "3")
    with pytest.raises(KeyError):
        ood.check("nope", "1", "1")
    with pytest.raises(ValueError):
        ood.generate("add", "dev", 1)


def test_write_and_load(tmp_path):
    counts = ood.write_ood(tmp_path / "ood", n_train=20, n_eval=5)
    assert counts == {"train": 20 * len(ood.FAMILIES), "eval": 5 * len(ood.FAMILIES)}
    back = ood.load_ood(tmp_path / "ood" / "eval.jsonl")
    assert back == [t for f in ood.FAMILIES for t in ood.generate(f, "eval", 5)]
    (tmp_path / "bad.jsonl").write_text('{"id": 1}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        ood.load_ood(tmp_path / "bad.jsonl")
