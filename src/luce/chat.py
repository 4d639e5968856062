"""Render a conversation with the chat template stored in the GGUF (tokenizer.chat_template).

Chat templates are Jinja2 programs written for Hugging Face's `apply_chat_template`, so they are
rendered the way it renders them: a sandboxed, immutable environment (a GGUF is untrusted input and
its template must not reach Python internals), `trim_blocks` and `lstrip_blocks`, the loop-control
extension ({% break %}, {% continue %}), `tojson` that keeps non-ASCII text as is and takes
indent/separators/sort_keys, and the helpers templates call: `raise_exception(msg)`,
`strftime_now(fmt)` and `namespace(...)`. Qwen3.5's template reads `enable_thinking`: left out
(None) the template's default applies (thinking on); False asks for an empty think block.
"""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from luce.errors import LuceError


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Jinja's own tojson HTML-escapes '<', '>', '&' and "'", which would change the prompt text.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(template)


def render_chat(template: str | None, messages: list[dict], add_generation_prompt: bool = True,
                enable_thinking: bool | None = None, tools: list[dict] | None = None, **variables) -> str:
    """The prompt text for `messages` ([{"role": ..., "content": ...}, ...]).

    `tools` are JSON-schema dicts, as for transformers; extra `variables` (e.g. bos_token) are
    passed to the template too. Any template failure is one LuceError line."""
    if not template:
        raise LuceError("this model has no chat template (tokenizer.chat_template); use a plain prompt")
    context = dict(variables, messages=messages, tools=tools, add_generation_prompt=add_generation_prompt)
    if enable_thinking is not None:
        context["enable_thinking"] = enable_thinking
    try:
        return _compile(template).render(**context)
    except jinja2.exceptions.TemplateError as e:  # syntax errors, raise_exception, sandbox refusals
        raise LuceError(f"chat template: {e.message or type(e).__name__}") from None
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
        raise LuceError(f"chat template failed on these messages: {e}") from None
