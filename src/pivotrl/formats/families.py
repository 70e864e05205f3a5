"""A model's own response format, found from its tokenizer: which family's chat template it ships,
how its tool calls are written, whether it thinks, and the parser that reads its completions.

`parser_for(tokenizer)` is the one entry point: profiling, the GRPO reward, evaluation and
`pivotrl verify --model` parse with what it returns (plugged into `pivotrl.scoring`'s `parse=`).

Detection: the chat template is compared with the family templates TRL ships
(`trl.chat_template_utils`), then, for edited or unlisted templates, with the tool-call markers it
renders. A tokenizer that matches no family but carries its own `response_template`
(transformers' response parsing), or whose template TRL has one for (`add_response_schema`:
LFM2.5, Gemma 4, ...), is read with `tokenizer.parse_response`, under the same strictness rules
(pivotrl.formats.response_template); that comes before guessing from markers.
A template that matches nothing is an error that names the fix (`response_format`), never a
parser that silently scores every call 0.

Known families are read by pivotrl's own strict readers (`actions`, `callformats`) rather than by
`tokenizer.parse_response`: the response templates are built for chat front-ends and accept an
unclosed call, text after the last call, or a broken call as content, each of which would be a
reward leak or a silent 0 here (tests/test_families.py checks both agree on well-formed output).
"""

from __future__ import annotations

import copy as copy_module
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pivotrl.formats.actions import (END_MARKERS, FOREIGN_CALL_MARKERS, InvalidAction, ParsedAction,
                             parse_with, split_json_calls)
from pivotrl.formats.call_syntax import (ArgumentTyper, split_deepseek_calls, split_glm_calls,
                                 split_harmony, split_xml_calls)
from pivotrl.formats.response_template import response_template_reader

# Token budgets (max_new_tokens / max_completion_length) when the config leaves them unset. One
# tool-calling action fits in ~100 tokens; a thinking model first reasons, typically a few hundred
# to ~2k tokens for one agent turn, so 4096 leaves room without paying for runaway generations
# (cut samples are counted: profile stats `truncated_samples`, training `truncated_rate`).
PLAIN_TOKEN_BUDGET = 256
THINKING_TOKEN_BUDGET = 4096


@dataclass(frozen=True)
class ResponseFormat:
    """How one family writes an assistant turn."""

    name: str
    split_calls: Callable[[str], tuple[str, list]]
    markers: tuple[str, ...]  # only ever written inside a call: left in the content = broken call
    think: bool = True  # <think>…</think> blocks hold the reasoning
    typed_by_schema: bool = False  # arguments written as raw text (see callformats)
    end_markers: tuple[str, ...] = END_MARKERS
    call_openers: tuple[str, ...] = ("<tool_call>",)  # how a call block starts


_XML_MARKERS = ("<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=",
                "</parameter>")
FORMATS = {f.name: f for f in (
    ResponseFormat("hermes", split_json_calls, FOREIGN_CALL_MARKERS),
    ResponseFormat("qwen-xml", split_xml_calls, _XML_MARKERS + FOREIGN_CALL_MARKERS,
                   typed_by_schema=True),
    ResponseFormat("glm", split_glm_calls, ("<tool_call>", "</tool_call>") + FOREIGN_CALL_MARKERS,
                   typed_by_schema=True, end_markers=END_MARKERS + ("<|user|>", "<|observation|>")),
    ResponseFormat("deepseek", split_deepseek_calls, FOREIGN_CALL_MARKERS,
                   end_markers=END_MARKERS + ("<｜end▁of▁sentence｜>",),
                   call_openers=("<｜tool▁calls▁begin｜>",)),
    # gpt-oss reasons in the analysis channel, not in <think>. Its turn ends with <|return|> or
    # <|call|>; the reader must see <|call|> (it ends a call), <|return|> only ends the turn (and
    # is the tokenizer's EOS, which a trainer may leave after a <|call|> stop).
    ResponseFormat("harmony", split_harmony, ("<|channel|>", "<|message|>", "<|call|>",
                                               "to=functions.", "<|start|>"), think=False,
                   end_markers=END_MARKERS + ("<|return|>",)),
)}

# TRL template name (trl.chat_template_utils.<name>_chat_template) → (format, thinks by default).
KNOWN_TEMPLATES: dict[str, tuple[str, bool]] = {
    "qwen2_5": ("hermes", False), "qwen3": ("hermes", True), "qwen3_instruct_2507": ("hermes", False),
    "qwen3_5_think": ("qwen-xml", True), "qwen3_5_nothink": ("qwen-xml", False),
    "qwen3_6": ("qwen-xml", True), "qwen3_8": ("qwen-xml", True),
    "nemotron_3_nano": ("qwen-xml", True), "nemotron_3_super": ("qwen-xml", True),
    "nemotron_3_ultra": ("qwen-xml", True), "nemotron_3_5_lightning": ("qwen-xml", True),
    "llama3_1": ("hermes", False), "llama3_2": ("hermes", False),
    "gptoss": ("harmony", True), "glm4moe": ("glm", True), "deepseekv3": ("deepseek", False),
}

# Markers a template renders its calls with, most specific first (for edited / unlisted templates).
_TEMPLATE_MARKERS = (("<parameter=", "qwen-xml"), ("<arg_key>", "glm"), ("tool▁call▁begin", "deepseek"),
                     ("to=functions.", "harmony"), ("<tool_call>", "hermes"), ("[TOOL_CALLS]", "hermes"),
                     ("<|python_tag|>", "hermes"), ('"parameters"', "hermes"))


class UnknownFormatError(ValueError):
    """The tokenizer's chat template matches no tool-call format pivotrl reads."""


@dataclass(frozen=True)
class Family:
    """What `detect` found: the TRL template it is (None when matched by markers), its format."""

    template: str | None
    format: str
    thinks: bool


@functools.lru_cache(maxsize=1)
def _trl_templates() -> dict[str, str]:
    import trl.chat_template_utils as utils

    return {name: getattr(utils, f"{name}_chat_template") for name in KNOWN_TEMPLATES
            if isinstance(getattr(utils, f"{name}_chat_template", None), str)}


def chat_template_of(tokenizer: Any) -> str | None:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named variants: "default" is the one apply_chat_template uses
        template = template.get("default")
    return template if isinstance(template, str) else None


def detect(tokenizer: Any, response_format: str | None = None) -> Family:
    """The family of `tokenizer`'s chat template (see the module docstring for the order)."""
    template = chat_template_of(tokenizer)
    for name, text in _trl_templates().items():
        if template == text:
            fmt, thinks = KNOWN_TEMPLATES[name]
            return Family(name, response_format or fmt, thinks)
    thinks = bool(template) and ("<think>" in template or _thinks_by_default(tokenizer, template))
    if response_format:
        if response_format not in FORMATS and response_format != "response-template":
            raise UnknownFormatError(f"response_format {response_format!r} is not one of "
                                     f"{', '.join(FORMATS)}, response-template")
        return Family(None, response_format, thinks)
    # The model's own statement of its format comes before guessing from markers.
    if _with_response_template(tokenizer) is not None:
        return Family(None, "response-template", thinks)
    for marker, fmt in _TEMPLATE_MARKERS:
        if template and marker in template:
            return Family(None, fmt, thinks or fmt == "harmony")
    where = getattr(tokenizer, "name_or_path", "") or "the tokenizer"
    problem = "no chat template" if not template else "its chat template writes tool calls in no known format"
    raise UnknownFormatError(
        f"{where}: {problem} (formats: {', '.join(FORMATS)}; families: {', '.join(KNOWN_TEMPLATES)}). "
        "Fix: set `response_format:` in the config (or --response-format) to the format the model "
        "writes, or give the tokenizer a `response_template` (transformers response parsing) in "
        "tokenizer_config.json.")


def _thinks_by_default(tokenizer: Any, template: str) -> bool:
    """Whether a template that takes `enable_thinking` thinks when the caller says nothing. Qwen3's
    thinks unless told not to (its prompt with `enable_thinking: false` differs from the default
    one); Gemma 4's thinks only when told to (the same prompt): taking the word alone for thinking
    gave Gemma 4 a 4096-token budget for answers that fit in 256."""
    if "enable_thinking" not in template:
        return False
    from pivotrl.formats.chat import apply_template

    probe = [{"role": "user", "content": "hi"}]
    try:
        default = apply_template(tokenizer, probe, None, add_generation_prompt=True)
        off = apply_template(tokenizer, probe, None, add_generation_prompt=True, enable_thinking=False)
    except Exception:  # noqa: BLE001 - a template that cannot render the probe: assume it thinks
        return True
    return default != off


def _with_response_template(tokenizer: Any) -> Any:
    """`tokenizer` when it carries a response_template, else a shallow copy carrying the one TRL
    knows for its chat template (LFM2.5, Gemma 4, ...), else None. The caller's tokenizer is
    left as it is."""
    if tokenizer is None:
        return None
    if getattr(tokenizer, "response_template", None) is not None:
        return tokenizer
    try:
        from trl.chat_template_utils import add_response_schema

        copy = add_response_schema(copy_module.copy(tokenizer))
    except (ValueError, AttributeError, TypeError):
        return None
    return copy if getattr(copy, "response_template", None) is not None else None


def generation_prompt_opens_think(tokenizer: Any, chat_kwargs: dict[str, Any] | None = None) -> bool:
    """Whether the template's generation prompt ends inside an open <think> block."""
    from pivotrl.formats.chat import apply_template

    try:
        text = apply_template(tokenizer, [{"role": "user", "content": "hi"}], None,
                              add_generation_prompt=True, **(chat_kwargs or {}))
    except Exception:  # noqa: BLE001 - a template that cannot render this probe does not open one
        return False
    return text.rfind("<think>") > text.rfind("</think>")


def is_thinking(tokenizer: Any, chat_kwargs: dict[str, Any] | None = None,
                response_format: str | None = None) -> bool:
    """Whether the model reasons before acting with these chat-template kwargs."""
    kwargs = chat_kwargs or {}
    if generation_prompt_opens_think(tokenizer, kwargs):
        return True
    if kwargs.get("enable_thinking") is False or kwargs.get("thinking") is False:
        return False
    if kwargs.get("enable_thinking") is True or kwargs.get("thinking") is True:
        return True  # asked for (Gemma 4 thinks only when asked, in its own channel, not <think>)
    try:
        return detect(tokenizer, response_format).thinks
    except UnknownFormatError:
        return False


def token_budget(tokenizer: Any, *, chat_kwargs: dict[str, Any] | None = None,
                 response_format: str | None = None) -> int:
    """Default tokens per completion: room for the reasoning of a thinking model."""
    thinking = is_thinking(tokenizer, chat_kwargs, response_format)
    return THINKING_TOKEN_BUDGET if thinking else PLAIN_TOKEN_BUDGET


class FormatParser:
    """`parse(text, tools=None) -> ParsedAction` in one model's format. `tools` (the turn's tool
    schemas, passed by `pivotrl.scoring`) types raw-text arguments of XML-style formats."""

    typed_by_tools = True

    def __init__(self, fmt: ResponseFormat, think_opens_in_prompt: bool = False,
                 tokenizer: Any = None):
        self.format = fmt
        self.think_opens_in_prompt = think_opens_in_prompt
        self.tokenizer = tokenizer
        self.name = fmt.name

    def __call__(self, text: str, tools: list | None = None) -> ParsedAction:
        fmt = self.format
        typer = ArgumentTyper(tools) if fmt.typed_by_schema else None
        split = fmt.split_calls
        if fmt.name == "response-template":  # transformers types the arguments with the tools
            split = functools.partial(split, tools=tools)
        return parse_with(text, split, think=fmt.think,
                          think_opens_in_prompt=self.think_opens_in_prompt, call_openers=fmt.call_openers,
                          end_markers=fmt.end_markers, forbidden=fmt.markers, type_args=typer)

    def __repr__(self) -> str:
        return f"FormatParser({self.name!r})"


def parser_for(tokenizer: Any, *, chat_kwargs: dict[str, Any] | None = None,
               response_format: str | None = None) -> FormatParser:
    """The parser of `tokenizer`'s own response format (`response_format` overrides detection).
    Raises UnknownFormatError (naming the fix) when the format cannot be told."""
    family = detect(tokenizer, response_format)
    if family.format == "response-template":
        split, markers = response_template_reader(_with_response_template(tokenizer) or tokenizer)
        fmt = ResponseFormat("response-template", split, markers, think=False)
    else:
        fmt = FORMATS[family.format]
    opens = generation_prompt_opens_think(tokenizer, chat_kwargs)
    return FormatParser(fmt, think_opens_in_prompt=opens, tokenizer=tokenizer)


def parser_for_model(model: str | None, response_format: str | None = None) -> FormatParser:
    """`parser_for` the tokenizer in a model or tokenizer-only directory (or hub id)."""
    tokenizer = None
    if model is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model)
    return parser_for(tokenizer, response_format=response_format)


def training_chat_template(tokenizer: Any) -> str | None:
    """The template SFT renders with, so that `return_assistant_tokens_mask` marks the assistant's
    tokens: None when the model's own has {% generation %} markers, else TRL's training version of
    a known family (same rendering plus the markers). Raises ValueError naming the fix otherwise."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    template = chat_template_of(tokenizer)
    if template is None:
        raise ValueError("the tokenizer has no chat template")
    if has_generation_markers(template):
        return None
    try:
        return get_training_chat_template(tokenizer)
    except ValueError:
        raise ValueError("the chat template has no {% generation %} markers and is not a family TRL "
                         "ships a training template for: add {% generation %}…{% endgeneration %} "
                         "around the assistant's output in the template, or set "
                         "assistant_only_loss: false") from None


__all__ = ["FORMATS", "KNOWN_TEMPLATES", "Family", "FormatParser", "InvalidAction",
           "UnknownFormatError", "detect", "is_thinking", "parser_for", "token_budget",
           "training_chat_template"]
