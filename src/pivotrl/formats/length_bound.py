"""How long a text can be and still fit in a number of tokens: the check that comes BEFORE
tokenizing, so a text no context could hold is refused at once instead of tokenized.

Why it is needed: tokenizing is not linear for every tokenizer (a pre-tokenizer regex with a
look-ahead scans a run of letters once per letter; BPE merges a long word at a cost that grows
with it), so one message of a million repeated letters could hold a tokenizer for minutes.

The bound, and why it never refuses a text that fits: every character of the text is covered by
the tokens it becomes, and one token covers at most `chars_per_token` characters (the longest
token's string) and `bytes_per_token` UTF-8 bytes. So a text that becomes `n` tokens has at most
n x chars_per_token characters and n x bytes_per_token bytes, and a text with more cannot fit in
`n` tokens. This holds only for tokenizers that drop and absorb nothing: `length_bound` reads the
tokenizer's own pipeline (normalizer, pre-tokenizer, model, added tokens) and returns None, no
bound, for any part that can drop characters (a whitespace-splitting pre-tokenizer, a Strip
normalizer, WordPiece's one [UNK] for a whole long word, an added token that strips the
whitespace beside it). Normalizers that compose characters (NFC) can shrink a text before it
is tokenized: their factors (`_SHRINK`) widen the bound for non-ASCII text, as ASCII text is
its own NFC, NFD and lowercase form. The chat LLM families pivotrl serves (byte-level BPE:
Qwen, Llama 3, gpt-oss, DeepSeek; SentencePiece BPE with byte fallback: Llama 2, Mistral,
Gemma) all get a bound.

`length_bound(tokenizer)` is computed once per tokenizer object (it reads the whole vocabulary),
so tokens added to that tokenizer afterwards are not seen: add them before the first call.
"""

from __future__ import annotations

import json
import math
import weakref
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LengthBound:
    """The most text one token of a tokenizer can stand for."""

    chars_per_token: int  # characters of the longest token (for byte-level BPE: its bytes)
    bytes_per_token: int  # UTF-8 bytes of the text the longest token can stand for
    # How many times a non-ASCII text can shrink in the normalizer before it is tokenized.
    shrink_chars: int = 1
    shrink_bytes: int = 1

    def max_chars(self, tokens: int, ascii_text: bool = True) -> int:
        """The most characters a text of `tokens` tokens can have."""
        return tokens * self.chars_per_token * (1 if ascii_text else self.shrink_chars)

    def max_bytes(self, tokens: int, ascii_text: bool = True) -> int:
        """The most UTF-8 bytes a text of `tokens` tokens can have."""
        return tokens * self.bytes_per_token * (1 if ascii_text else self.shrink_bytes)

    def fewest_tokens(self, text: str) -> int:
        """A lower bound on the tokens `text` becomes, read from its length alone."""
        ascii_text = text.isascii()  # O(1) in CPython: the string records it
        chars = math.ceil(len(text) / self.max_chars(1, ascii_text))
        if ascii_text or len(text) * 4 <= self.max_bytes(chars, ascii_text):
            return chars  # its bytes (at most 4 a character) cannot need more tokens
        return max(chars, math.ceil(len(text.encode("utf-8")) / self.max_bytes(1, ascii_text)))

    def refusal(self, text: str, tokens: int, what: str = "the text") -> str | None:
        """Why `text` cannot fit in `tokens` tokens, or None when it may (then tokenize it)."""
        fewest = self.fewest_tokens(text)
        if fewest <= tokens:
            return None
        ascii_text = text.isascii()
        return (f"{what} has {len(text):,} characters, at least {fewest:,} tokens: it cannot fit "
                f"in {tokens:,} tokens, which hold at most {self.max_chars(tokens, ascii_text):,} "
                f"characters ({self.max_bytes(tokens, ascii_text):,} bytes) of this tokenizer's "
                f"text (its longest token stands for {self.chars_per_token} characters, "
                f"{self.bytes_per_token} bytes)")


# (characters, bytes) a normalizer can shrink a non-ASCII text by, from the Unicode data
# (tests/test_length_bound.py re-derives them): a composed character is at most 4 code points
# decomposed, and a decomposition or composition step changes UTF-8 bytes at most 3x each way
# (KELVIN SIGN, 3 bytes, is "K"; three 3-byte Hangul jamo compose into one 3-byte syllable).
# NFD only splits characters, and lowercase maps each character to one or more.
_SHRINK = {"NFC": (4, 9), "NFD": (1, 3), "Lowercase": (1, 3), "Prepend": (1, 1)}
_KEEPS_EVERY_CHARACTER = {"ByteLevel", "Metaspace", "Digits", "UnicodeScripts", "Split",
                          "Punctuation"}  # pre-tokenizers that only cut (Split/Punctuation:
                                          # unless their behaviour removes what they match)
_BOUNDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def length_bound(tokenizer: Any) -> LengthBound | None:
    """The tokenizer's LengthBound (computed once per tokenizer object), or None when it has
    none that is safe: not a fast (`tokenizers`) tokenizer, or one that can drop characters."""
    if tokenizer in _BOUNDS:
        return _BOUNDS[tokenizer]
    bound = _compute(tokenizer)
    try:
        _BOUNDS[tokenizer] = bound
    except TypeError:  # not weak-referenceable: computed each time
        pass
    return bound


def _compute(tokenizer: Any) -> LengthBound | None:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    spec = json.loads(backend.to_str())
    shrink = _normalizer_shrink(spec.get("normalizer"))
    pre = spec.get("pre_tokenizer")
    model = spec.get("model") or {}
    added = spec.get("added_tokens") or []
    if shrink is None or not _keeps_characters(pre) or model.get("type") != "BPE":
        return None
    if any(t.get("lstrip") or t.get("rstrip") for t in added):
        return None  # such a token absorbs any run of whitespace beside it
    vocab = model.get("vocab") or {}
    byte_level = _has(pre, "ByteLevel")
    if byte_level:
        from tokenizers import pre_tokenizers

        covered = set(pre_tokenizers.ByteLevel.alphabet()) <= vocab.keys()
    else:
        covered = model.get("byte_fallback") and all(f"<0x{b:02X}>" in vocab for b in range(256))
    unk = model.get("unk_token")
    if not covered and (unk is None or model.get("fuse_unk")):
        return None  # unknown characters are dropped, or a run of them is one token
    # Byte-level vocabularies spell each byte as one character: a token's length is its bytes.
    chars = max([len(t) for t in vocab] + [len(t["content"]) for t in added] + [1])
    nbytes = max([len(t) if byte_level else len(t.encode("utf-8")) for t in vocab]
                 + [len(t["content"].encode("utf-8")) for t in added]
                 + [4 if unk is not None else 1])  # an [UNK] stands for one whole character
    return LengthBound(chars_per_token=chars, bytes_per_token=nbytes, shrink_chars=shrink[0],
                       shrink_bytes=shrink[1])


def _normalizer_shrink(spec: dict | None) -> tuple[int, int] | None:
    """(chars, bytes) factors a normalizer can shrink a text by; None when unknown."""
    if spec is None:
        return 1, 1
    kind = spec.get("type")
    if kind == "Sequence":
        chars, nbytes = 1, 1
        for part in spec.get("normalizers") or []:
            factors = _normalizer_shrink(part)
            if factors is None:
                return None
            chars, nbytes = chars * factors[0], nbytes * factors[1]
        return chars, nbytes
    if kind == "Replace":  # a literal replaced by one at least as long never shrinks the text
        pattern, content = (spec.get("pattern") or {}).get("String"), spec.get("content") or ""
        if pattern is None or len(content) < len(pattern) or len(content.encode()) < len(pattern.encode()):
            return None
        return 1, 1
    return _SHRINK.get(kind)


def _keeps_characters(spec: dict | None) -> bool:
    if spec is None:
        return True
    if spec.get("type") == "Sequence":
        return all(_keeps_characters(p) for p in spec.get("pretokenizers") or [])
    return spec.get("type") in _KEEPS_EVERY_CHARACTER and spec.get("behavior") != "Removed"


def _has(spec: dict | None, kind: str) -> bool:
    if spec is None:
        return False
    if spec.get("type") == "Sequence":
        return any(_has(p, kind) for p in spec.get("pretokenizers") or [])
    return spec.get("type") == kind
