"""The final-message rule: a message pays only when it is proven to say what the expert's says.

A final message (the expert answered the user instead of calling a tool) is equal to the
expert's when:

1. the two texts are the same after Unicode NFC and whitespace collapsing (`text_key`: the same
   characters, words, numbers as written, case and punctuation), or
2. both are *tool refusals* (`is_tool_refusal`, with `refusal_match`): the decision is the
   same, call nothing, and neither message claims anything else.

Nothing else is proven. Word-level similarity is not used: every word can carry meaning ("on"
and "off", "3 pending and 5 shipped" and "5 pending and 3 shipped", "isn't", "refused", "$5"
and "5", "1.10" and "1.1" in a version), and no fixed list of stopwords, negations or number
forms covers all of it. Paraphrases are for the LLM judge (`message_rule: judge`), which reads
both texts whole.

A refusal is a refusal only when it claims nothing: every clause of it is a courtesy ("I'm
sorry", "unfortunately") or a refusal clause of a closed form ("none of the available tools can
…", "no suitable function", "I cannot …"), the text under refusal carries no number, id or
first-person claim ("… the transfer I made"), no clause asserts a result ("has been", "done"),
and at least one clause names the tools. "None of the tools can do that, but I cancelled your
order" is not a refusal: its second clause is a claim.
"""

from __future__ import annotations

import re

from pivotrl.verifiers.arguments import text_key

MAX_REFUSAL_WORDS = 40

_TOOLS = r"(?:functions?|tools?|apis?|capabilit(?:y|ies))"
# Clauses: split at sentence punctuation, dashes and the conjunctions that start a new claim.
_CLAUSE = re.compile(r"[.!?;:,()\[\]\"]+|\s[-–—]+\s|\s(?:but|so|and|since|because|as|though|"
                     r"although|however|instead|while|after|before|then|therefore|yet|or|also|"
                     r"which|where|when)\b", re.I)
_COURTESY = re.compile(
    r"(?:(?:i'm|i am|we're|we are) (?:very |really |so |truly )?sorry|sorry|unfortunately|"
    r"(?:my )?apologies|i apologi[sz]e|regrettably|thanks?(?: you)?|hi|hello)", re.I)
# The closed forms of a refusal clause; what follows the inability (the tail) is what cannot be
# done, checked below for claims. Adjectives before "tools" come from a closed list, so that no
# claim ("deleted all tools") hides in front of them.
_ADJ = (r"(?:(?:the|my|these|those|your|any|such|other|available|provided|given|current|"
        r"existing|listed|accessible|relevant|suitable|appropriate|supplied|defined|specified|"
        r"necessary|required|right) ){0,3}")
_AT_HAND = r"(?: (?:available|provided|given|at hand|here|i have|we have))?"
_CANNOT = (r"(?:can(?:not|'t| not)|could(?:n't| not)|do(?:es)?(?: not|n't)|are(?: not|n't)|"
           r"is(?: not|n't)|won't|will not|would(?: not|n't))")
_ABLE = (r"(?:can|could|will|would|are able to|is able to|"
         r"(?:support|allow|let|handle|cover|fit|match|serve|perform|do|provide|apply|exist)s?|"
         r"(?:is|are) (?:suitable|appropriate|available|relevant|applicable|designed|meant|"
         r"able|enough|sufficient))")
_REFUSAL = re.compile(
    # "none of the available tools can …", "no suitable function", "no tool fits …"
    r"(?:none of|no|not one of) " + _ADJ + _TOOLS + _AT_HAND
    + r"(?:| for (?:this|that|it)(?: request| task)?| " + _ABLE + r"\b(?P<tail>.*))"
    # "the functions available don't support …"
    r"|" + _ADJ + _TOOLS + _AT_HAND + r" " + _CANNOT + r"\b(?P<tail1>.*)"
    # "I cannot …", "we don't have …"
    r"|(?:i|we) (?:cannot|can't|can not|am unable to|am not able to|are unable to|"
    r"are not able to|don't have|do not have|have no|don't see|do not see|"
    r"couldn't find|could not find)\b(?P<tail2>.*)", re.I)
_CLAIMS = re.compile(r"[\d@#/$€£¥%]|\b(?:i|i've|i'd|i'll|me|my|mine|we|we've|our|us|has|have|"
                     r"had|been|was|were|is now|are now|done|already|success\w*|complet\w*)\b",
                     re.I)
# "the functions I have" is a way to name the tools, not a claim.
_TOOLS_I_HAVE = re.compile(_TOOLS + r" (?:that )?(?:i|we) (?:have|can use|can access)"
                           r"(?: available| access to)?\b", re.I)
_LEADING_COURTESY = re.compile(r"^(?:" + _COURTESY.pattern + r")\s+", re.I)
_NEGATION_ONLY = re.compile(r"no|none|not|never", re.I)


def _refusal_clause(clause: str) -> bool:
    m = _REFUSAL.fullmatch(clause)
    if m is None:
        return False
    tail = next((t for t in m.group("tail", "tail1", "tail2") if t is not None), "")
    return not _CLAIMS.search(tail)


def is_tool_refusal(text: str) -> bool:
    """Does the message decline because no available tool/function fits, and claim nothing?"""
    text = text.replace("’", "'")
    if len(text.split()) > MAX_REFUSAL_WORDS:
        return False
    text = _TOOLS_I_HAVE.sub(lambda m: m.group(0).split()[0], text)
    names_tools = False
    for clause in _CLAUSE.split(text):
        clause = " ".join(clause.split())
        clause = _LEADING_COURTESY.sub("", clause)
        if not clause or _COURTESY.fullmatch(clause) or _NEGATION_ONLY.fullmatch(clause):
            continue
        if not _refusal_clause(clause):
            return False
        names_tools = names_tools or bool(re.search(r"\b" + _TOOLS + r"\b", clause, re.I))
    return names_tools


def compare_messages(expected: str, candidate: str, refusal_match: bool = True) -> str:
    """"" when `candidate` is proven to say what `expected` says (the rules of this module)."""
    if not candidate.strip():
        return "empty message"
    if text_key(expected) == text_key(candidate):
        return ""
    if refusal_match and is_tool_refusal(expected) and is_tool_refusal(candidate):
        return ""
    return "message differs from the expert's (not proven equal)"
