"""transformers' chat template environment on Debian's python3-jinja2, for Kiln's chat tests: the
configuration of transformers' `_compile_jinja_template` (src/transformers/utils/chat_template_utils.py):
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True), the loopcontrols extension, a
`generation` tag that records the ranges it renders (AssistantTracker), transformers' own `tojson`
(json.dumps, ensure_ascii=False), `raise_exception` and `strftime_now`; and the special-token
variables apply_chat_template passes (tokenizer_config.json's bos_token, eos_token, ... as strings).
"""
import datetime
import json

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment


class AssistantTracker(Extension):
    """transformers' {% generation %} tag: records the character ranges it renders."""
    tags = {"generation"}

    def __init__(self, environment):
        super().__init__(environment)
        self.blocks = None
        self.spans = None

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    def _generation_support(self, caller):
        rv = caller()
        if self.blocks is not None:
            start = len("".join(self.blocks))
            self.spans.append((start, start + len(rv)))
        return rv


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


def special_tokens(config):
    out = {}
    for name in ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]:
        v = config.get(name)
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str):
            out[name] = v
    if isinstance(config.get("additional_special_tokens"), list):
        out["additional_special_tokens"] = [v["content"] if isinstance(v, dict) else v
                                            for v in config["additional_special_tokens"]]
    return out


def render(source, specials, messages, tools=None, add_generation_prompt=False):
    """apply_chat_template(messages, tools=tools, add_generation_prompt=..., tokenize=False)."""
    return make_env().from_string(source).render(messages=messages, tools=tools, documents=None,
                                                 add_generation_prompt=add_generation_prompt, **specials)
