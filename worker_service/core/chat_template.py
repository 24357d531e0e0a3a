"""A model folder's chat template: the sandboxed jinja environment and the rendering.

The template, its special-token variables and the environment are read and
configured as transformers' `apply_chat_template` reads and configures them,
so a prompt renders here byte for byte as it renders there
(tests/model/test_template_parity.py). Tokenizing the rendered text is
tokenizer.py's job.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.parser
import jinja2.utils
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ortserve.output import reasoning, tool_calls, tool_formats
from worker_service.core.errors import InvalidWorkerField, ModelLoadError

# The named special tokens transformers passes to every chat template (its
# SPECIAL_TOKENS_ATTRIBUTES), when the tokenizer config sets them.
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                       "cls_token", "mask_token")
# A turn as a template reads it: (role, content), or transformers' message dict
# ({"role", "content", "tool_calls": [{"id", "type", "function": {"name", "arguments"}}],
# "tool_call_id"}, arguments a dict).
Turn = tuple[str, str] | Mapping[str, Any]
# The fallback for a template without tools support (docs/features/tools.md): a system-prompt
# section in the words of Hermes / Qwen templates, whose format ortserve enforces.
FALLBACK_TOOLS_PROMPT = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


class ChatTemplate:
    """A compiled chat template and the special tokens it renders with."""

    def __init__(self, source: str, special_tokens: dict[str, str]) -> None:
        """Compile `source`; raises jinja's TemplateError when it does not parse."""
        self.source = source
        self.special_tokens = dict(special_tokens)
        env = chat_template_environment()
        self._template = env.from_string(source)
        # The variables the template reads: chat_template_kwargs may set only these.
        self.variables = frozenset(jinja2.meta.find_undeclared_variables(env.parse(source)))
        # A template that reads `tools` renders tools, tool calls and tool turns itself.
        self.supports_tools = "tools" in self.variables
        # The format the template asks tool calls in (ortserve/output/tool_formats.py); a template
        # that reads no tools gets the fallback, which asks for Hermes'.
        self.tool_call_format = (tool_formats.format_of_template(source) if self.supports_tools
                                 else "hermes")
        # The reasoning tags the template writes, if any (ortserve/output/reasoning.py).
        self.reasoning_format = reasoning.family_of_template(source)

    @classmethod
    def load(cls, model_dir: Path, tokenizer_config: dict,
             special_tokens: dict[str, str]) -> ChatTemplate | None:
        """The folder's template (chat_template.jinja, else tokenizer_config.json's); None when
        it has none; ModelLoadError when it does not parse."""
        source = _chat_template_source(model_dir, tokenizer_config)
        if source is None:
            return None
        try:
            return cls(source, special_tokens)
        except TemplateError as exc:
            raise ModelLoadError(f"the chat template of {model_dir} does not parse: {exc}") from exc

    def render(self, messages: Sequence[Turn], tools: Sequence[Mapping[str, Any]] = (),
               kwargs: Mapping[str, Any] | None = None, required: Sequence[str] = ()) -> str:
        """Turns (and the functions offered, transformers' {"type": "function", "function":
        {...}} dicts) -> the prompt text, with the generation prompt appended. `kwargs`:
        further variables (chat_template_kwargs); `required`: those of them the template
        must read (see check_kwargs)."""
        kwargs = dict(kwargs or {})
        self.check_kwargs(kwargs, required)
        turns = [_as_dict(m) for m in messages]
        fallback = not self.supports_tools and bool(tools)
        if not self.supports_tools:
            turns = _fallback_turns(turns, tools)
            tools = ()
        try:
            return self._render(turns, tools, kwargs)
        except TemplateError as exc:
            if fallback and turns[0]["role"] == "system" and len(turns) > 1 \
                    and turns[1]["role"] == "user":
                # A template without a system role (Gemma's): the fallback's tools section
                # goes at the head of the first user turn instead.
                merged = {"role": "user",
                          "content": turns[0]["content"] + "\n\n" + turns[1]["content"]}
                try:
                    return self._render([merged, *turns[2:]], tools, kwargs)
                except TemplateError:
                    pass
            raise InvalidWorkerField("chat", f"the chat template refused the messages: {exc}") from exc

    def _render(self, turns: list[dict[str, Any]], tools: Sequence[Mapping[str, Any]],
                kwargs: Mapping[str, Any]) -> str:
        # The variables transformers' apply_chat_template passes (no documents).
        return self._template.render(
            messages=turns, tools=list(tools) or None, documents=None,
            add_generation_prompt=True, **{**self.special_tokens, **kwargs},
        )


    def check_kwargs(self, kwargs: Mapping[str, Any], required: Sequence[str] = ()
                     ) -> list[str]:
        """The chat_template_kwargs names this template does not read, sorted: accepted (as
        vLLM and SGLang accept them: fleets send {"enable_thinking": false} to every model)
        and reported, never silently dropped. Refused: a name the worker sets itself, and
        a `required` name the template does not read (an API parameter carried as a
        variable, honoured or refused)."""
        where = "chat.template_kwargs_json."
        unread = []
        for name in kwargs:
            if name in _SET_BY_WORKER or name in self.special_tokens:
                raise InvalidWorkerField(where + name, f"{name!r} is set by ortserve itself; "
                                     "remove it from the template variables")
            if name not in self.variables:
                if name in required:
                    reads = sorted(self.variables - _SET_BY_WORKER - set(self.special_tokens))
                    raise InvalidWorkerField(where + name, f"this model's chat template does not "
                                         f"read {name!r}, so it would change nothing; it reads "
                                         f"{', '.join(reads) or 'no other variables'}")
                unread.append(name)
        return sorted(unread)


# The variables `render` passes itself (transformers' apply_chat_template's).
_SET_BY_WORKER = frozenset({"messages", "tools", "documents", "add_generation_prompt"})


def _as_dict(turn: Turn) -> dict[str, Any]:
    if isinstance(turn, tuple):
        return {"role": turn[0], "content": turn[1]}
    return dict(turn)


def _fallback_turns(turns: list[dict[str, Any]], tools: Sequence[Mapping[str, Any]]
                    ) -> list[dict[str, Any]]:
    """Tools for a template that knows none: the tools section joins the system turn (a
    new first turn when there is none), past calls become the assistant's text in the
    format the model is asked to write, and a tool turn becomes a user turn with a
    <tool_response> (any template knows the user role)."""
    out = []
    for turn in turns:
        calls = turn.get("tool_calls") or []
        # Only a tool turn of the tools API (it answers a call: tool_call_id) is rewritten; a
        # bare "tool" role renders as the template renders it (transformers' parity).
        if turn["role"] == "tool" and turn.get("tool_call_id"):
            out.append({"role": "user", "content": "<tool_response>\n" + str(turn["content"])
                        + "\n</tool_response>"})
        elif calls:
            text = "\n".join(tool_calls.call_text(
                c["function"]["name"], json.dumps(c["function"]["arguments"],
                                                  separators=(",", ":"))) for c in calls)
            content = turn.get("content") or ""
            out.append({"role": turn["role"], "content": f"{content}\n{text}" if content else text})
        else:
            out.append({"role": turn["role"], "content": turn["content"]})
    if tools:
        section = FALLBACK_TOOLS_PROMPT.format(tools="\n".join(json.dumps(t) for t in tools))
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + section}
        else:
            out.insert(0, {"role": "system", "content": section})
    return out


def _token_text(value: object) -> str:
    # tokenizer_config.json writes special tokens as "text" or {"content": "text", ...}.
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return "" if value is None else str(value)


def _chat_template_source(model_dir: Path, config: dict) -> str | None:
    path = model_dir / "chat_template.jinja"
    if path.is_file():
        return path.read_text()
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: take "default"
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) else None


def read_special_tokens(model_dir: Path, config: dict) -> dict[str, str]:
    """The named special tokens, as transformers reads them (tokenizer_config.json, then
    special_tokens_map.json for those it lacks)."""
    sources = [config]
    map_path = model_dir / "special_tokens_map.json"
    if map_path.is_file():
        sources.append(json.loads(map_path.read_text()))
    tokens: dict[str, str] = {}
    for name in SPECIAL_TOKEN_NAMES:
        value = next((src[name] for src in sources if src.get(name) is not None), None)
        if value is not None:
            tokens[name] = _token_text(value)
    return tokens


# --- the chat-template environment -------------------------------------------
# NOTE: a copy of transformers' (utils/chat_template_utils.py, _compile_jinja_template,
# 5.x): the same extensions (loopcontrols for {% break %} / {% continue %}, the
# {% generation %} tag), filters and globals, so a template renders here byte for
# byte as apply_chat_template renders it (tests/model/test_template_parity.py).


def _raise_template_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: object, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Not jinja's own tojson: that one escapes HTML characters.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _TemplateDict:
    """`dict(...)` in a template, without the attributes of the real type."""

    def __call__(self, *args: object, **kwargs: object) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: object, **kwargs: object) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """`namespace(...)` that refuses underscore-prefixed attributes (CPython internals)."""

    def __init__(*args: object, **kwargs: object) -> None:
        # jinja's own signature trick, so that `namespace(self=...)` still works.
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: object) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError("chat templates cannot store underscore-prefixed attributes "
                                f"on a namespace, but got {name!r}")


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: transformers uses it to mark assistant
    tokens for training masks; rendering, it is the body unchanged."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.CallBlock:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()


def chat_template_environment() -> ImmutableSandboxedEnvironment:
    """A sandboxed jinja environment configured as transformers configures its own."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_template_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env
