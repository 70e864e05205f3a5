"""A format is used only when it reads the template's own writing of a tool call.

Detection by markers can match text that is no call: a template that prints the tool
*definitions* as JSON has '"parameters"' in it whatever syntax its calls use, and was read as
Hermes, so every correct call scored 0 without an error. Here every chat template TRL ships is
put on a tokenizer and the expert's call, rendered by that template and cut from its prompt,
must score 1 with the parser pivotrl picks, or pivotrl must refuse and name the fix. Also:
template sets are read as transformers renders prompts with tools (their "tool_use" template),
and a template that renders no tool calls (Cohere2's) is refused even with a format given.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trl
from tokenizers import Tokenizer, decoders, models
from tokenizers.pre_tokenizers import ByteLevel
from transformers import PreTrainedTokenizerFast

from pivotrl.formats.actions import parse_completion
from pivotrl.formats.chat import assistant_turn_text, prompt_text, template_message, template_messages
from pivotrl.formats.families import KNOWN_TEMPLATES, UnknownFormatError, detect, parser_for
from pivotrl.io.records import Message, Turn
from pivotrl.scoring import score_completions
from pivotrl.verifiers import get_verifier
from test_families import CONTEXT, TOOLS

TEMPLATE_DIR = Path(os.path.dirname(trl.__file__)) / "chat_templates"
TEMPLATE_FILES = sorted(TEMPLATE_DIR.glob("*.jinja"))


def make_tokenizer(template: str | dict) -> PreTrainedTokenizerFast:
    """Byte-level tokenizer (one token per byte) carrying `template`: rendering is text only, so
    the family's special tokens need not be in the vocabulary."""
    vocab = {c: i for i, c in enumerate(sorted(ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="</s>")
    fast.chat_template = template
    return fast


EXPERT = Message.model_validate({"role": "assistant", "content": "", "tool_calls": [{
    "id": "c0", "type": "function", "function": {
        "name": "cancel_order", "arguments": json.dumps({"order_id": "75001", "quantity": 3})}}]})
TURN = Turn(id="t/0", trajectory_id="t", turn=0, tools=TOOLS, context=CONTEXT, expected=EXPERT)


def expert_text(tok) -> str:
    """The expert's call as the model writes it: the template's render less its prompt."""
    text = assistant_turn_text(tok, template_messages(CONTEXT), TOOLS, template_message(EXPERT))
    assert text is not None
    return text


def reward(tok, text: str, parse) -> float:
    return score_completions(get_verifier("toolcall"), [TURN], [text], parse)[0].reward


@pytest.mark.parametrize("path", TEMPLATE_FILES, ids=[p.stem for p in TEMPLATE_FILES])
def test_every_trl_template_is_read_in_its_own_format_or_refused(path):
    tok = make_tokenizer(path.read_text())
    try:
        family = detect(tok)
        parse = parser_for(tok)
    except UnknownFormatError as exc:
        assert path.stem not in KNOWN_TEMPLATES, f"{path.stem} is a known family: {exc}"
        assert "response_format" in str(exc), str(exc)
        return
    if path.stem in KNOWN_TEMPLATES:
        assert (family.template, family.format) == (path.stem, KNOWN_TEMPLATES[path.stem][0])
    text = expert_text(tok)
    assert reward(tok, text, parse) == 1.0, (path.stem, family, text, parse(text, TOOLS))


def test_known_family_templates_are_all_shipped_files():
    """The test above proves the check passes for every KNOWN_TEMPLATES family only if each is
    one of the files it walks."""
    assert set(KNOWN_TEMPLATES) <= {p.stem for p in TEMPLATE_FILES}


# Tool definitions printed as JSON, as Muse Glimmer's template writes them (its text holds
# '"parameters"'); calls written as <|action|>name(args), a syntax pivotrl has no reader for.
GLIMMER_LIKE = (
    "{%- if tools -%}<|system|>Tools:{%- for t in tools -%}"
    "{{ '\\n{\"name\": ' + (t.function.name | tojson) + ', \"parameters\": ' + "
    "(t.function.parameters | tojson) + '}' }}"
    "{%- endfor -%}<|end|>{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' and m.tool_calls -%}<|assistant|>"
    "{%- for c in m.tool_calls -%}<|action|>{{ c.function.name }}({{ c.function.arguments | tojson }})"
    "{%- endfor -%}<|end|>"
    "{%- else -%}<|{{ m.role }}|>{{ m.content }}<|end|>{%- endif -%}"
    "{%- endfor -%}{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}")


def test_schemas_printed_as_json_are_no_hermes_marker():
    tok = make_tokenizer(GLIMMER_LIKE)
    text = expert_text(tok)
    prompt = prompt_text(tok, CONTEXT, TOOLS)
    assert '"parameters"' in GLIMMER_LIKE and '{"name": "cancel_order", "parameters": {' in prompt
    assert text.startswith("<|action|>cancel_order(")
    assert not parse_completion(text).message.tool_calls  # what a Hermes reading paid: 0
    for given in (None, "hermes"):
        with pytest.raises(UnknownFormatError, match="response_format") as err:
            parser_for(tok, response_format=given)
        assert "<|action|>get_weather(" in str(err.value) and "hermes reader reads as" in str(err.value)


HERMES_LIKE = (
    "{%- if tools -%}<|im_start|>system\nTools:\n{%- for t in tools -%}{{ t | tojson }}\n{%- endfor -%}"
    "<|im_end|>\n{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}<|im_start|>assistant\n{{ m.content }}"
    "{%- for c in m.tool_calls or [] -%}<tool_call>\n"
    "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}\n</tool_call>"
    "{%- endfor -%}<|im_end|>\n"
    "{%- elif m.role == 'tool' -%}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- else -%}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif -%}"
    "{%- endfor -%}{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}")
PLAIN = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"


def test_a_template_set_is_read_through_its_tool_use_template():
    tok = make_tokenizer({"default": PLAIN, "tool_use": HERMES_LIKE})
    assert detect(tok).format == "hermes"
    text = expert_text(tok)
    assert text.lstrip().startswith("<tool_call>") and reward(tok, text, parser_for(tok)) == 1.0


def test_a_template_set_whose_tool_template_renders_no_calls_is_refused():
    tok = make_tokenizer({"default": HERMES_LIKE, "tool_use": PLAIN})
    with pytest.raises(UnknownFormatError, match="template set") as err:
        parser_for(tok, response_format="hermes")
    assert "renders no tool calls" in str(err.value) and "response_format" in str(err.value)


@pytest.mark.skipif(not (TEMPLATE_DIR / "cohere2.jinja").exists(), reason="TRL ships no cohere2.jinja")
def test_cohere2_with_a_format_given_is_refused_clearly():
    tok = make_tokenizer((TEMPLATE_DIR / "cohere2.jinja").read_text())
    for given in (None, "hermes"):
        with pytest.raises(UnknownFormatError, match="renders no tool calls") as err:
            parser_for(tok, response_format=given)
        assert "response_format" in str(err.value) and "tool_use" in str(err.value)


def test_a_template_that_raises_on_tool_calls_is_refused_with_its_error():
    raising = HERMES_LIKE.replace("{%- for c in m.tool_calls or [] -%}",
                                  "{%- for c in m.tool_calls or [] -%}{{ raise_exception('no tools here') }}")
    with pytest.raises(UnknownFormatError, match="cannot render tool calls: .*no tools here"):
        parser_for(make_tokenizer(raising))


def test_verify_model_with_a_misread_template_stops_naming_the_fix(tmp_path):
    from typer.testing import CliRunner

    from pivotrl.cli import app

    tok = make_tokenizer(GLIMMER_LIKE)
    tok.save_pretrained(tmp_path / "tok")
    cases = tmp_path / "cases.jsonl"
    row = {**TURN.model_dump(mode="json", exclude_none=True), "completion": expert_text(tok)}
    cases.write_text(json.dumps(row) + "\n")
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(app, ["verify", str(cases), "--model", str(tmp_path / "tok"), "--out", str(out)])
    assert result.exit_code != 0, result.output
    assert "response_format" in result.output.replace("\n", ""), result.output
    assert not out.exists() or not out.read_text().strip()  # no line scored 0
