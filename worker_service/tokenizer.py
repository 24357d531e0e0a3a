"""The model folder's tokenizer and chat template, and streaming detokenization."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path

import tokenizers
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from worker_service.errors import InvalidRequest, ModelLoadError

_REPLACEMENT_CHAR = "\ufffd"


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
        self.bos_token = _token_text(self._config.get("bos_token"))
        self.eos_token = _token_text(self._config.get("eos_token"))
        self._template_source = _chat_template_source(model_dir, self._config)
        self._template = None
        if self._template_source is not None:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise_template_exception
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            env.filters["tojson"] = lambda v, indent=None: json.dumps(v, ensure_ascii=False,
                                                                      indent=indent)
            try:
                self._template = env.from_string(self._template_source)
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
            return self._template.render(
                messages=[{"role": role, "content": content} for role, content in messages],
                add_generation_prompt=True, bos_token=self.bos_token, eos_token=self.eos_token,
            )
        except TemplateError as exc:
            raise InvalidRequest("chat", f"the chat template refused the messages: {exc}") from exc

    def encode_chat(self, messages: Sequence[tuple[str, str]]) -> list[int]:
        """(role, content) turns -> token ids of the templated prompt."""
        return self._tok.encode(self.render_chat(messages), add_special_tokens=False).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)


class IncrementalDetokenizer:
    """Turns a stream of token ids into text deltas that never split a character.

    Decodes a short window of recent ids and emits the text beyond what the
    window's older part already produced, only once it no longer ends in an
    incomplete UTF-8 sequence (a byte-level BPE piece decodes to U+FFFD until
    the rest of its character arrives). Decoding relative to the preceding
    tokens also keeps the spaces that tokenizers drop at the start of a text.
    The concatenation of every `push` and the final `flush` equals
    `tokenizer.decode(all ids pushed)` for byte-level BPE tokenizers.
    """

    # Tokens of prompt context kept in front of the output, for the space rule above.
    _CONTEXT_TOKENS = 5

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int] | None = None) -> None:
        self._tok = tokenizer
        self._ids: list[int] = list(prompt_ids or [])[-self._CONTEXT_TOKENS:]
        # [prefix, read): ids whose text was emitted and which form the window's context.
        self._prefix = 0
        self._read = len(self._ids)

    def push(self, token_id: int) -> str:
        """Add one token; return the newly completed text (possibly "")."""
        self._ids.append(token_id)
        prefix_text = self._tok.decode(self._ids[self._prefix:self._read])
        new_text = self._tok.decode(self._ids[self._prefix:])
        if len(new_text) > len(prefix_text) and not new_text.endswith(_REPLACEMENT_CHAR):
            self._prefix, self._read = self._read, len(self._ids)
            return new_text[len(prefix_text):]
        return ""

    def flush(self) -> str:
        """Return whatever is still held back (an incomplete character decodes as U+FFFD)."""
        prefix_text = self._tok.decode(self._ids[self._prefix:self._read])
        new_text = self._tok.decode(self._ids[self._prefix:])
        self._prefix = self._read = len(self._ids)
        return new_text[len(prefix_text):]


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


def _raise_template_exception(message: str) -> None:
    raise TemplateError(message)


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
