"""The model folder's tokenizer and chat template, and streaming detokenization."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from pathlib import Path

import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.utils
import tokenizers
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers.decoders import DecodeStream

from worker_service.core.errors import InvalidRequest, ModelLoadError

# The named special tokens transformers passes to every chat template (its
# SPECIAL_TOKENS_ATTRIBUTES), when the tokenizer config sets them.
_REPLACEMENT_CHAR = "\ufffd"
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                       "cls_token", "mask_token")


class Tokenizer:
    """tokenizer.json plus the chat template of a model folder.

    `encode` adds special tokens only where the tokenizer's own post-processor
    says so (as transformers does); the chat template writes its own special
    tokens, so `encode_chat` adds none.
    """

    def __init__(self, model_dir: str | Path) -> None:
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise ModelLoadError(f"{path} not found: the model folder needs a tokenizer.json "
                                 "(the onnxruntime-genai builder writes one)")
        self._tok = tokenizers.Tokenizer.from_file(str(path))
        config_path = model_dir / "tokenizer_config.json"
        self._config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        self.special_tokens = _special_tokens(model_dir, self._config)
        self.bos_token = self.special_tokens.get("bos_token", "")
        self.eos_token = self.special_tokens.get("eos_token", "")
        self._template_source = _chat_template_source(model_dir, self._config)
        self._template = None
        if self._template_source is not None:
            try:
                self._template = chat_template_environment().from_string(self._template_source)
            except TemplateError as exc:
                raise ModelLoadError(f"the chat template of {model_dir} does not parse: {exc}") from exc

    @property
    def vocab_size(self) -> int:
        """Tokens the tokenizer knows (may be below the model's padded vocabulary)."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    def encode(self, text: str) -> list[int]:
        """Plain text -> token ids (no chat template)."""
        return self._tok.encode(text, add_special_tokens=True).ids

    def render_chat(self, messages: Sequence[tuple[str, str]]) -> str:
        """(role, content) turns -> the prompt text, with the generation prompt appended."""
        if self._template is None:
            raise InvalidRequest("chat", "this model folder has no chat template "
                                 "(chat_template.jinja or tokenizer_config.json); send plain text")
        try:
            # The variables transformers' apply_chat_template passes (no tools, no documents).
            return self._template.render(
                messages=[{"role": role, "content": content} for role, content in messages],
                tools=None, documents=None, add_generation_prompt=True, **self.special_tokens,
            )
        except TemplateError as exc:
            raise InvalidRequest("chat", f"the chat template refused the messages: {exc}") from exc

    def encode_chat(self, messages: Sequence[tuple[str, str]]) -> list[int]:
        """(role, content) turns -> token ids of the templated prompt."""
        return self._tok.encode(self.render_chat(messages), add_special_tokens=False).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def decode_stream(self, prefix_ids: Sequence[int] = ()) -> Callable[[int], str | None]:
        """A `tokenizers` DecodeStream after `prefix_ids`, as a step function: one id in, the
        newly completed text out (None while a character is incomplete)."""
        stream = DecodeStream(ids=list(prefix_ids), skip_special_tokens=True)
        return lambda token_id: stream.step(self._tok, token_id)


class IncrementalDetokenizer:
    """Turns a stream of token ids into text deltas that never split a character.

    `tokenizers`' DecodeStream does the work: it holds a token back while the
    text ends in an incomplete UTF-8 sequence (a byte-level BPE piece decodes to
    U+FFFD until the rest of its character arrives), and it decodes each token
    relative to the ones before it, which keeps the spaces that tokenizers drop
    at the start of a text; a few prompt tokens seed it for the first one.
    `flush` hands out what is still held (as U+FFFD), so the concatenation of
    every `push` and the final `flush` equals `tokenizer.decode(all ids pushed)`.
    """

    # Tokens of context kept in front of the output, for the space rule above.
    _CONTEXT_TOKENS = 5

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int] | None = None) -> None:
        self._tok = tokenizer
        # The last ids whose text is out (or the prompt's tail), and those still held back.
        self._context: list[int] = list(prompt_ids or [])[-self._CONTEXT_TOKENS:]
        if tokenizer.decode(self._context).endswith(_REPLACEMENT_CHAR):
            # A prompt ending inside a character: DecodeStream would take it as no prefix
            # at all and hand its text out as output; start without context instead.
            self._context = []
        self._held: list[int] = []
        self._step: Callable[[int], str | None] | None = tokenizer.decode_stream(self._context)

    def push(self, token_id: int) -> str:
        """Add one token; return the newly completed text (possibly "")."""
        text = None
        if self._step is not None:
            try:
                text = self._step(token_id)
            except Exception:
                # NOTE: DecodeStream raises when a decoder rewrites earlier text (its
                # "invalid prefix" error): decode the window by hand until the held
                # text completes, then start a fresh stream after it.
                self._step = None
        if self._step is None:
            text = self._window_text(token_id)
        if text is None:
            self._held.append(token_id)
            return ""
        self._context = [*self._context, *self._held, token_id][-self._CONTEXT_TOKENS:]
        self._held = []
        if self._step is None:
            self._step = self._tok.decode_stream(self._context)
        return text

    def _window_text(self, token_id: int) -> str | None:
        before = self._tok.decode(self._context)
        after = self._tok.decode([*self._context, *self._held, token_id])
        # By length, not by prefix: the decoder may have rewritten the context's text.
        if len(after) <= len(before) or after.endswith(_REPLACEMENT_CHAR):
            return None
        return after[len(before):]

    def flush(self) -> str:
        """Return whatever is still held back (an incomplete character decodes as U+FFFD)."""
        if not self._held:
            return ""
        before = self._tok.decode(self._context)
        after = self._tok.decode(self._context + self._held)
        self._context = [*self._context, *self._held][-self._CONTEXT_TOKENS:]
        self._held = []
        self._step = self._tok.decode_stream(self._context)
        return after[len(before):]


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


def _special_tokens(model_dir: Path, config: dict) -> dict[str, str]:
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


class StopTextStream:
    """A sequence's output text as it streams: detokenized, cut at a stop sequence.

    Text that could be the beginning of a stop sequence is held back until the
    next tokens rule the match in or out, so a stop sequence (and what follows
    it) is never emitted. `.text` is the output so far, without a matched stop
    sequence; `.stop_sequence` is the matched one ("" while none).
    """

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int] | None = None,
                 stop: Sequence[str] = ()) -> None:
        self._detok = IncrementalDetokenizer(tokenizer, prompt_ids)
        self._stops = tuple(stop)
        self.text = ""
        self.stop_sequence = ""
        self._emitted = 0  # chars of .text handed out
        self._floor = 0  # a match must start here or later (see push's stops_armed)
        self._scanned = 0  # chars of .text already searched for whole stop sequences

    def push(self, token_id: int | None, *, final: bool = False, stops_armed: bool = True) -> str:
        """Add a token (None adds none, e.g. for an EOS); return the text that may go out now.

        `final`: the last token; everything left is flushed. `stops_armed=False`
        (before min_new_tokens) lets text through unchecked: stop sequences that
        lie wholly in it do not count.
        """
        if self.stop_sequence:
            return ""  # the stream ended at the match
        piece = self._detok.push(token_id) if token_id is not None else ""
        if final:
            piece += self._detok.flush()
        self.text += piece
        if not self._stops or not stops_armed:
            self._floor = self._scanned = len(self.text)
            return self._emit(len(self.text))
        match = self._find_stop()
        if match is not None:
            start, stop = match
            self.stop_sequence = stop
            self.text = self.text[:start]
            return self._emit(start)
        self._scanned = len(self.text)
        return self._emit(len(self.text) if final else len(self.text) - self._held_back())

    def _emit(self, end: int) -> str:
        end = max(end, self._emitted)
        out = self.text[self._emitted:end]
        self._emitted = end
        return out

    def _find_stop(self) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for stop in self._stops:
            start = self.text.find(stop, max(self._floor, self._scanned - len(stop) + 1))
            if start >= 0 and (best is None or start < best[0]):
                best = (start, stop)
        return best

    def _held_back(self) -> int:
        """Length of the longest tail of .text that begins some stop sequence."""
        longest = 0
        room = len(self.text) - max(self._floor, self._emitted)
        for stop in self._stops:
            for k in range(min(len(stop) - 1, room), longest, -1):
                if self.text.endswith(stop[:k]):
                    longest = k
                    break
        return longest
