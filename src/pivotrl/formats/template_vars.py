"""Chat-template variables: a `chat_template_kwargs` key the model's chat template never reads
changes nothing. A misspelt `enable_thinkng: false` would be accepted silently and thinking
stay on, so every stage that renders prompts asks `unread_template_kwargs` first (a warning,
an error with --strict).

The variables a template reads are those jinja2 finds undeclared in its source
(`jinja2.meta.find_undeclared_variables`): every name the template uses that it does not set
itself, i.e. what the caller may pass. A template that reads a variable only through a dynamic
lookup (`context[name]`) is not seen; none of the families pivotrl knows does that.
"""

from __future__ import annotations

from typing import Any


def _environment():
    """A Jinja environment that parses what transformers' chat templates use: loop controls and
    training templates' `{% generation %}` blocks (parsed as a plain scope: only the names inside
    matter here)."""
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    return ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols", Generation])


def template_variables(source: str) -> set[str]:
    """The names a Jinja template reads from its caller."""
    from jinja2 import meta

    return set(meta.find_undeclared_variables(_environment().parse(source)))


def template_sources(tokenizer: Any) -> list[str]:
    """The tokenizer's chat template source(s): one string, or each of a named set's."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        return [t for t in template.values() if isinstance(t, str)]
    return [template] if isinstance(template, str) else []


def unread_template_kwargs(tokenizer: Any, chat_kwargs: dict[str, Any] | None) -> list[str]:
    """The keys of `chat_kwargs` no chat template of `tokenizer` reads ([] when it has none to
    check, or every key is read)."""
    sources = template_sources(tokenizer)
    if not chat_kwargs or not sources:
        return []
    read: set[str] = set()
    for source in sources:
        try:
            read |= template_variables(source)
        except Exception:  # noqa: BLE001 - a template jinja2 cannot parse: rendering will say so
            return []
    return sorted(k for k in chat_kwargs if k not in read)


def unread_kwargs_warning(tokenizer: Any, chat_kwargs: dict[str, Any] | None, model: Any) -> str | None:
    """The warning for `unread_template_kwargs`, naming each key; None when there is none."""
    unread = unread_template_kwargs(tokenizer, chat_kwargs)
    if not unread:
        return None
    return (f"chat_template_kwargs {', '.join(map(repr, unread))}: the chat template of {model} never "
            "reads " + ("it" if len(unread) == 1 else "them") + " (misspelt?), so "
            + ("it changes" if len(unread) == 1 else "they change") + " nothing")
