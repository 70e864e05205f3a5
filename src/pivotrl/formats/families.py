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

Whatever found the format (a TRL template, a marker, the response template, or the user's own
`response_format`), it is kept only when it reads the template's own writing: a probe call (one
tool, a string and an integer argument) rendered by the tokenizer's template, cut from its
prompt, must parse back as the same call (`_round_trip_failure`, once per template). A marker
can match text that is no call (Muse Glimmer prints its tool *definitions* as JSON with
"parameters" keys and writes calls in its own syntax), and a template that renders no tool calls
or results (Cohere2's default) cannot carry a tool-calling run under any format; both are
refused, saying which. A template set is read as transformers renders prompts with tools: its
"tool_use" template when it has one (`chat_template_of`).

Known families are read by pivotrl's own strict readers (`actions`, `callformats`) rather than by
`tokenizer.parse_response`: the response templates are built for chat front-ends and accept an
unclosed call, text after the last call, or a broken call as content, each of which would be a
reward leak or a silent 0 here (tests/test_families.py checks both agree on well-formed output).
"""

from __future__ import annotations

import copy as copy_module
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
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
    """The template text `apply_chat_template` renders a prompt with tools with. A template set
    (a dict of named templates, as Cohere tokenizers ship) is read as transformers reads it
    (`get_chat_template`): "tool_use" when tools are passed and the set has one, else "default".
    pivotrl's prompts carry the turn's tools, so that is the template detection must read."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("tool_use", template.get("default"))
    return template if isinstance(template, str) else None


def detect(tokenizer: Any, response_format: str | None = None,
           chat_kwargs: dict[str, Any] | None = None) -> Family:
    """The family of `tokenizer`'s chat template (see the module docstring for the order), kept
    only when the template's own render of a probe call reads back as that call in the family's
    format (`_round_trip_failure`); otherwise UnknownFormatError naming the template, what failed
    and the fix. `chat_kwargs`: the template variables the prompts are rendered with."""
    render = _render_key(tokenizer, chat_kwargs)
    try:
        family = _family(tokenizer, response_format)
    except UnknownFormatError:  # no format found: say so, or that no format could serve
        unusable = _probe_turn(render)[1] if render is not None and not response_format else None
        if unusable is None:
            raise
        raise UnknownFormatError(_refusal(tokenizer, None, unusable, cannot_render=True)) from None
    if render is None:
        return family
    unusable = _probe_turn(render)[1]
    why = unusable or _round_trip_failure(render, family.format,
                                          _key(getattr(tokenizer, "response_template", None)))
    if why is not None:
        how = "given as response_format" if response_format else "detected"
        raise UnknownFormatError(_refusal(tokenizer, family, why, cannot_render=unusable is not None,
                                          how=how))
    return family


def _family(tokenizer: Any, response_format: str | None) -> Family:
    """The family the template names: a TRL template it is, the given format, the tokenizer's
    response template, or the call markers it renders (in that order)."""
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
    return _parser(tokenizer, detect(tokenizer, response_format, chat_kwargs).format, chat_kwargs)


def _parser(tokenizer: Any, name: str, chat_kwargs: dict[str, Any] | None) -> FormatParser:
    """The parser of format `name` for `tokenizer`, with no check that its template writes it."""
    if name == "response-template":
        split, markers = response_template_reader(_with_response_template(tokenizer) or tokenizer)
        fmt = ResponseFormat("response-template", split, markers, think=False)
    else:
        fmt = FORMATS[name]
    opens = generation_prompt_opens_think(tokenizer, chat_kwargs)
    return FormatParser(fmt, think_opens_in_prompt=opens, tokenizer=tokenizer)


def parser_for_model(model: str | None, response_format: str | None = None) -> FormatParser:
    """`parser_for` the tokenizer in a model or tokenizer-only directory (or hub id)."""
    tokenizer = None
    if model is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model)
    return parser_for(tokenizer, response_format=response_format)


# The round-trip probe: one tool with a string and an integer parameter, a user turn, the
# assistant's call to it, and the tool's result.
_PROBE_NAME, _PROBE_ARGS = "get_weather", {"city": "Paris", "days": 3}
_PROBE_RESULT_TEXT = "Sunny, 21 C"
_PROBE_TOOLS = [{"type": "function", "function": {
    "name": _PROBE_NAME, "description": "The weather forecast for a city.", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"]}}}]
_PROBE_USER = {"role": "user", "content": "What is the weather in Paris for the next 3 days?"}
_PROBE_CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "call_0", "type": "function", "function": {"name": _PROBE_NAME, "arguments": _PROBE_ARGS}}]}
_PROBE_RESULT = {"role": "tool", "tool_call_id": "call_0", "name": _PROBE_NAME, "content": _PROBE_RESULT_TEXT}


@dataclass(frozen=True)
class _Render:
    """The cache key of one probe render (template text, chat kwargs as JSON), carrying the
    tokenizer that renders it (left out of the key: the verdict is the template's)."""

    template: str
    chat_kwargs: str
    tokenizer: Any = field(compare=False, hash=False, repr=False)


def _render_key(tokenizer: Any, chat_kwargs: dict[str, Any] | None) -> _Render | None:
    template = chat_template_of(tokenizer)
    return None if template is None else _Render(template, _key(chat_kwargs or {}), tokenizer)


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


@functools.lru_cache(maxsize=64)
def _probe_turn(render: _Render) -> tuple[str, str | None]:
    """(the probe call as the model writes it, why the template cannot carry tool calls or None).
    The turn is the template's render of [user, call] less its prompt for [user]
    (`chat.assistant_turn_text`); the template must also render the call's tool result."""
    from pivotrl.formats.chat import apply_template, assistant_turn_text

    tokenizer, kwargs = render.tokenizer, json.loads(render.chat_kwargs)
    try:
        turn = assistant_turn_text(tokenizer, [_PROBE_USER], _PROBE_TOOLS, _PROBE_CALL, **kwargs)
    except Exception as exc:  # noqa: BLE001 - any template error: it cannot render a call
        return "", f"cannot render tool calls: {_first_line(exc)}"
    if turn is None:
        return "", "re-renders the conversation when an assistant turn is added (the model's turn cannot be cut out)"
    if _PROBE_NAME not in turn:
        return turn, f"renders no tool calls (the probe's assistant turn comes out as {turn!r})"
    try:
        after = apply_template(tokenizer, [_PROBE_USER, _PROBE_CALL, _PROBE_RESULT], _PROBE_TOOLS,
                               add_generation_prompt=True, **kwargs)
    except Exception as exc:  # noqa: BLE001 - any template error: it cannot render a result
        return turn, f"cannot render tool results: {_first_line(exc)}"
    return turn, None if _PROBE_RESULT_TEXT in after else "renders no tool results"


@functools.lru_cache(maxsize=64)
def _round_trip_failure(render: _Render, fmt: str, response_template: str) -> str | None:
    """Why format `fmt`'s parser does not read the template's render of the probe call back as
    that call (or why the template cannot carry calls at all), else None. A format that fails
    here would score every correct call 0. `response_template` is only part of the cache key."""
    turn, unusable = _probe_turn(render)
    if unusable is not None:
        return unusable
    try:
        parsed = _parser(render.tokenizer, fmt, json.loads(render.chat_kwargs))(turn, _PROBE_TOOLS)
    except (ValueError, KeyError) as exc:
        return f"has no {fmt} reader: {_first_line(exc)}"
    read = _read_as(parsed)
    if read is None:
        return None
    probe = _show(_PROBE_NAME, _PROBE_ARGS)
    return f"renders the probe call {probe} as {turn!r}, which the {fmt} reader reads as {read}"


def _read_as(parsed: ParsedAction) -> str | None:
    """What a parse of the probe's turn holds when it is not the probe call alone, else None."""
    from pivotrl.formats.actions import call_arguments

    if not parsed.valid:
        return f"an invalid action ({parsed.reason})"
    message = parsed.message
    calls = [(c.function.name, call_arguments(c.function.arguments)) for c in message.tool_calls or []]
    content = (message.content or "").strip()
    if calls == [(_PROBE_NAME, _PROBE_ARGS)] and not content:
        return None
    if not calls:
        return f"a message with no call ({content[:120]!r})"
    shown = ", ".join(_show(name, args) for name, args in calls)
    return shown + (f" with the text {content[:120]!r}" if content else "")


def _show(name: str, args: dict[str, Any]) -> str:
    return f"{name}({json.dumps(args, ensure_ascii=False)})"


def _first_line(exc: Exception) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def _refusal(tokenizer: Any, family: Family | None, why: str, *, cannot_render: bool, how: str = "") -> str:
    """The UnknownFormatError text: which template, what failed, what it would cost, the fix
    (`cannot_render`: the template cannot carry tool calls, so no format setting can help)."""
    where = getattr(tokenizer, "name_or_path", "") or "the tokenizer"
    which = f"TRL's {family.template} template" if family and family.template else "its chat template"
    if isinstance(getattr(tokenizer, "chat_template", None), dict):
        which += " (the one of its template set that renders tools)"
    cost = f"; read in the {family.format} format ({how}) every correct call would score 0" if family else ""
    if cannot_render:
        fix = ("Fix: give the model a chat template that renders tools, tool calls and tool results "
               "(in a template set, a \"tool_use\" one); setting `response_format:` in the config (or "
               "--response-format) only says how completions are read and cannot put the calls in "
               "the prompts.")
    else:
        fix = ("Fix: set `response_format:` in the config (or --response-format) to the format the "
               f"model writes its calls in ({', '.join(FORMATS)}), or give the tokenizer a "
               "`response_template` (transformers response parsing) in tokenizer_config.json.")
    return f"{where}: {which} {why}{cost}. {fix}"


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
