"""Chat-template goldens: real Hugging Face chat templates rendered by Python's jinja2 the way
transformers' `apply_chat_template` renders them, for hesper-rs's minijinja rendering to match.

    python3 golden-values/chat_templates.py [TEMPLATE_DIR]

Reads every `*.jinja` in TEMPLATE_DIR (default golden-values/chat/templates: templates copied
from llama.cpp 0c1e57098's models/templates/, which holds the ones the published GGUFs carry)
and writes golden-values/chat/expected.json: for each template and each conversation below, with
and without the generation prompt, the text or the exception the template raised; and for each
conversation with tools below (a request offering two tools, a round of calls and their
results, a template variable), the text with the generation prompt, rendered as
`apply_chat_template(messages, tools=TOOLS, **variables)` renders it. A template that refuses a
leading system message is rendered again with the system prompt prepended to the first user
message, as hesper-rs (and llama.cpp) do; `merged` says so.

The environment is transformers' (`_compile_jinja_template`): an immutable sandbox with
trim_blocks, lstrip_blocks and the loopcontrols extension, `raise_exception`, and a `tojson`
that is json.dumps without HTML escaping (and that writes a generator as a list, see below), and `strftime_now` reading a fixed clock
(2026-01-02 03:04:05, which the test gives hesper-rs too) so the goldens do not depend on the
date.
"""
from __future__ import annotations

import json
import sys
import types
from datetime import datetime
from pathlib import Path

from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = Path(__file__).resolve().parent
BOS, EOS = "<BOS>", "<EOS>"
CLOCK = datetime(2026, 1, 2, 3, 4, 5)

CONVERSATIONS = [
    [("user", "Hello")],
    [("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello! How can I help?"),
     ("user", "What is 2+2?")],
    [("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello! How can I help?")],
    [("user", "  Ünïcödé ✓ — \"quotes\" & <tags> {{ not jinja }}\n second line  ")],
    [("user", "a"), ("assistant", "b"), ("user", "c"), ("assistant", "d"), ("user", "e")],
]

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city, now.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "Its name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7.5}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Ünïcode <time> & \"quotes\"",
        "parameters": {"type": "object", "properties": {}}}},
]

# Mistral's templates insist on call ids of 9 letters and digits.
CALL = {"id": "a1b2c3d4e", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Ur", "days": 2}}}

TOOL_CONVERSATIONS = [
    {"messages": [{"role": "user", "content": "What is the weather in Ur?"}], "tools": TOOLS},
    {"messages": [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "What is the weather in Ur?"},
                  {"role": "assistant", "content": "", "tool_calls": [CALL]},
                  {"role": "tool", "tool_call_id": "a1b2c3d4e", "name": "get_weather",
                   "content": "{\"temperature\": 31.5}"}],
     "tools": TOOLS},
    {"messages": [{"role": "user", "content": "Hi"}], "variables": {"enable_thinking": False}},
]


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # One liberty over transformers: what `map` returns (a generator) is written as the list it
    # yields, as llama.cpp's own templates expect (llama-cpp-deepseek-r1.jinja prints
    # `tools | map(attribute='function') | tojson`); json.dumps alone refuses it.
    def listed(o):
        if isinstance(o, types.GeneratorType):
            return list(o)
        raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys, default=listed)


def environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = CLOCK.strftime
    return env


def render(template, messages: list[tuple[str, str]], gen: bool) -> str:
    return template.render(messages=[{"role": r, "content": c} for r, c in messages],
                           add_generation_prompt=gen, bos_token=BOS, eos_token=EOS)


def case(template, messages: list[tuple[str, str]], gen: bool) -> dict:
    try:
        return {"text": render(template, messages, gen)}
    except Exception as e:  # the template's own refusal, or what it uses and is not there
        first = e
    if len(messages) > 1 and messages[0][0] == "system" and messages[1][0] == "user":
        merged = [("user", f"{messages[0][1]}\n\n{messages[1][1]}")] + messages[2:]
        try:
            return {"text": render(template, merged, gen), "merged": True}
        except Exception:
            pass
    return {"error": f"{type(first).__name__}: {first}"}


def tool_case(template, conv: dict) -> dict:
    """One conversation of TOOL_CONVERSATIONS with the generation prompt."""
    extra = dict(conv.get("variables", {}))
    if "tools" in conv:
        extra["tools"] = conv["tools"]

    def render_messages(messages):
        return template.render(messages=messages, add_generation_prompt=True, bos_token=BOS,
                               eos_token=EOS, **extra)

    messages = conv["messages"]
    try:
        return {"text": render_messages(messages)}
    except Exception as e:
        first = e
    if len(messages) > 1 and messages[0]["role"] == "system" and messages[1]["role"] == "user":
        merged = [{"role": "user",
                   "content": f"{messages[0]['content']}\n\n{messages[1]['content']}"}]
        try:
            return {"text": render_messages(merged + messages[2:]), "merged": True}
        except Exception:
            pass
    return {"error": f"{type(first).__name__}: {first}"}


def main() -> None:
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "chat" / "templates"
    env = environment()
    out = {"bos_token": BOS, "eos_token": EOS, "clock": CLOCK.isoformat(),
           "conversations": [[{"role": r, "content": c} for r, c in conv] for conv in CONVERSATIONS],
           "tool_conversations": TOOL_CONVERSATIONS, "templates": {}}
    for path in sorted(src.glob("*.jinja")):
        try:
            template = env.from_string(path.read_text())
        except Exception as e:
            out["templates"][path.name] = {"syntax_error": f"{type(e).__name__}: {e}"}
            continue
        cases = [dict(conversation=i, add_generation_prompt=gen, **case(template, conv, gen))
                 for i, conv in enumerate(CONVERSATIONS) for gen in (True, False)]
        tool_cases = [dict(conversation=i, **tool_case(template, conv))
                      for i, conv in enumerate(TOOL_CONVERSATIONS)]
        out["templates"][path.name] = {"cases": cases, "tool_cases": tool_cases}
    dest = HERE / "chat" / "expected.json"
    dest.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n")
    n = len(out["templates"])
    errors = sum("error" in c for t in out["templates"].values() for c in t.get("cases", []))
    print(f"wrote {dest}: {n} templates, {errors} refused cases")


if __name__ == "__main__":
    main()
