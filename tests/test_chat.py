"""luce.chat.render_chat against transformers' apply_chat_template on the same templates."""
from __future__ import annotations

import pytest

from fixtures.tiny_qwen35 import CHAT_TEMPLATE
from luce.chat import render_chat
from luce.errors import LuceError

# Exercises what real templates use beyond plain ChatML: namespace, loop controls, reversed
# slicing, tojson options, string methods, dict literals, `is defined`.
FEATURE_TEMPLATE = """\
{%- set ns = namespace(last_user=-1) %}
{%- for m in messages[::-1] %}
{%- if m.role == 'user' %}{% set ns.last_user = messages|length - 1 - loop.index0 %}{% break %}{% endif %}
{%- endfor %}
{%- for m in messages %}
{%- if m.role == 'system' %}{% continue %}{% endif %}
[{{ loop.index0 }}{{ '*' if loop.index0 == ns.last_user else '' }}] {{ m.role | upper }}: {{ m.content | trim }}
{%- if m.meta is defined %} {{ m.meta | tojson(indent=2, sort_keys=true) }}{% endif %}
{% endfor %}
{%- if tools %}{{ {'n': tools|length, 'first': tools[0].function.name} | tojson(separators=(',', ':')) }}{% endif %}
{%- if add_generation_prompt %}>>> {{ bos_token }}{% endif %}
"""

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather <in °C> & more",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}

CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello!"}],
    "system": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi ☃ 人工智能"}],
    "multi_turn": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
        {"role": "user", "content": "and 3+3?"},
    ],
    "tool_round_trip": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "  {\"temp\": 21}  "},
    ],
}


def transformers_render(template, messages, **kwargs):
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(conversations=[messages], chat_template=template, **kwargs)
    return rendered[0]


@pytest.mark.parametrize("name", CONVERSATIONS)
@pytest.mark.parametrize("enable_thinking", [None, True, False])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_qwen_like_template_matches_transformers(name, enable_thinking, add_generation_prompt):
    messages = CONVERSATIONS[name]
    tools = [WEATHER_TOOL] if name == "tool_round_trip" else None
    extra = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    want = transformers_render(CHAT_TEMPLATE, messages, tools=tools, add_generation_prompt=add_generation_prompt, **extra)
    got = render_chat(CHAT_TEMPLATE, messages, add_generation_prompt=add_generation_prompt,
                      enable_thinking=enable_thinking, tools=tools)
    assert got == want


def test_thinking_switch_changes_the_generation_prompt():
    on = render_chat(CHAT_TEMPLATE, CONVERSATIONS["user"])
    off = render_chat(CHAT_TEMPLATE, CONVERSATIONS["user"], enable_thinking=False)
    assert on.endswith("<|im_start|>assistant\n")
    assert off == on + "<think>\n\n</think>\n\n"


@pytest.mark.parametrize("name", CONVERSATIONS)
def test_feature_template_matches_transformers(name):
    messages = [dict(m) for m in CONVERSATIONS[name]]
    messages[-1]["meta"] = {"b": [1, "ü"], "a": "<tag> & 'quote'"}
    tools = [WEATHER_TOOL]
    want = transformers_render(FEATURE_TEMPLATE, messages, tools=tools, add_generation_prompt=True, bos_token="<s>")
    got = render_chat(FEATURE_TEMPLATE, messages, tools=tools, bos_token="<s>")
    assert got == want
    assert "<tag> & 'quote'" in got and '"ü"' in got  # tojson keeps text as is: no HTML escaping


@pytest.mark.parametrize("template,messages,message", [
    (CHAT_TEMPLATE, [{"role": "robot", "content": "x"}], "chat template: Unknown role: robot"),
    (CHAT_TEMPLATE, [{"role": "user", "content": "x"}, {"role": "system", "content": "y"}], "System message must be first"),
    ("{% for m in messages %}{{ m.content }", [{"role": "user", "content": "x"}], "chat template: "),
    ("{{ messages.__class__.__mro__ }}", [], "chat template: "),  # the sandbox refuses dunder access
    ("{{ ''.__class__.__subclasses__() }}", [], "chat template: "),
    (None, [{"role": "user", "content": "x"}], "no chat template"),
    ("", [{"role": "user", "content": "x"}], "no chat template"),
])
def test_template_failures_are_one_luce_error(template, messages, message):
    with pytest.raises(LuceError, match=message.replace("(", r"\(")) as info:
        render_chat(template, messages)
    assert "\n" not in str(info.value)
