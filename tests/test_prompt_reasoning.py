"""`extract --keep-reasoning` reaches the prompts: the Turn file decides what reasoning is in the
context, `chat.prompt_text` passes it on, and the model's template decides whether to render it."""

from __future__ import annotations

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from pivotrl.formats.chat import prompt_text
from pivotrl.extract import ExtractOptions, extract_turns
from pivotrl.io.records import Trajectory

# A template that renders earlier assistant reasoning, as thinking-model templates that keep
# interleaved reasoning do.
TEMPLATE = ("{% for m in messages %}<{{ m.role }}>"
            "{% if m.reasoning_content %}[think]{{ m.reasoning_content }}[/think]{% endif %}"
            "{{ m.content }}</{{ m.role }}>{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def tokenizer():
    tok = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    out = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    out.chat_template = TEMPLATE
    return out


TRAJ = Trajectory.model_validate({"id": "t", "messages": [
    {"role": "user", "content": "count the files"},
    {"role": "assistant", "content": "There are 3.", "reasoning_content": "ls showed three names"},
    {"role": "user", "content": "and now?"},
    {"role": "assistant", "content": "Still 3."},
]})


def last_turn_prompt(keep_reasoning: bool) -> str:
    turns, _ = extract_turns(TRAJ, ExtractOptions(keep_reasoning=keep_reasoning))
    return prompt_text(tokenizer(), turns[-1].context, None)


def test_kept_reasoning_reaches_the_prompt():
    assert "[think]ls showed three names[/think]There are 3." in last_turn_prompt(True)


def test_dropped_reasoning_stays_out_of_the_prompt():
    prompt = last_turn_prompt(False)
    assert "ls showed three names" not in prompt and "There are 3." in prompt
