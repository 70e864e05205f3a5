"""Every tool-calling family whose chat template TRL ships, from rendering to reward.

For each template: a tiny byte-level tokenizer carrying it (plus the special tokens the family
uses), a context with tools, and completions in the family's own format, made by rendering the
expert's message with the template itself and cutting the prompt off (with and without a long
thinking block). Checked: the format is detected, parse -> verify pays the right call 1 and a
wrong id / value / function 0, broken calls are invalid (never a message), our reader agrees
with the tokenizer's own response template where TRL has one, the SFT label mask covers the
assistant's action, one profile and one GRPO step run with a tiny
random model (tests/test_journey.py runs them through the CLI for the families it names), and
prompts carry exactly one BOS everywhere.
"""

from __future__ import annotations

import json
import sys
import types

import pytest
import torch
import trl.chat_template_utils as U
from tokenizers import Tokenizer, decoders, models, processors
from tokenizers.pre_tokenizers import ByteLevel
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from pivotrl.formats.chat import (
    apply_template,
    completion_text,
    prompt_text,
    prompt_token_ids,
)
from pivotrl.formats.families import (
    UnknownFormatError,
    detect,
    parser_for,
    token_budget,
)
from pivotrl.io.records import Message, Trajectory, Turn
from pivotrl.scoring import score_completions
from pivotrl.verifiers import get_verifier

QWEN = dict(eos="<|im_end|>", specials=["<|im_start|>"])
FAMILIES = {  # TRL template name → (expected format, tokenizer's special tokens)
    "qwen2_5": ("hermes", QWEN), "qwen3": ("hermes", QWEN),
    "qwen3_5_think": ("qwen-xml", QWEN), "qwen3_5_nothink": ("qwen-xml", QWEN),
    "qwen3_6": ("qwen-xml", QWEN), "qwen3_8": ("qwen-xml", QWEN),
    "nemotron_3_nano": ("qwen-xml", QWEN), "nemotron_3_super": ("qwen-xml", QWEN),
    "nemotron_3_ultra": ("qwen-xml", QWEN),
    "llama3_1": ("hermes", dict(bos="<|begin_of_text|>", eos="<|eot_id|>", specials=[
        "<|start_header_id|>", "<|end_header_id|>", "<|python_tag|>", "<|eom_id|>"])),
    "llama3_2": ("hermes", dict(bos="<|begin_of_text|>", eos="<|eot_id|>", specials=[
        "<|start_header_id|>", "<|end_header_id|>", "<|python_tag|>", "<|eom_id|>"])),
    "gptoss": ("harmony", dict(eos="<|return|>", specials=[
        "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|call|>", "<|constrain|>"])),
    "glm4moe": ("glm", dict(eos="<|endoftext|>", specials=[
        "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"])),
    "deepseekv3": ("deepseek", dict(bos="<｜begin▁of▁sentence｜>", eos="<｜end▁of▁sentence｜>", specials=[
        "<｜User｜>", "<｜Assistant｜>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
        "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>",
        "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"])),
}
# Families pivotrl has no reader of its own for: read through TRL's response template for them.
RESPONSE_TEMPLATE_FAMILIES = {"lfm2_2_5": dict(eos="<|im_end|>", specials=["<|im_start|>"]),
                              "gemma4": dict(eos="<turn|>", specials=["<|turn>"])}
VOCAB = 300  # 256 bytes + the largest family's special tokens: one shared tiny model
# Templates tests/test_journey.py profiles and trains with through the command line (on their
# families' own architectures): the profile and GRPO steps below run on the others.
RUN_BY_THE_JOURNEY = {"qwen3", "qwen3_5_think", "llama3_1", "gptoss"}


def make_tokenizer(name: str, add_bos: bool = False) -> PreTrainedTokenizerFast:
    """Byte-level tokenizer (no merges: one token per byte) with `name`'s TRL chat template.
    add_bos: the tokenizer also prepends BOS on encode, as Llama 3's does."""
    spec = FAMILIES[name][1] if name in FAMILIES else RESPONSE_TEMPLATE_FAMILIES[name]
    vocab = {c: i for i, c in enumerate(sorted(ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=spec.get("bos"), eos_token=spec["eos"],
                                   pad_token=spec["eos"], padding_side="left")
    fast.add_special_tokens({"additional_special_tokens": spec["specials"]})
    if add_bos:
        bos = spec["bos"]
        fast.backend_tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", special_tokens=[(bos, fast.convert_tokens_to_ids(bos))])
    fast.chat_template = getattr(U, f"{name}_chat_template")
    assert len(fast) <= VOCAB
    return fast


def _fn(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": f"{name} an order.", "parameters": {
        "type": "object", "properties": {"order_id": {"type": "string"}, "quantity": {"type": "integer"}},
        "required": ["order_id", "quantity"]}}}


TOOLS = [_fn("get_order"), _fn("cancel_order")]
CONTEXT = [Message(role="system", content="You help with orders."),
           Message(role="user", content="Cancel 3 items of order 75001.")]
LONG_THINKING = " ".join(["The user wants to cancel items; the order id is 75001 and the quantity 3."] * 40)


def call(name: str = "cancel_order", order_id: str = "75001", quantity: int = 3,
         reasoning: str | None = None) -> Message:
    return Message.model_validate({"role": "assistant", "content": "", "reasoning_content": reasoning,
                                   "tool_calls": [{"id": "c0", "type": "function", "function": {
                                       "name": name, "arguments": json.dumps(
                                           {"order_id": order_id, "quantity": quantity})}}]})


TURN = Turn(id="t/0", trajectory_id="t", turn=0, tools=TOOLS, context=CONTEXT, expected=call())


def completion(tok, message: Message) -> str:
    """The expert's message as the model would write it: the template renders it after the
    context, and the generation prompt is cut off. When the prompt prefilled an open <think>
    that the render of a finished turn does not repeat (DeepSeek-V3), the model closes it."""
    prompt = prompt_text(tok, CONTEXT, TOOLS)
    full = apply_template(tok, [m.model_dump(exclude_none=True) for m in CONTEXT] + [
        _with_reasoning(message)], TOOLS)
    if full.startswith(prompt):
        return full[len(prompt):]
    base = apply_template(tok, [m.model_dump(exclude_none=True) for m in CONTEXT], TOOLS)
    header, turn = prompt[len(base):], full[len(base):]
    opened = header.rfind("<think>")
    assert opened != -1 and header[opened:].strip() == "<think>" and turn.startswith(header[:opened])
    thought = f"{message.reasoning_content}\n" if message.reasoning_content else ""
    return f"{thought}</think>\n\n{turn[opened:]}"


def _with_reasoning(message: Message) -> dict:
    from pivotrl.formats.chat import template_message

    return template_message(message, keep_reasoning=True)


def thinks(tok) -> bool:
    return token_budget(tok) > 256


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    return request.param, make_tokenizer(request.param)


def score(tok, texts: list[str]) -> list:
    return score_completions(get_verifier("toolcall"), [TURN] * len(texts), texts, parser_for(tok))


# ---------------------------------------------------------------- parse -> verify


def test_detects_the_family_format(family):
    name, tok = family
    assert detect(tok).format == FAMILIES[name][0]
    assert parser_for(tok).name == FAMILIES[name][0]


def test_right_call_pays_and_wrong_id_value_function_do_not(family):
    name, tok = family
    reasonings = [None, LONG_THINKING] if thinks(tok) else [None]
    for reasoning in reasonings:
        texts = [completion(tok, call(reasoning=reasoning)),
                 completion(tok, call(order_id="75002", reasoning=reasoning)),
                 completion(tok, call(quantity=4, reasoning=reasoning)),
                 completion(tok, call(name="get_order", reasoning=reasoning))]
        scores = score(tok, texts)
        assert [s.reward for s in scores] == [1.0, 0.0, 0.0, 0.0], (name, reasoning, texts[0], scores)
        assert all(s.valid for s in scores), scores


def test_a_call_right_after_a_prefilled_think_counts_as_no_reasoning(family):
    name, tok = family
    if not parser_for(tok).think_opens_in_prompt:
        pytest.skip(f"{name}'s generation prompt does not open <think>")
    text = completion(tok, call())
    direct = text[text.index("</think>") + len("</think>"):].lstrip()
    assert [s.reward for s in score(tok, [direct, "Let me think about order 75001"])] == [1.0, 0.0]


def test_a_message_is_read_as_a_message(family):
    name, tok = family
    text = completion(tok, Message(role="assistant", content="Which order do you mean?"))
    parsed = parser_for(tok)(text, TOOLS)
    assert parsed.valid and parsed.message.content == "Which order do you mean?", (text, parsed)
    assert score(tok, [text])[0].reward == 0.0  # the expert called a tool


def test_broken_calls_are_invalid_never_a_message(family):
    name, tok = family
    good = completion(tok, call())
    core = good.rstrip()
    for marker in ("<|im_end|>", "<|eot_id|>", "<｜end▁of▁sentence｜>", "<|call|>"):
        core = core.removesuffix(marker).rstrip()
    broken = {"cut in the middle": core[: len(core) - 12], "text after the call": core + "\nDone! Anything else?"}
    if thinks(tok):
        cut = completion(tok, call(reasoning=LONG_THINKING))
        broken["cut while thinking"] = cut[: cut.index("75001") + 40]
    parse = parser_for(tok)
    for what, text in broken.items():
        parsed = parse(text, TOOLS)
        assert not parsed.valid, (name, what, text[-80:], parsed)
        assert parsed.reason


def test_agrees_with_the_tokenizers_own_response_template(family):
    name, tok = family
    try:
        U.add_response_schema(tok)
    except ValueError:
        pytest.skip(f"TRL has no response template for {name}")
    prompt = prompt_text(tok, CONTEXT, TOOLS)
    text = completion(tok, call())
    theirs = tok.parse_response(text, prefix=prompt, tools=TOOLS)
    ours = parser_for(tok)(text, TOOLS).message
    their_calls = [(c["function"]["name"], c["function"]["arguments"]) for c in theirs.get("tool_calls", [])]
    assert their_calls == [(c.function.name, json.loads(c.function.arguments)) for c in ours.tool_calls]


def test_tokenizer_only_dir_is_enough_for_verify_model(family, tmp_path):
    from typer.testing import CliRunner

    from pivotrl.cli import app

    name, tok = family
    tok.save_pretrained(tmp_path / "tok")
    cases = tmp_path / "cases.jsonl"
    rows = [{**TURN.model_dump(mode="json", exclude_none=True), "id": f"c{i}", "completion": text}
            for i, text in enumerate([completion(tok, call()), completion(tok, call(quantity=9))])]
    cases.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(app, ["verify", str(cases), "--model", str(tmp_path / "tok"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert [json.loads(line)["reward"] for line in out.read_text().splitlines()] == [1.0, 0.0]


# A template with no known marker that writes a call as bare JSON: the hermes reader reads it,
# once told to.
BARE_JSON_CALLS = ("{% for m in messages %}{{ m.role }}: {{ m.content }}{% for c in m.tool_calls or [] %}"
                   "{{ c.function | tojson }}{% endfor %}\n{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")


def test_unknown_template_is_an_error_that_names_the_fix():
    tok = make_tokenizer("qwen3")
    tok.chat_template = BARE_JSON_CALLS
    with pytest.raises(UnknownFormatError, match="response_format"):
        parser_for(tok)
    assert parser_for(tok, response_format="hermes").name == "hermes"


def test_verify_with_an_unknown_family_stops_with_the_fix(tmp_path):
    from typer.testing import CliRunner

    from pivotrl.cli import app

    tok = make_tokenizer("qwen3")
    tok.chat_template = BARE_JSON_CALLS
    tok.save_pretrained(tmp_path / "tok")
    cases = tmp_path / "cases.jsonl"
    cases.write_text(json.dumps({**TURN.model_dump(mode="json", exclude_none=True), "completion": "hi"}) + "\n")
    result = CliRunner().invoke(app, ["verify", str(cases), "--model", str(tmp_path / "tok")])
    assert result.exit_code == 1 and "response-format" in result.output.replace("\n", "")
    ok = CliRunner().invoke(app, ["verify", str(cases), "--model", str(tmp_path / "tok"),
                                  "--response-format", "hermes", "--out", str(tmp_path / "o.jsonl")])
    assert ok.exit_code == 0 and json.loads((tmp_path / "o.jsonl").read_text())["valid"]


@pytest.mark.parametrize("name", sorted(RESPONSE_TEMPLATE_FAMILIES))
def test_other_families_are_read_with_their_response_template_strictly(name):
    tok = make_tokenizer(name)
    assert detect(tok).format == "response-template" and getattr(tok, "response_template", None) is None
    texts = [completion(tok, call()), completion(tok, call(order_id="75002")),
             completion(tok, call(quantity=4)), completion(tok, call(name="get_order"))]
    assert [s.reward for s in score(tok, texts)] == [1.0, 0.0, 0.0, 0.0]
    parse = parser_for(tok)
    cut = texts[0][: texts[0].index("75001") + 5]
    assert not parse(cut, TOOLS).valid and not parse(texts[0] + " and more", TOOLS).valid
    message = parse(completion(tok, Message(role="assistant", content="Which order?")), TOOLS)
    assert message.valid and message.message.content == "Which order?"


def test_thinking_kwargs_reach_the_prompt_and_set_the_token_budget():
    from pivotrl.profile.loop import ProfileConfig
    from pivotrl.train.config import GRPORunConfig
    from pivotrl.train.grpo import with_token_budget

    qwen3, off = make_tokenizer("qwen3"), {"enable_thinking": False}
    assert token_budget(qwen3) == 4096 and token_budget(qwen3, chat_kwargs=off) == 256
    assert token_budget(make_tokenizer("qwen2_5")) == 256 and token_budget(make_tokenizer("gptoss")) == 4096
    assert prompt_text(qwen3, CONTEXT, TOOLS, off).endswith("<think>\n\n</think>\n\n")
    assert not prompt_text(qwen3, CONTEXT, TOOLS).endswith("</think>\n\n")
    assert ProfileConfig().sampling(qwen3).max_new_tokens == 4096
    assert ProfileConfig(chat_template_kwargs=off).sampling(qwen3).max_new_tokens == 256
    assert ProfileConfig(max_new_tokens=99).sampling(qwen3).max_new_tokens == 99
    cfg = GRPORunConfig(model="m", pivots="p.jsonl", output_dir="o", chat_template_kwargs=off)
    assert with_token_budget(cfg, qwen3).max_completion_length == 256


def test_a_template_that_thinks_only_when_asked_gets_the_plain_budget():
    """Gemma 4's template takes `enable_thinking` but thinks only when it is set; Qwen3's (edited,
    so not matched by name) thinks unless it is unset."""
    gemma4 = make_tokenizer("gemma4")
    assert not detect(gemma4).thinks and token_budget(gemma4) == 256
    assert token_budget(gemma4, chat_kwargs={"enable_thinking": True}) == 4096  # when asked to think
    edited = make_tokenizer("qwen3")
    edited.chat_template += "\n"
    assert detect(edited).template is None and detect(edited).thinks and token_budget(edited) == 4096


def test_harmony_ends_as_samplers_and_trainers_leave_it():
    tok = make_tokenizer("gptoss")
    text = completion(tok, call())
    assert text.endswith("<|call|>")
    parse = parser_for(tok)
    stopped = text.removesuffix("<|call|>")  # a sampler that cuts the stop token <|call|>
    padded = text + "<|return|><|return|>"  # a trainer that pads with EOS after the stop
    assert parse(stopped, TOOLS).valid and parse(padded, TOOLS).valid
    assert not parse(text + "<|start|>assistant<|channel|>final<|message|>done", TOOLS).valid


def test_xml_arguments_are_typed_by_the_tool_schema():
    tok = make_tokenizer("qwen3_5_think")
    text = completion(tok, call())
    args = json.loads(parser_for(tok)(text, TOOLS).message.tool_calls[0].function.arguments)
    assert args == {"order_id": "75001", "quantity": 3}  # "75001" stays a string: the schema says so


# ---------------------------------------------------------------- SFT, profiling, GRPO


def test_sft_labels_cover_the_assistant_action_only(family):
    from pivotrl.train.sft import tokenize_trajectory

    name, tok = family
    reasoning = "Cancel via cancel_order." if thinks(tok) else None
    traj = Trajectory(id="t", tools=TOOLS, messages=CONTEXT + [call(reasoning=reasoning)])
    row = tokenize_trajectory(tok, traj)
    trained = tok.decode([t for t in row["labels"] if t != -100])
    assert "cancel_order" in trained and "75001" in trained and "Cancel 3 items" not in trained
    rendered = tok.decode(row["input_ids"])
    if reasoning and reasoning in rendered:  # the template renders the target turn's reasoning
        assert reasoning in trained
    if name in ("qwen3", "qwen3_5_think", "nemotron_3_nano", "glm4moe", "gptoss"):
        assert reasoning in trained  # templates known to render it


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=8192,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    path = tmp_path_factory.mktemp("family_model")
    LlamaForCausalLM(config).save_pretrained(path)
    return path


@pytest.mark.parametrize("name", sorted(set(FAMILIES) - RUN_BY_THE_JOURNEY))
def test_one_profile_with_a_tiny_model(name, tiny_model):
    from pivotrl.profile.loop import ProfileConfig, RunStats, profile_stream
    from pivotrl.sampling.hf import HFSampler

    tok = make_tokenizer(name)
    sampler = HFSampler(str(tiny_model), tokenizer=tok, batch_size=4)
    stats = RunStats()
    cfg = ProfileConfig(k=2, max_new_tokens=3)
    [profile] = list(profile_stream([TURN], sampler, get_verifier("toolcall"), tok, cfg, stats))
    assert profile.k == 2 and stats.rollout_turns == 2
    assert stats.truncated_samples == sum(s.finish_reason == "length" for s in profile.samples)
    assert stats.prompt_tokens == len(prompt_token_ids(tok, prompt_text(tok, CONTEXT, TOOLS)))


@pytest.mark.parametrize("name", sorted(set(FAMILIES) - RUN_BY_THE_JOURNEY))
def test_one_grpo_step_with_a_tiny_model(name, tiny_model, tmp_path):
    from pivotrl.train.config import GRPORunConfig
    from pivotrl.train.grpo import build_trainer

    tok = make_tokenizer(name)
    cfg = GRPORunConfig(model=str(tiny_model), pivots=str(tmp_path / "p.jsonl"), output_dir=str(tmp_path / "run"),
                        num_generations=2, per_device_train_batch_size=2, max_completion_length=3,
                        max_steps=1, save_steps=10, learning_rate=1e-3)
    trainer = build_trainer(cfg, [TURN], tokenizer=tok)
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {"truncated_rate", "invalid_rate"} <= set(rows[-1]) and rows[-1]["rollout_turns"] == 2


# ---------------------------------------------------------------- one BOS everywhere


def _count(ids, bos_id) -> int:
    return sum(1 for t in ids if t == bos_id)


def test_prompts_carry_one_bos_in_every_stage(tiny_model, tmp_path, monkeypatch):
    from pivotrl.sampling.base import SamplingParams
    from pivotrl.sampling.hf import HFSampler
    from pivotrl.train.config import GRPORunConfig
    from pivotrl.train.grpo import build_trainer
    from pivotrl.train.sft import tokenize_trajectory

    tok = make_tokenizer("llama3_1", add_bos=True)
    bos = tok.bos_token_id
    text = prompt_text(tok, CONTEXT, TOOLS)
    assert _count(tok(text)["input_ids"], bos) == 2  # what the default encode would feed the model
    ids = prompt_token_ids(tok, text)
    assert ids[0] == bos and _count(ids, bos) == 1
    # GRPO (TRL's prompt tokenization, which also feeds vLLM colocate by ids)
    cfg = GRPORunConfig(model=str(tiny_model), pivots=str(tmp_path / "p.jsonl"), output_dir=str(tmp_path / "run"),
                        num_generations=2, per_device_train_batch_size=2, max_completion_length=2, max_steps=1)
    trainer = build_trainer(cfg, [TURN], tokenizer=tok)
    assert trainer._tokenize_prompts([text])[0] == [ids]
    # profiling / evaluation sampler
    [[c]] = HFSampler(str(tiny_model), tokenizer=tok).sample([text], 1, SamplingParams(max_new_tokens=1, seed=0))
    assert c.prompt_tokens == len(ids)
    # SFT
    traj = Trajectory(id="t", tools=TOOLS, messages=CONTEXT + [call()])
    assert _count(tokenize_trajectory(tok, traj)["input_ids"], bos) == 1
    # vLLM: prompts go in as token ids
    seen = {}

    class FakeLLM:
        def __init__(self, model, **kw):
            pass

        def get_tokenizer(self):
            return tok

        def generate(self, prompts, params, use_tqdm=False):
            seen["prompts"], seen["params"] = prompts, params
            return []

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=FakeLLM, SamplingParams=lambda **kw: kw))
    from pivotrl.sampling.vllm import VLLMSampler

    VLLMSampler("m").sample([text], 1, SamplingParams(max_new_tokens=1))
    assert seen["prompts"] == [{"prompt_token_ids": ids}]
    assert seen["params"][0]["skip_special_tokens"] is False  # call delimiters reach the parser


@pytest.mark.parametrize("name", ["gptoss", "deepseekv3", "qwen3_5_think"])
def test_grpo_reward_reads_trls_completion_ids_in_the_family_format(name):
    from pivotrl.train.grpo import turn_json
    from pivotrl.train.reward import PivotReward

    tok = make_tokenizer(name)
    texts = [completion(tok, call()), completion(tok, call(quantity=4))]
    ids = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
    trl_texts = tok.batch_decode(ids, skip_special_tokens=True)  # what TRL passes as `completions`
    reward = PivotReward("toolcall", parse=parser_for(tok), tokenizer=tok)
    assert reward(["p", "p"], trl_texts, [turn_json(TURN)] * 2, completion_ids=ids) == [1.0, 0.0]


def test_completion_text_keeps_call_delimiters_that_are_special_tokens():
    tok = make_tokenizer("gptoss")
    text = completion(tok, call())
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids, skip_special_tokens=True) != text  # what TRL hands a reward function
    assert parser_for(tok)(completion_text(tok, ids), TOOLS).valid
