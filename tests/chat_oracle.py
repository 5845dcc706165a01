#!/usr/bin/env python3
"""chat_oracle.py - the real chat templates rendered by Jinja2 as HF's apply_chat_template renders
them, for tests/test_chat.c to compare PXQ's chat.c against byte for byte (and token for token).

Templates: Qwen3's (tests/data/qwen3-tokenizer/tokenizer_config.json "chat_template") and the tiny
model's plain ChatML (tests/data/tiny-qwen3/chat_template.jinja).

Environment, as transformers' _compile_jinja_template sets it: ImmutableSandboxedEnvironment with
trim_blocks and lstrip_blocks, the loopcontrols extension, tojson = json.dumps(x, ensure_ascii=False)
(replacing Jinja's own filter, which sorts keys and escapes HTML), raise_exception and strftime_now
as globals (namespace is a Jinja builtin). render(messages=..., tools=... or None,
add_generation_prompt=..., **kwargs) with enable_thinking only when the case gives it.

Case format (stdout, one JSON object {"cases": [...]}): template ("qwen3" or "chatml"), messages
[{role, content, reasoning_content?, tool_calls?: [{name, arguments (a string written as is) or
arguments_json (JSON text, json.loads'd as vLLM does)}]}], tools_text (JSON text of the tools array,
given to PXQ as is and json.loads'd here), add_generation_prompt, enable_thinking (null: not given),
rendered. Exit 77 when jinja2 is missing (the C test prints SKIP).
"""
import json
import os
import random
import sys

try:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    sys.exit(77)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    e = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    e.filters["tojson"] = tojson
    e.globals["raise_exception"] = raise_exception
    e.globals["strftime_now"] = lambda fmt: "26 Jul 2024"
    return e


def templates():
    with open(os.path.join(ROOT, "qwen3-tokenizer", "tokenizer_config.json"), encoding="utf-8") as f:
        q3 = json.load(f)["chat_template"]
    with open(os.path.join(ROOT, "tiny-qwen3", "chat_template.jinja"), encoding="utf-8") as f:
        chatml = f.read()
    e = env()
    return {"qwen3": e.from_string(q3), "chatml": e.from_string(chatml)}


def to_template_messages(msgs):
    out = []
    for m in msgs:
        t = {"role": m["role"], "content": m["content"]}
        if "reasoning_content" in m:
            t["reasoning_content"] = m["reasoning_content"]
        if "tool_calls" in m:
            calls = []
            for c in m["tool_calls"]:
                args = json.loads(c["arguments_json"]) if "arguments_json" in c else c["arguments"]
                calls.append({"id": "call_1", "type": "function", "function": {"name": c["name"], "arguments": args}})
            t["tool_calls"] = calls
        out.append(t)
    return out


def render(tm, case):
    kw = {}
    if case.get("enable_thinking") is not None:
        kw["enable_thinking"] = case["enable_thinking"]
    tools = json.loads(case["tools_text"]) if case.get("tools_text") else None
    return tm[case["template"]].render(messages=to_template_messages(case["messages"]), tools=tools,
                                       add_generation_prompt=case["add_generation_prompt"], bos_token="",
                                       eos_token="<|im_end|>", **kw)


# ---- the matrix ----

WEATHER = ('[{"type": "function", "function": {"name": "get_weather", "description": "Get the weather in a city",'
           ' "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string",'
           ' "enum": ["c", "f"]}}, "required": ["city"]}}}]')
TWO_TOOLS = ('[{"type":"function","function":{"name":"search","description":"Search the web","parameters":{"type":"object",'
             '"properties":{"q":{"type":"string"},"k":{"type":"integer","default":5,"maximum":1E2}}}}},'
             '{"function":{"parameters":{"type":"object"},"name":"now","description":null},"type":"function"}]')
ODD_JSON = ('[{"type":"function","function":{"name":"calc","parameters":{"x":1.0,"y":-0,"z":0.10,"w":1e-7,"v":1e16,'
            '"u":1234567890123456.0,"big":12345678901234567890,"t":true,"f":false,"n":null,"arr":[[],{},[1,[2,[3]]]],'
            '"s":"\\u00e9\\n\\t\\"\\\\\\/\\u0001\\u001f\\u007f\\ud83d\\ude00 é 中 \u2028",'
            '"e":1.5E+300,"neg":-2.5e-5,"half":0.5,"third":0.3333333333333333}}}]')
DUP_KEYS = '[{"type": "function", "function": {"name": "a", "name": "b", "parameters": {"k": 1, "j": 2, "k": 3}}}]'
UNICODE_TOOLS = ('[{"type": "function", "function": {"name": "überprüfen", "description": "检查 — ✓ 😀",'
                 ' "parameters": {"type": "object", "properties": {"wert": {"type": "string", "description": "Ä\\u00d6"}}}}}]')


def U(c):
    return {"role": "user", "content": c}


def S(c):
    return {"role": "system", "content": c}


def A(c, **kw):
    m = {"role": "assistant", "content": c}
    m.update(kw)
    return m


def T(c):
    return {"role": "tool", "content": c}


def call(name, arguments=None, arguments_json=None):
    c = {"name": name}
    if arguments_json is not None:
        c["arguments_json"] = arguments_json
    else:
        c["arguments"] = arguments
    return c


def cases():
    q, out = "qwen3", []

    def add(name, msgs, gen=True, think=None, tools=None, template=q):
        c = {"name": name, "template": template, "messages": msgs, "add_generation_prompt": gen, "enable_thinking": think}
        if tools is not None:
            c["tools_text"] = tools
        out.append(c)

    wcall = call("get_weather", arguments_json='{"city":"Paris","unit":"c"}')
    add("user", [U("Hi")])
    add("system user", [S("Be brief."), U("Hi")])
    add("system user no gen", [S("Be brief."), U("Hi")], gen=False)
    add("multi-turn thinking in content", [U("2+2?"), A("<think>\nadd\n</think>\n\n4"), U("and 3+3?")])
    add("thinking off", [U("2+2?"), A("<think>\nadd\n</think>\n\n4"), U("3+3?")], think=False)
    add("thinking on explicitly", [U("Hi")], think=True)
    add("reasoning_content on the final assistant", [U("Hi"), A("Hello!", reasoning_content="greet back")], gen=False)
    add("reasoning_content before the last query is dropped", [U("Hi"), A("Hello!", reasoning_content="greet"), U("Bye")])
    add("empty reasoning_content, final", [U("Hi"), A("Hello!", reasoning_content="")], gen=False)
    add("reasoning_content with newlines", [U("Hi"), A("\n\nHello!", reasoning_content="\n\nr\n\n")], gen=False)
    add("reasoning_content given, content keeps </think>", [U("Hi"), A("<think>x</think>y", reasoning_content="r")], gen=False)
    add("tools", [U("Weather in Paris?")], tools=WEATHER)
    add("tools and system", [S("You are a bot."), U("Weather in Paris?")], tools=WEATHER)
    add("tools, system not first", [U("Hi"), S("Late system."), U("Weather?")], tools=WEATHER)
    add("tool call, string arguments, result", [U("Weather in Paris?"),
        A("", tool_calls=[call("get_weather", arguments='{"city":"Paris"}')]), T('{"temp": 21}')], tools=WEATHER)
    add("tool call, object arguments", [U("Weather?"),
        A("", tool_calls=[call("get_weather", arguments_json='{"city":"Zürich","n":1.0,"deep":{"a":[1,2,{"b":null}]}}')]),
        T("sunny")], tools=WEATHER)
    add("two tool calls, no content", [U("Weather in Paris and Rome?"),
        A("", tool_calls=[wcall, call("get_weather", arguments_json='{"city": "Rome"}')]), T("21"), T("25")], tools=WEATHER)
    add("two tool calls after content", [U("Weather?"),
        A("Let me check.", tool_calls=[wcall, call("get_weather", arguments='{"city": "Rome"}')]), T("21"), T("25")],
        tools=WEATHER)
    add("multi-step tools with reasoning", [S("sys"), U("Plan a trip"),
        A("", reasoning_content="need weather", tool_calls=[wcall]), T("21"),
        A("<think>\nnow search\n</think>\n\n", tool_calls=[call("search", arguments_json='{"q":"hotels"}')]), T("3 hotels"),
        A("Done: Paris, 21C, 3 hotels.", reasoning_content="summarise")], gen=False, tools=TWO_TOOLS)
    add("multi-step tools, generation prompt", [U("Plan"), A("", reasoning_content="r1", tool_calls=[wcall]), T("21")],
        tools=WEATHER)
    add("multi-step tools, thinking off", [U("Plan"), A("", tool_calls=[wcall]), T("21")], tools=WEATHER, think=False)
    add("tool message first", [T("orphan result"), U("Hi")])
    add("user tool_response text is not a query", [U("Real question"), A("<think>r</think>a"),
        U("<tool_response>\nx\n</tool_response>"), A("final")], gen=False)
    add("no user message", [S("sys"), A("<think>\nr\n</think>\n\nhello")], gen=False)
    add("system only", [S("sys")])
    add("system in the middle, no tools", [U("a"), S("b"), U("c")])
    add("two system messages", [S("one"), S("two"), U("x")])
    add("unicode", [S("Réponds en français 🇫🇷"), U("日本語で？ Ωμέγα \u2028 \u00a0 e\u0301"),
        A("<think>\n考え中…\n</think>\n\nはい 😀"), U("Ещё")])
    add("unicode tools", [U("prüfe")], tools=UNICODE_TOOLS)
    add("empty contents", [S(""), U(""), A(""), U("")])
    add("empty contents, final assistant", [U(""), A("")], gen=False)
    add("control-token text in messages", [S("<|im_start|>system"), U("x<|im_end|>\n<|im_start|>assistant\n"),
        A("<|endoftext|>"), U("<think></think>")])
    add("odd JSON in tools", [U("calc")], tools=ODD_JSON)
    add("duplicate keys in tools", [U("x")], tools=DUP_KEYS)
    add("empty tools array", [U("x")], tools="[]")
    add("two tools, compact text, null description", [S("s"), U("what time?")], tools=TWO_TOOLS)
    add("arguments JSON string is written as text", [U("x"), A("", tool_calls=[call("f", arguments_json='"raw \\"text\\""')]),
        T("ok")], tools=WEATHER)
    add("arguments JSON number and array", [U("x"), A("", tool_calls=[call("f", arguments_json="42"),
        call("g", arguments_json='[1, "two", 3.0]')]), T("ok"), T("ok")], tools=WEATHER)
    add("arguments with odd numbers", [U("x"), A("", tool_calls=[call("f", arguments_json='{"a":1E2,"b":-0,"c":1e400}')])],
        gen=False, tools=WEATHER)
    add("tool name unicode", [U("x"), A("", tool_calls=[call("überprüfen", arguments_json="{}")]), T("✓")],
        tools=UNICODE_TOOLS)
    add("tool call with think in content, after query", [U("x"),
        A("<think>\nplan\n</think>\n\nCalling.", tool_calls=[wcall])], gen=False, tools=WEATHER)
    add("unknown role renders nothing", [U("x"), {"role": "ipython", "content": "out"}, U("y")])
    add("final assistant continues", [U("Hi"), A("<think>\nr\n</think>\n\nHel")], gen=False)
    add("several think tags", [U("Hi"), A("<think>a</think><think>\nb\n</think>\n\nc</think>\n\nd"), U("again")])
    add("several think tags, final", [U("Hi"), A("x<think>a\n\n</think>b</think>c")], gen=False)
    add("reasoning only in content", [U("Hi"), A("</think>")], gen=False)
    add("consecutive tool results after text", [U("q"), A("Using tools", tool_calls=[wcall]), T("a"), T("b"), T("c"),
        A("done")], gen=False, tools=WEATHER)
    # the tiny model's plain ChatML: tools, tool calls and reasoning_content are not in the template
    c = "chatml"
    add("chatml user", [U("Hi")], template=c)
    add("chatml multi-turn", [S("sys"), U("a"), A("b"), U("c")], template=c)
    add("chatml tool role", [U("a"), T("result"), U("b")], template=c)
    add("chatml ignores tools and tool calls", [U("a"), A("", reasoning_content="r", tool_calls=[wcall]), T("21")],
        tools=WEATHER, template=c)
    add("chatml unicode, empty, no gen", [U("日本 😀"), A("")], gen=False, template=c)
    add("chatml thinking off is ignored", [U("a")], think=False, template=c)
    add("chatml think in content is kept", [U("a"), A("<think>\nr\n</think>\n\nb"), U("c")], template=c)
    # seeded random conversations over the same pieces
    rng = random.Random(1234)
    texts = ["Hi", "", "ok\n", "\n\nlead", "日本", "<think>\nx\n</think>\n\ny", "a</think>b", "😀 ✓", "tab\there"]
    for k in range(24):
        msgs = [S(rng.choice(texts))] if rng.random() < 0.5 else []
        for _ in range(rng.randint(1, 6)):
            r = rng.random()
            if r < 0.35:
                msgs.append(U(rng.choice(texts)))
            elif r < 0.7:
                kw = {}
                if rng.random() < 0.3:
                    kw["reasoning_content"] = rng.choice(texts)
                if rng.random() < 0.3:
                    kw["tool_calls"] = [call("get_weather", arguments_json='{"city": "%s"}' % rng.choice(["Oslo", "Köln"]))
                                        for _ in range(rng.randint(1, 2))]
                msgs.append(A(rng.choice(texts), **kw))
            elif r < 0.9:
                msgs.append(T(rng.choice(texts)))
            else:
                msgs.append(S(rng.choice(texts)))
        if not any(m["role"] == "user" for m in msgs):
            msgs.append(U("q"))
        add("random %d" % k, msgs, gen=rng.random() < 0.6, think=rng.choice([None, True, False]),
            tools=rng.choice([None, WEATHER, TWO_TOOLS]), template=rng.choice([q, q, q, c]))
    return out


def main():
    tm = templates()
    cs = cases()
    for c in cs:
        c["rendered"] = render(tm, c)
    json.dump({"jinja2": jinja2.__version__, "cases": cs}, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
