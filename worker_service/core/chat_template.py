"""A model folder's chat template: the sandboxed jinja environment and the rendering.

The template, its special-token variables and the environment are read and
configured as transformers' `apply_chat_template` reads and configures them,
so a prompt renders here byte for byte as it renders there
(tests/model/test_template_parity.py). Tokenizing the rendered text is
tokenizer.py's job.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path

import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.utils
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from worker_service.core.errors import InvalidRequest, ModelLoadError

# The named special tokens transformers passes to every chat template (its
# SPECIAL_TOKENS_ATTRIBUTES), when the tokenizer config sets them.
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                       "cls_token", "mask_token")


class ChatTemplate:
    """A compiled chat template and the special tokens it renders with."""

    def __init__(self, source: str, special_tokens: dict[str, str]) -> None:
        """Compile `source`; raises jinja's TemplateError when it does not parse."""
        self.source = source
        self.special_tokens = dict(special_tokens)
        self._template = chat_template_environment().from_string(source)

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

    def render(self, messages: Sequence[tuple[str, str]]) -> str:
        """(role, content) turns -> the prompt text, with the generation prompt appended."""
        try:
            # The variables transformers' apply_chat_template passes (no tools, no documents).
            return self._template.render(
                messages=[{"role": role, "content": content} for role, content in messages],
                tools=None, documents=None, add_generation_prompt=True, **self.special_tokens,
            )
        except TemplateError as exc:
            raise InvalidRequest("chat", f"the chat template refused the messages: {exc}") from exc


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
