"""Text rules shared by the verifiers: facts in text, token similarity, the final-message rule.

A final message (the expert answered the user instead of calling a tool) is equal to the
expert's when, in this order:

1. Facts are equal *as values and in order*: numbers (sign, decimal point and thousands
   separators read: "-5" != "5", "1.5" != "15", "1,000" == "1000", "30.00" == "30", number
   words "two" == "2"), identifiers (any token holding a digit or id punctuation: "o12",
   "#W123", "app.log", "2024-01-02", "12/1/2024", e-mails, paths, URLs) compared exactly but
   for case. A wrong count or id is a wrong answer, however similar the rest of the sentence.
   Order is kept so that "return 2 of 3" is not "return 3 of 2".
2. Negations are equal, each with the word it denies (the next fact or content word): "not",
   "no", "never", "n't", "cannot", "none", "without", "unable", "failed", …. "has been
   cancelled" is not "has not been cancelled", and "could not find it" is not "could find it,
   no problem" (same count, another word denied).
3. The remaining *content words* (stopwords such as articles, pronouns and auxiliaries dropped,
   inflection stripped: "cancelled" == "cancel") may differ only on one side: words the
   candidate adds or drops, at most (1 − threshold) · n of them (n = the longer side's count,
   rounded down), never a word *replaced* by another (a word on each side that the other lacks):
   "shipped" in place of "cancelled" is a different claim, "Thanks!" added is not.
   Content words are compared as multisets (clauses may be reordered; facts keep their order).
4. A message with no word at all ("!!!", an emoji) equals only the same text.
5. A message more than twice as long as the expert's (+ 10 words) is not the same answer, even
   when the extra words are stopwords ("thanks thanks …"): padding must not be free.

A refusal is *not* a free pass. Two refusals are equal under `refusal_match` only when both say
that no available tool/function can serve the request (the decision BFCL's irrelevance turns
test: call nothing), neither claims to have done something, the expert's message is short (a
refusal, not an answer with an apology in it), and their facts are equal. Anything that needs
judgement (reworded answers, synonyms) belongs to the LLM judge (`message_rule: judge`).
"""

from __future__ import annotations

import re
from collections import Counter
from difflib import SequenceMatcher

_WORD = re.compile(r"\w+")

# Number words a reworded answer uses for small counts ("two orders" == "2 orders").
_NUMBER_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty".split())}
_NUMBER_WORDS.update({"thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70,
                      "eighty": 80, "ninety": 90, "hundred": 100, "thousand": 1000})
# Words that deny or reverse a claim, counted on each side ("failed to cancel" is no cancel).
_NEGATIONS = frozenset(
    "not no never none nothing nobody nowhere neither nor cannot without unable n't nt fail fails "
    "failed failing failure unsuccessful unsuccessfully refused denied".split())
# Words that carry no claim of their own: articles, pronouns, auxiliaries, courtesy, place
# prepositions. Modal verbs, quantifiers, "or" and direction words ("to", "from", "into", "off",
# "all", "only", "will") are NOT here: they change what a sentence says.
_STOPWORDS = frozenset("""
a an the this that these those it its it's i me my mine we us our ours you your yours he him his
she her hers they them their theirs is are was were be been being am has have had having do does
did done here there so just now also please ok okay sure hi hello hey dear thanks thank well
oh yes yeah great of as at by in on for with about and
""".split())

# Chunks are whitespace-separated; punctuation at a chunk's edges is dropped except a sign or
# currency in front of a digit, "#"/"@" in front of an id and a trailing "%".
_EDGE = re.compile(r"^[^\w#@$€£+\-−]+|[^\w%]+$")
_NUMBER = re.compile(r"[-−+]?[$€£]?(\d[\d,]*(?:\.\d+)?)%?")
_THOUSANDS = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_ID_MARK = re.compile(r"[\d.\-_/:@#+]")
_CONTRACTION = re.compile(r"\b(\w*?)n't\b", re.I)
_EXPANDED = {"ca": "can", "wo": "will", "sha": "shall", "ai": "is"}


def _expand(m: re.Match) -> str:
    """"can't" -> "can n't", "won't" -> "will n't", "isn't" -> " n't" after "is"."""
    stem = m.group(1)
    return _EXPANDED.get(stem.lower(), stem) + " n't"


def _number(tok: str) -> str | None:
    """Canonical text of a number token ("-1,000.50" -> "-1000.5"), None if not a number."""
    m = _NUMBER.fullmatch(tok)
    if not m:
        return None
    digits = m.group(1)
    if "," in digits:
        if not _THOUSANDS.fullmatch(digits):
            return None  # "1,5" is not a thousands-grouped number: keep it as an identifier
        digits = digits.replace(",", "")
    sign = "-" if tok[0] in "-−" else ""
    if "." in digits:
        digits = digits.rstrip("0").rstrip(".")
    digits = digits.lstrip("0") or "0"
    if digits.startswith("."):
        digits = "0" + digits
    return ("" if digits == "0" else sign) + digits + ("%" if tok.endswith("%") else "")


def _stem(word: str) -> str:
    """A crude stemmer: enough to equate "cancelled"/"cancel", "orders"/"order"."""
    if len(word) > 4 and word.endswith("ies"):
        word = word[:-3] + "y"
    elif len(word) > 4 and word.endswith("ied"):
        word = word[:-3] + "y"
    elif len(word) > 5 and word.endswith("ing"):
        word = word[:-3]
    elif len(word) > 4 and word.endswith("ed"):
        word = word[:-2]
    elif len(word) > 3 and word.endswith("es") and word[-3] in "sxz":
        word = word[:-2]
    elif len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        word = word[:-1]
    if len(word) > 3 and word[-1] == word[-2] and word[-1] not in "aeiouls":
        word = word[:-1]  # "cancell" -> "cancel", "shipp" -> "ship"
    if len(word) > 3 and word.endswith("ll"):
        word = word[:-1]
    return word


class TextFacts:
    """What the message rule compares: facts in order, negations with the word each one denies
    (the next fact or content word: "not cancelled" -> "cancel"), content words."""
    __slots__ = ("facts", "negations", "content", "words")

    def __init__(self, text: str):
        facts: list[str] = []
        content: list[str] = []
        scopes: list[str] = []
        open_ = words = 0  # negations still waiting for the word they deny
        text = _CONTRACTION.sub(_expand, text.replace("’", "'"))
        for chunk in text.split():
            tok = _EDGE.sub("", chunk)
            if tok[:1] in "+-−$€£" and not tok[1:2].isdigit() and tok[1:2] not in "$€£":
                tok = tok.lstrip("+-−$€£")  # a dash or sign before a word is punctuation
            if not tok:
                continue
            low = tok.casefold()
            words += 1
            num = _number(low)
            if low in ("n't", "'t") or low in _NEGATIONS:
                open_ += 1
                continue
            if num is not None:
                word = num
                facts.append(num)
            elif low in _NUMBER_WORDS:
                word = str(_NUMBER_WORDS[low])
                facts.append(word)
            elif _ID_MARK.search(low):
                word = low
                facts.append(low)  # an identifier: exact but for case
            elif low.startswith("'"):
                continue  # "'s", "'ll", "'ve": possessives and contractions
            else:
                low = low[:-2] if low.endswith("'s") else low
                if low in _STOPWORDS:
                    continue
                word = _stem(low)
                content.append(word)
            if open_ and word != "to":
                scopes.extend([word] * open_)
                open_ = 0
        scopes.extend([""] * open_)
        self.facts, self.content, self.words = facts, content, words
        self.negations = tuple(sorted(scopes))


def facts_differ(expected: TextFacts, candidate: TextFacts) -> str:
    """"" when facts and negations agree, else what differs."""
    if expected.facts != candidate.facts:
        return (f"facts differ: {' '.join(candidate.facts) or '(none)'} vs expert's "
                f"{' '.join(expected.facts) or '(none)'}")
    if expected.negations != candidate.negations:
        shown = [", ".join(f"not {w}".strip() for w in n) or "none"
                 for n in (candidate.negations, expected.negations)]
        return f"negations differ ({shown[0]} vs expert's {shown[1]})"
    return ""


def content_differs(expected: list[str], candidate: list[str], threshold: float) -> str:
    """Rule 3 of the module docstring: one-sided additions/drops within the budget, no swaps."""
    e, c = Counter(expected), Counter(candidate)
    only_e, only_c = e - c, c - e
    if not only_e and not only_c:
        return ""
    if only_e and only_c:
        swap = next(iter(only_c)), next(iter(only_e))
        return f"wording differs ({swap[0]!r} where the expert says {swap[1]!r})"
    extra = sum((only_e or only_c).values())
    budget = int((1.0 - threshold) * max(len(expected), len(candidate)) + 1e-9)
    if extra > budget:
        return f"{extra} content words differ (at most {budget})"
    return ""


_TOOL_WORD = r"(?:functions?|tools?|apis?|capabilit(?:y|ies))"
_TOOL_REFUSAL = re.compile(
    r"\bnone of the (?:\w+ ){0,2}" + _TOOL_WORD
    + r"|\bno (?:\w+ ){0,2}" + _TOOL_WORD
    + r"|\b" + _TOOL_WORD + r" (?:\w+ ){0,3}(?:don't|do not|doesn't|does not|cannot|can't|can not"
    r"|are not|aren't|is not|isn't|won't|will not|lack)\b"
    + r"|\b(?:with|using|through|via|by) (?:the |these |my |any )?(?:\w+ ){0,2}" + _TOOL_WORD
    + r"\b(?: i have| available| provided| given| at hand)?"
    r"|\b(?:don't|do not|doesn't|does not) have (?:access to )?(?:a |an |any )?(?:\w+ ){0,2}"
    + _TOOL_WORD, re.I)
_DECLINE = re.compile(r"\b(?:cannot|can ?not|can't|unable|not able|not possible|none|no|"
                      r"don't|do not|doesn't|does not|isn't|aren't|not)\b", re.I)
_CLAIM = re.compile(r"\b(?:done|completed?|successfully|has been|have been|is now|are now|here is|"
                    r"here are|here's|i(?:'ve| have) (?:\w+ed|sent|made|done|put|set|bought|paid|"
                    r"found|got|taken|given))\b", re.I)
MAX_REFUSAL_WORDS = 40


def is_tool_refusal(text: str, facts: TextFacts | None = None) -> bool:
    """Does the message decline because no available tool/function fits, and only that?"""
    text = text.replace("’", "'")
    words = (facts or TextFacts(text)).words
    return (words <= MAX_REFUSAL_WORDS and bool(_TOOL_REFUSAL.search(text))
            and bool(_DECLINE.search(text)) and not _CLAIM.search(text))


_EXPECTED: dict[str, TextFacts] = {}


def expected_facts(text: str) -> TextFacts:
    """TextFacts of an expert's text, cached: K samples of a turn compare against one text."""
    hit = _EXPECTED.get(text)
    if hit is None:
        if len(_EXPECTED) > 4096:
            _EXPECTED.clear()
        hit = _EXPECTED[text] = TextFacts(text)
    return hit


def compare_messages(expected: str, candidate: str, threshold: float,
                     refusal_match: bool = True) -> str:
    """"" when `candidate` says what `expected` says under the rules of this module."""
    if not candidate.strip():
        return "empty message"
    ef, cf = expected_facts(expected), TextFacts(candidate)
    if cf.words > 2 * ef.words + 10:
        return f"message of {cf.words} words where the expert wrote {ef.words}"
    if ef.words == 0 or cf.words == 0:
        same = " ".join(expected.split()) == " ".join(candidate.split())
        return "" if same else "a message without words matches only the same text"
    if refusal_match and is_tool_refusal(expected, ef) and is_tool_refusal(candidate, cf):
        return "" if ef.facts == cf.facts else facts_differ(ef, cf)
    return facts_differ(ef, cf) or content_differs(ef.content, cf.content, threshold)


# ---------------------------------------------------------------- free text


def _typo(a: str, b: str) -> bool:
    """One inserted, dropped, replaced or swapped letter in a word of 4+ letters. Antonyms that
    look alike ("increase"/"decrease", "enable"/"disable", "lock"/"unlock") are 2+ apart."""
    if min(len(a), len(b)) < 4 or abs(len(a) - len(b)) > 1 or a.isdigit() or b.isdigit():
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1
                                  and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]])
    short, long_ = (a, b) if len(a) < len(b) else (b, a)
    i = next((i for i in range(len(short)) if short[i] != long_[i]), len(short))
    return short[i:] == long_[i + 1:]


_OPERATORS = re.compile(r"[<>=+*/%&|^~]")


def free_text_differs(expected: str, candidate: str, threshold: float) -> str:
    """"" when two free texts say the same: token similarity >= threshold, the same facts and
    negations in the same order, the same operator symbols (< > = + * / % & | ^ ~), and every
    replaced word a typo of the expert's word (words may be added or dropped within the
    threshold, never swapped for another word)."""
    if token_similarity(expected, candidate, threshold) < threshold:
        return "text differs"
    diff = facts_differ(TextFacts(expected), TextFacts(candidate))
    if diff:
        return diff
    if Counter(_OPERATORS.findall(expected)) != Counter(_OPERATORS.findall(candidate)):
        return "operators differ"  # "a > 5" is not "a < 5"; words alone do not show it
    ta, tb = tokens(expected), tokens(candidate)
    for op, i1, i2, j1, j2 in SequenceMatcher(None, ta, tb, autojunk=False).get_opcodes():
        if op == "replace" and not (i2 - i1 == j2 - j1 and all(
                _typo(x, y) for x, y in zip(ta[i1:i2], tb[j1:j2]))):
            return f"{' '.join(tb[j1:j2])!r} where the expert wrote {' '.join(ta[i1:i2])!r}"
    return ""


# ---------------------------------------------------------------- token similarity

MAX_SIMILARITY_TOKENS = 2000  # longer texts must match after normalisation (bounded cost)


def tokens(s: str) -> list[str]:
    return _WORD.findall(s.casefold())


def token_similarity(a: str, b: str, at_least: float = 0.0) -> float:
    """1 − token-level Levenshtein distance / longer token count (order-aware).

    With `at_least`, the answer is exact only when it is ≥ at_least; below that any value under
    at_least may be returned (a band of width (1 − at_least)·n keeps long texts cheap)."""
    ta, tb = tokens(a), tokens(b)
    if ta == tb:
        return 1.0
    n = max(len(ta), len(tb))
    if not ta or not tb or n > MAX_SIMILARITY_TOKENS:
        return 0.0
    max_dist = int((1.0 - at_least) * n + 1e-9)
    if abs(len(ta) - len(tb)) > max_dist:
        return 1.0 - abs(len(ta) - len(tb)) / n  # an upper bound, already below at_least
    big = n + 1
    prev = [j if j <= max_dist else big for j in range(len(tb) + 1)]
    for i, x in enumerate(ta, 1):
        lo, hi = max(1, i - max_dist), min(len(tb), i + max_dist)
        cur = [big] * (len(tb) + 1)
        cur[0] = i if i <= max_dist else big
        for j in range(lo, hi + 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != tb[j - 1]))
        if min(cur[lo - 1:hi + 1]) > max_dist:
            return 0.0
        prev = cur
    return 1.0 - min(prev[-1], big) / n
