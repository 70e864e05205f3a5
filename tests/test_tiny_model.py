"""The tiny base model's tokenizer, chat template and save/load round-trips."""

from __future__ import annotations

import json

import pytest
import torch

from pivotrl.formats.actions import parse_completion, render_action
from pivotrl.formats.chat import prompt_text, template_messages
from pivotrl.io.records import Message, parse_arguments
from pivotrl_testbed.testbed.tiny import IM_END, CHAT_TEMPLATE, load_tiny

TOOLS = [{"type": "function", "function": {
    "name": "get_order", "description": "Look up an order.",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}},
                   "required": ["order_id"]}}}]

CALL = Message(role="assistant", content="Let me check.", tool_calls=[
    {"id": "c1", "type": "function", "function": {
        "name": "get_order",
        "arguments": '{"order_id": "O-7", "z": [1, 2.5, "é", null], "a": {"b": true}}'}},
    {"id": "c2", "type": "function", "function": {"name": "list_products", "arguments": {}}}])
BARE_CALL = Message(role="assistant", tool_calls=[
    {"id": "c3", "type": "function", "function": {"name": "refund", "arguments": {"order_id": "O-7"}}}])
CONVERSATION = [
    Message(role="system", content="You are a shop assistant."),
    Message(role="user", content="Where is my order O-7? ünïcode \"quoted\""),
    CALL,
    Message(role="tool", tool_call_id="c1", content='{"status": "shipped"}'),
    Message(role="tool", tool_call_id="c2", content="[]"),
    BARE_CALL,
    Message(role="tool", tool_call_id="c3", content="ok"),
    Message(role="assistant", content="Your order O-7 has shipped and was refunded."),
]
ASSISTANTS = [m for m in CONVERSATION if m.role == "assistant"]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_tiny(tiny_model_dir)


def test_tokenizer_round_trip_gives_identical_ids(tiny, tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    _, tok = tiny
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    rendered = tok.apply_chat_template(template_messages(CONVERSATION), tools=TOOLS, tokenize=False)
    strings = [rendered, "What is 123 + 4567?", "  leading spaces\tand tabs\n", "ünïcödé ✓ 漢字",
               "<tool_call>\n{}\n</tool_call><|im_end|>", "cat a.txt | grep -c x > y"]
    for s in strings:
        assert again.encode(s) == tok.encode(s), s
        assert again.decode(tok.encode(s)) == s
    assert again.eos_token == IM_END and again.pad_token_id is not None
    assert again.pad_token_id != again.eos_token_id


def test_special_tokens_and_markers(tiny):
    _, tok = tiny
    ids = tok.encode(f"<tool_call>\nx\n</tool_call>{IM_END}")
    assert tok.convert_tokens_to_ids("<tool_call>") in ids  # one token each
    # TRL decodes with skip_special_tokens=True: markers stay, <|im_end|> goes.
    assert tok.decode(ids, skip_special_tokens=True) == "<tool_call>\nx\n</tool_call>"
    assert tok.eos_token_id == tok.convert_tokens_to_ids(IM_END)


def test_template_renders_assistant_turns_as_render_action(tiny):
    _, tok = tiny
    text = tok.apply_chat_template(template_messages(CONVERSATION), tools=TOOLS, tokenize=False)
    assert text.count("<|im_start|>system\n") == 1 and json.dumps(TOOLS[0]) in text
    assert "<tools>" in text and "You are a shop assistant." in text
    # consecutive tool results share one user block
    assert "<tool_response>\n{\"status\": \"shipped\"}\n</tool_response>\n<tool_response>\n[]\n" in text
    for message in ASSISTANTS:
        assert f"<|im_start|>assistant\n{render_action(message)}{IM_END}\n" in text


@pytest.mark.parametrize("index", range(len(ASSISTANTS)))
def test_parse_completion_recovers_rendered_assistant_message(tiny, index):
    _, tok = tiny
    message = ASSISTANTS[index]
    context = CONVERSATION[:CONVERSATION.index(message)]
    full = tok.apply_chat_template(template_messages(context + [message]), tools=TOOLS, tokenize=False)
    prompt = prompt_text(tok, context, TOOLS)
    assert full.startswith(prompt)
    completion = full[len(prompt):]
    parsed = parse_completion(completion)
    assert parsed.valid, parsed.reason
    got = parsed.message
    assert (got.content or "") == (message.content or "")
    want_calls = [(c.function.name, parse_arguments(c.function.arguments)) for c in message.tool_calls or []]
    got_calls = [(c.function.name, parse_arguments(c.function.arguments)) for c in got.tool_calls or []]
    assert got_calls == want_calls


def test_generation_prompt_and_no_system_without_tools(tiny):
    _, tok = tiny
    text = prompt_text(tok, [Message(role="user", content="hi")], None)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_generation_mask_covers_exactly_the_assistant_text(tiny):
    _, tok = tiny
    out = tok.apply_chat_template(template_messages(CONVERSATION), tools=TOOLS, tokenize=True,
                                  return_assistant_tokens_mask=True, return_dict=True)
    ids, mask = out["input_ids"], out["assistant_masks"]
    assert len(ids) == len(mask)
    # contiguous masked spans, one per assistant turn, each exactly the rendered action + EOS
    spans, current = [], []
    for i, m in zip(ids, mask):
        if m:
            current.append(i)
        elif current:
            spans.append(current)
            current = []
    if current:
        spans.append(current)
    assert [tok.decode(s) for s in spans] == [render_action(m) + IM_END for m in ASSISTANTS]


def test_model_save_load_round_trip_gives_identical_logits(tiny, tmp_path):
    model, tok = tiny
    from pivotrl_testbed.testbed.tiny import save_tiny

    save_tiny(model, tok, tmp_path)
    again, tok2 = load_tiny(tmp_path)
    ids = torch.tensor([tok.encode(prompt_text(tok, CONVERSATION[:2], TOOLS))])
    with torch.no_grad():
        a, b = model(ids).logits, again(ids).logits
    assert a.shape[-1] >= len(tok)
    assert torch.equal(a, b)
    assert again.config.model_type == "llama" and again.config.tie_word_embeddings


def test_chat_template_is_the_saved_one(tiny):
    _, tok = tiny
    assert tok.chat_template == CHAT_TEMPLATE
