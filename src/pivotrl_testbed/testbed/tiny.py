"""The testbed's tiny base model: a byte-level BPE tokenizer, a Qwen/Hermes chat template, a Llama.

Nothing is downloaded. The tokenizer is trained with `tokenizers` on the testbed's own text; the
model is a transformers Llama (not qwen2: with a qwen2 config, `AutoTokenizer.from_pretrained`
in transformers 5.x swaps in Qwen's pre-tokenizer and ids change — docs/DESIGN.md) sized for 2 CPU cores.

Chat format (what Qwen2.5/Hermes models emit):

    <|im_start|>system\n[system text\n\n]# Tools ... <tools>\n{tool json}\n...</tools> ...<|im_end|>
    <|im_start|>user\n...<|im_end|>
    <|im_start|>assistant\n[content][\n]<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call><|im_end|>
    <|im_start|>user\n<tool_response>\n...\n</tool_response>[\n<tool_response>...]<|im_end|>

Tool results use Qwen's choice: a `user` block of `<tool_response>` entries, consecutive tool
messages grouped into one block. The assistant part between `<|im_start|>assistant\n` and the
newline after `<|im_end|>` is byte-identical to `actions.render_action(message) + "<|im_end|>"`:
both write the call as `json.dumps({"name", "arguments"}, ensure_ascii=False)` (transformers'
`tojson` filter is that json.dumps, key order kept). It sits inside `{% generation %}` so
assistant-only loss masks work. `<|im_end|>` is the EOS (a special token); the `<tool_call>`-style
markers are ordinary added tokens, because TRL decodes completions with skip_special_tokens=True.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

IM_START, IM_END, PAD = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
SPECIAL_TOKENS = [PAD, IM_START, IM_END]
# Single tokens (easier for a tiny model) but NOT special: they must survive skip_special_tokens.
MARKER_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<tools>",
                 "</tools>", "<think>", "</think>"]

TOOLS_PREAMBLE = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                  "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
TOOLS_POSTAMBLE = ("\n</tools>\n\nFor each function call, return a json object with function name and "
                   "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                   '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')

CHAT_TEMPLATE = (
    "{%- macro text(content) -%}"
    "{%- if content is none -%}"
    "{%- elif content is string -%}{{ content }}"
    "{%- else -%}{%- for part in content -%}"
    "{%- if part is mapping -%}{{ part.text if part.text is defined and part.text is not none else '' }}"
    "{%- else -%}{{ part }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    # system block (with tools, Qwen style)
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages and messages[0].role == 'system' -%}{{- text(messages[0].content) + '\\n\\n' -}}{%- endif -%}"
    "{{- " + json.dumps(TOOLS_PREAMBLE) + " -}}"
    "{%- for tool in tools -%}{{- '\\n' -}}{{- tool | tojson -}}{%- endfor -%}"
    "{{- " + json.dumps(TOOLS_POSTAMBLE) + " + '<|im_end|>\\n' -}}"
    "{%- elif messages and messages[0].role == 'system' -%}"
    "{{- '<|im_start|>system\\n' + text(messages[0].content) + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'system' and loop.first -%}"
    "{%- elif message.role == 'user' or message.role == 'system' -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + text(message.content) + '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- generation -%}"
    "{%- set body = text(message.content) | trim -%}"
    "{{- body -}}"
    "{%- for tc in (message.tool_calls or []) -%}"
    "{%- set f = tc.function if tc.function is defined else tc -%}"
    "{%- if body or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n' -}}"
    "{%- if f.arguments is string -%}"
    "{{- '{\"name\": ' + (f.name | tojson) + ', \"arguments\": ' + f.arguments + '}' -}}"
    "{%- else -%}"
    "{{- {'name': f.name, 'arguments': f.arguments} | tojson -}}"
    "{%- endif -%}"
    "{{- '\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>' -}}"
    "{%- endgeneration -%}"
    "{{- '\\n' -}}"
    "{%- elif message.role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + text(message.content) + '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# A little built-in text so a tokenizer always knows the template's fixed strings and ASCII.
_SEED_TEXT = [
    TOOLS_PREAMBLE + TOOLS_POSTAMBLE,
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n",
    "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_order\", \"arguments\": {\"order_id\": \"O-1\"}}"
    "\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{\"status\": \"ok\"}\n</tool_response>",
    "".join(chr(c) for c in range(32, 127)),
    "0 1 2 3 4 5 6 7 8 9 10 42 100 3.5 -7 true false null [] {} \"\" ' ` ~ | \\ / ls cat grep",
]


def _short_word_letter() -> str:
    """Regex of one letter of a word of 1-5 letters, all lower or all upper case, preceded by a
    space or the start and followed by the end, a space or . , ? ! (Onig lookbehinds must be
    fixed-length, hence one alternative per position)."""
    alts = []
    for c in ("[a-z]", "[A-Z]"):
        for i in range(5):
            behind = f"(?<=^{c}{{{i}}}| {c}{{{i}}})" if i else "(?<=^| )"
            alts.append(f"{behind}{c}(?={c}{{0,{4 - i}}}(?:$|[ .,?!]))")
    return "|".join(alts)


_SHORT_WORD_LETTER = _short_word_letter()

# JSON's and the tool schema's own words: these stay merged with the boilerplate around them.
_SCHEMA_WORDS = ("type", "function", "name", "description", "parameters", "properties",
                 "required", "arguments", "object", "string", "integer", "number", "boolean",
                 "array", "items", "enum")
# An identifier standing alone in double quotes (a tool name, an argument key, an id-like value)
# that is not one of the schema's words.
_QUOTED_NAME = (r'(?<=")(?!(?:' + "|".join(_SCHEMA_WORDS) + r')")[A-Za-z_][A-Za-z0-9_]*(?=")')
# A letter of a run joined to a digit (an e-mail's name, an id): spelled out, as digits are.
_LETTER_BEFORE_DIGIT = r"[A-Za-z](?=[A-Za-z]*[0-9])"


def build_tokenizer(texts: Iterable[str], vocab_size: int = 2048, min_frequency: int = 2,
                    isolate_names: bool = False, spell_values: bool = False):
    """A byte-level BPE tokenizer trained on `texts`, with pad `<|endoftext|>`, eos `<|im_end|>`
    and CHAT_TEMPLATE. `isolate_names`: quoted identifiers (tool names, argument keys) are pieces
    of their own; `spell_values`: letter runs joined to digits are spelled out."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    # No GPT-2 word regex: merges may span spaces and punctuation, so the testbed's recurring
    # JSON/tool boilerplate becomes a few tokens (toolshop episodes ~6x shorter, measured) and a
    # tiny model on 2 cores can afford whole episodes. Newlines stay their own pieces so no token
    # straddles a turn boundary (the generation prompt ends in "assistant\n"); digits are split
    # one by one, which helps with ids and arithmetic; so are the letters of short all-lower or
    # all-upper words standing alone (the OOD families reverse/uppercase them: with merged
    # letters a tiny model would first have to learn every token's spelling).
    # With merges across punctuation, `{"name": "run", "arguments": {"` and `command": "ls"}}`
    # are single tokens: the call's name and key are fused with boilerplate and values, tokens
    # that occur nowhere in the tool list, so a model can only memorise them, not copy them from
    # the list (`isolate_names` splits them out; docs/RESULTS.md, "Candidates").
    options = [pattern for pattern, on in ((_QUOTED_NAME, isolate_names),
                                           (_LETTER_BEFORE_DIGIT, spell_values)) if on]
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split("\n", behavior="isolated"),
        pre_tokenizers.Split(Regex(_SHORT_WORD_LETTER), behavior="isolated"),
        *(pre_tokenizers.Split(Regex(p), behavior="isolated") for p in options),
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)

    def corpus():
        yield from _SEED_TEXT
        for t in texts:
            # The special tokens are whole units: keep BPE from learning merges across them.
            for special in SPECIAL_TOKENS + MARKER_TOKENS:
                t = t.replace(special, "\n")
            yield t

    tok.train_from_iterator(corpus(), trainer=trainer)
    return wrap_tokenizer(tok)


def wrap_tokenizer(tok):
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=PAD,
                                   bos_token=None, unk_token=None,
                                   padding_side="left")  # generation pads on the left
    fast.add_special_tokens({"additional_special_tokens": [IM_START]})
    fast.add_tokens([AddedToken(m, special=False, normalized=False) for m in MARKER_TOKENS])
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 4096
    return fast


class TinyModelConfig(BaseModel):
    """The base model's shape. Defaults: docs/DESIGN.md's measured facts (hidden 128 × 2 layers is
    the size for 2 CPU cores; hidden 256 × 4 layers trains 10× slower)."""

    hidden_size: int = Field(128, description="Model width (docs/DESIGN.md: 128 for 2 cores).")
    num_layers: int = Field(2, description="Transformer blocks (docs/DESIGN.md: 2).")
    num_heads: int = Field(4, description="Attention heads (docs/DESIGN.md: 4; head dim 32).")
    intermediate_size: int = Field(384, description="MLP width (3× hidden, Llama-style SwiGLU).")
    max_positions: int = Field(2048, description="Longest sequence (prompt + completion) in tokens; "
                                                  "the testbed's longest episode prompts fit.")
    rope_theta: float = Field(10000.0, description="RoPE base (Llama default).")
    tie_embeddings: bool = Field(True, description="Share input and output embeddings (fewer "
                                                   "parameters, as small Qwen/Llama models do).")
    seed: int = Field(0, description="Initialisation seed.")


def build_model(tokenizer, config: TinyModelConfig | None = None):
    """A randomly initialised LlamaForCausalLM matching the tokenizer's vocabulary."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = config or TinyModelConfig()
    torch.manual_seed(config.seed)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size, num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads, num_key_value_heads=config.num_heads,
        max_position_embeddings=config.max_positions, rope_theta=config.rope_theta,
        tie_word_embeddings=config.tie_embeddings,
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(cfg)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def parameter_count(model) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def save_tiny(model, tokenizer, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def load_tiny(model_dir: str | Path) -> tuple[Any, Any]:
    """(model, tokenizer) from any HF checkpoint dir (eval mode, float32, CPU)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    model.eval()
    return model, tokenizer


def load_pretrain_state(build_dir: str | Path, config: TinyModelConfig, state_file: str = "state.pt"):
    """(model, tokenizer, state) of a build's resumable pretraining state
    (`BUILD/pretrain/<state_file>`: the first stage's `state.pt`, a further stage's
    `state_stage<N>.pt`), so a candidate that pretrains for hours can be probed mid-way."""
    import torch
    from transformers import AutoTokenizer

    build_dir = Path(build_dir)
    tok = AutoTokenizer.from_pretrained(str(build_dir / "base"))
    model = build_model(tok, config)
    state = torch.load(build_dir / "pretrain" / state_file, weights_only=False)
    model.load_state_dict(state["model"])
    model.eval()
    return model, tok, state
