"""The length bound (`pivotrl.formats.length_bound`): a text it refuses cannot fit in the tokens
asked for, on every tokenizer it gives a bound for; tokenizers that can drop characters get none;
and `profile`, `sft` and GRPO's prompt rows set an over-long record aside with the reason without
tokenizing it."""

from __future__ import annotations

import json
import random
import sys
import unicodedata

import pytest

from conftest import sample_texts
from pivotrl.formats.length_bound import _SHRINK, length_bound

MEGABYTE_RUN = "a" * 1_000_000


def wrap(tok, **added):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok, **added)


def trained(tok, trainer_specials=(), texts=None):
    from tokenizers import pre_tokenizers, trainers

    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=list(trainer_specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts or sample_texts(120), trainer=trainer)
    return tok


def byte_level_nfc():
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # Long merged runs of composed characters: decomposed input composes into few, long tokens,
    # so a bound without NFC's factor would refuse a text that fits (the jamo probe).
    return wrap(trained(tok, texts=sample_texts(120) + ["\u00e9" * 300, "\uac01" * 300] * 40))


def sentencepiece_like():
    """Llama 2 / Mistral's shape: spaces as ▁, unknown characters as byte tokens."""
    from tokenizers import Tokenizer, models, normalizers

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    specials = ["<unk>"] + [f"<0x{b:02X}>" for b in range(256)]
    texts = [t.replace(" ", "▁") for t in sample_texts(120)]
    return wrap(trained(tok, specials, texts), unk_token="<unk>")


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def probe_texts(seed: int = 0) -> list[str]:
    """Texts a shrinking bound would get wrong: decomposed accents and Hangul jamo (NFC composes
    them), astral and CJK characters (unknown to these vocabularies), runs, the corpus itself."""
    rng = random.Random(seed)
    alphabet = ("abcxyz ABC0123{}\":,\n\t" + "e\u0301\u0323" + "\u1100\u1161\u11a8" + "日本語"
                + "\U0001F600\U0001D15E" + "\u212a\u2126" + "ǅﬁ")
    out = sample_texts(40) + ["", " ", "a" * 3000, " " * 3000, "e\u0301" * 1500,
                              "\u1100\u1161\u11a8" * 700, "\U0001F600" * 500]
    out += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 400))) for _ in range(150)]
    return out


@pytest.mark.parametrize("make", ["tiny", "byte_level_nfc", "sentencepiece_like"])
def test_the_bound_never_refuses_a_text_that_fits(make, tiny_tokenizer):
    tok = {"tiny": lambda: tiny_tokenizer, "byte_level_nfc": byte_level_nfc,
           "sentencepiece_like": sentencepiece_like}[make]()
    bound = length_bound(tok)
    assert bound is not None and bound.chars_per_token > 1
    for text in probe_texts():
        n = len(tok(text, add_special_tokens=False)["input_ids"])
        assert bound.fewest_tokens(text) <= n, (make, text[:60], n)
        assert bound.refusal(text, n) is None  # exactly its own count: never refused
    why = bound.refusal(MEGABYTE_RUN, 2048, "the prompt")
    assert why is not None and "1,000,000 characters" in why and "cannot fit in 2,048 tokens" in why
    assert f"at most {bound.max_chars(2048):,} characters" in why
    assert length_bound(tok) is bound  # computed once per tokenizer


def test_tokenizers_that_can_drop_characters_get_no_bound():
    from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers

    def bpe(pre=None, norm=None):
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre or pre_tokenizers.ByteLevel(add_prefix_space=False)
        if norm is not None:
            tok.normalizer = norm
        return trained(tok)

    assert length_bound(wrap(bpe())) is not None  # the control: same shape, nothing dropped
    assert length_bound(wrap(bpe(pre=pre_tokenizers.Whitespace()))) is None  # drops spaces
    assert length_bound(wrap(bpe(norm=normalizers.Strip()))) is None
    assert length_bound(wrap(bpe(norm=normalizers.Replace("  ", " ")))) is None  # shrinks
    stripping = wrap(bpe())
    stripping.add_tokens([AddedToken("<mask>", lstrip=True)])  # absorbs the spaces before it
    assert length_bound(stripping) is None
    wordpiece = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    assert length_bound(wrap(wordpiece)) is None  # one [UNK] for a whole long word
    assert length_bound(object()) is None  # not a fast tokenizer


def test_normalizer_factors_hold_for_every_code_point():
    """_SHRINK's factors, re-derived from this Python's Unicode data."""
    chars = nfd_bytes_down = nfd_bytes_up = lower_bytes = 1.0
    for cp in range(sys.maxunicode + 1):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        d = unicodedata.normalize("NFD", c)
        chars = max(chars, len(d))
        nfd_bytes_down = max(nfd_bytes_down, len(c.encode()) / len(d.encode()))
        nfd_bytes_up = max(nfd_bytes_up, len(d.encode()) / len(c.encode()))
        assert len(c.lower()) >= 1
        lower_bytes = max(lower_bytes, len(c.encode()) / len(c.lower().encode()))
    assert _SHRINK["NFC"][0] >= chars and _SHRINK["NFC"][1] >= nfd_bytes_down * nfd_bytes_up
    assert _SHRINK["NFD"] == (1, 3) and nfd_bytes_down <= 3
    assert _SHRINK["Lowercase"][1] >= lower_bytes


class Recording:
    """A tokenizer that records the texts it tokenizes (itself or through a chat template)."""

    def __init__(self, tok):
        self._tok, self.tokenized = tok, []

    def __call__(self, text, **kwargs):
        self.tokenized.append(len(text))
        return self._tok(text, **kwargs)

    def apply_chat_template(self, messages, **kwargs):
        if kwargs.get("tokenize"):
            self.tokenized.append(sum(len(str(m.get("content") or "")) for m in messages))
        return self._tok.apply_chat_template(messages, **kwargs)

    def __getattr__(self, name):
        if name.startswith("__") or name == "_tok":  # copy.copy probes these on a bare instance
            raise AttributeError(name)
        return getattr(self._tok, name)


def test_split_too_long_sets_an_over_long_prompt_aside_untokenized(tiny_tokenizer):
    from pivotrl.sampling.pipeline import split_too_long

    tok = Recording(tiny_tokenizer)
    prompts = ["Where is order O-1?", MEGABYTE_RUN, "x " * 300]
    fits, too_long = split_too_long(prompts, tok, 200)
    before = split_too_long([prompts[0], prompts[2]], tiny_tokenizer, 200)
    assert fits == [0] and sorted(too_long) == [1, 2]
    assert too_long[1] == length_bound(tiny_tokenizer).fewest_tokens(MEGABYTE_RUN) > 200
    assert too_long[2] == before[1][1]  # within the bound: counted exactly, as before
    assert max(tok.tokenized) < len(MEGABYTE_RUN)  # the long one never reached the tokenizer


def test_profile_rejects_an_over_long_turn_with_its_line(tmp_path, tiny_tokenizer):
    from pivotrl.io.records import Profile, iter_valid, rejects_path
    from pivotrl.profile.loop import ProfileConfig
    from pivotrl.profile.runs import profile_file
    from pivotrl.verifiers import get_verifier
    from test_profile_pipeline import ScriptedSampler, write_turns

    turns = write_turns(tmp_path / "turns.jsonl", 3)
    rows = turns.read_text().splitlines()
    long = json.loads(rows[1])
    long["context"][0]["content"] = MEGABYTE_RUN
    turns.write_text("\n".join([rows[0], json.dumps(long), rows[2]]) + "\n")
    tok = Recording(tiny_tokenizer)
    out = tmp_path / "p.jsonl"
    doc = profile_file(turns, out, ScriptedSampler(tok, limit=2047), get_verifier("exact"), tok,
                       ProfileConfig(k=1, max_new_tokens=2), progress=False)
    assert [p.id for p in iter_valid(out, Profile)] == ["t0/1", "t2/1"]
    assert list(doc["runs"][-1]["too_long"]) == ["t1/1"]
    [reject] = [json.loads(line) for line in rejects_path(out).open()]
    assert reject["line"] == 2 and reject["field"] == "context"
    assert "longer than the engine takes (2047)" in reject["reason"]
    assert max(tok.tokenized) < len(MEGABYTE_RUN)


def test_sft_and_grpo_drop_an_over_long_record_untokenized(tmp_path, tiny_tokenizer):
    from pivotrl.io.records import Trajectory, Turn
    from pivotrl.train.grpo import build_prompts
    from pivotrl.train.sft import build_rows, tokenize_trajectory
    from test_train_sft import trajectory

    long = trajectory(1)
    long["messages"][0]["content"] = MEGABYTE_RUN
    path = tmp_path / "trajectories.jsonl"
    path.write_text(json.dumps(trajectory(0)) + "\n" + json.dumps(long) + "\n")
    tok = Recording(tiny_tokenizer)
    rows = build_rows(path, tok, max_length=2048)
    assert rows.rows == [tokenize_trajectory(tiny_tokenizer, Trajectory.model_validate(trajectory(0)))]
    [(where, why)] = rows.dropped
    assert where == "tr1" and "cannot fit in 2,048 tokens" in why and "max_length 2048" in why
    assert max(tok.tokenized) < len(MEGABYTE_RUN)

    def turn(i: int, text: str) -> Turn:
        return Turn.model_validate({"id": f"t{i}/0", "trajectory_id": f"t{i}", "turn": 0,
                                    "context": [{"role": "user", "content": text}],
                                    "expected": {"role": "assistant", "content": "ok"}})

    tok.tokenized.clear()
    prompts = build_prompts([turn(0, "Where is O-1?"), turn(1, MEGABYTE_RUN)], tok, 2000)
    assert [r["id"] for r in prompts.rows] == ["t0/0"]
    assert prompts.dropped[0][0] == "t1/0" and "max_prompt_length 2000" in prompts.dropped[0][1]
    assert max(tok.tokenized) < len(MEGABYTE_RUN)
