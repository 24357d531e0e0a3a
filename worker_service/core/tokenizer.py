"""The model folder's tokenizer, and streaming detokenization (stop sequences included).

The chat template's rendering lives in chat_template.py; `Tokenizer` only
tokenizes what it renders.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import tokenizers
from tokenizers.decoders import DecodeStream

from ortserve.output import reasoning
from worker_service.core.chat_template import ChatTemplate, Turn, read_special_tokens
from worker_service.core.errors import InvalidWorkerField, ModelLoadError

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
        self.special_tokens = read_special_tokens(model_dir, self._config)
        self.bos_token = self.special_tokens.get("bos_token", "")
        self.eos_token = self.special_tokens.get("eos_token", "")
        self.chat_template = ChatTemplate.load(model_dir, self._config, self.special_tokens)
        decoder = json.loads(self._tok.to_str()).get("decoder") or {}
        self._byte_level = decoder.get("type") == "ByteLevel"
        self._added_ids = frozenset(self._tok.get_added_tokens_decoder())
        self._token_bytes: dict[int, bytes] = {}

    @property
    def vocab_size(self) -> int:
        """Tokens the tokenizer knows (may be below the model's padded vocabulary)."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def to_json(self) -> str:
        """The tokenizer as tokenizer.json text (the constraint library builds its own from it)."""
        return self._tok.to_str()

    def encode(self, text: str) -> list[int]:
        """Plain text -> token ids (no chat template)."""
        return self._tok.encode(text, add_special_tokens=True).ids

    def render_chat(self, messages: Sequence[Turn], tools: Sequence[Mapping] = (),
                    kwargs: Mapping | None = None, required: Sequence[str] = ()) -> str:
        """Turns ((role, content) or message dicts, chat_template.Turn) and the functions
        offered -> the prompt text, with the generation prompt appended; `kwargs`: further
        template variables (chat_template_kwargs), `required` those the template must read."""
        if self.chat_template is None:
            raise InvalidWorkerField("chat", "this model folder has no chat template "
                                 "(chat_template.jinja or tokenizer_config.json); send plain text")
        return self.chat_template.render(messages, tools, kwargs, required)

    def encode_chat(self, messages: Sequence[Turn], tools: Sequence[Mapping] = (),
                    kwargs: Mapping | None = None, required: Sequence[str] = ()) -> list[int]:
        """Turns, tools and template variables -> token ids of the templated prompt."""
        return self._tok.encode(self.render_chat(messages, tools, kwargs, required),
                                add_special_tokens=False).ids

    def unread_template_kwargs(self, kwargs: Mapping) -> list[str]:
        """The template variables in `kwargs` the chat template does not read (sorted)."""
        if self.chat_template is None:
            return []
        return self.chat_template.check_kwargs(kwargs)

    @property
    def tool_call_format(self) -> str:
        """The format the chat template asks tool calls in (ortserve/output/tool_formats.py)."""
        return self.chat_template.tool_call_format if self.chat_template is not None else "hermes"

    @property
    def reasoning_format(self) -> str:
        """The reasoning family the chat template writes ("think"), "" for none."""
        return self.chat_template.reasoning_format if self.chat_template is not None else ""

    def opens_reasoning(self, prompt_ids: Sequence[int]) -> bool:
        """Whether a chat prompt's end leaves the template's reasoning block open (its last
        few tokens decoded with their special tokens: the tags may be special tokens)."""
        if not self.reasoning_format:
            return False
        tail = self._tok.decode(list(prompt_ids[-16:]), skip_special_tokens=False)
        return reasoning.prompt_opens_reasoning(self.reasoning_format, tail)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """One token's exact UTF-8 bytes (a piece of a multi-byte character included),
        cached per id: the logprobs' `token` and `token_bytes`. Byte-level BPE pieces map
        back through GPT-2's byte table; added tokens are their content; any other
        decoder falls back to decoding the id alone."""
        cached = self._token_bytes.get(token_id)
        if cached is None:
            cached = self._token_bytes[token_id] = self._bytes_of(token_id)
        return cached

    def _bytes_of(self, token_id: int) -> bytes:
        piece = self._tok.id_to_token(token_id)
        if piece is None:
            return b""  # an id of the model's padded vocabulary the tokenizer lacks
        if self._byte_level and token_id not in self._added_ids:
            table = _unicode_to_byte()
            if all(ch in table for ch in piece):
                return bytes(table[ch] for ch in piece)
        if token_id in self._added_ids:
            return piece.encode()
        return self._tok.decode([token_id], skip_special_tokens=False).encode()

    def decode_stream(self, prefix_ids: Sequence[int] = ()) -> Callable[[int], str | None]:
        """A `tokenizers` DecodeStream after `prefix_ids`, as a step function: one id in, the
        newly completed text out (None while a character is incomplete)."""
        stream = DecodeStream(ids=list(prefix_ids), skip_special_tokens=True)
        return lambda token_id: stream.step(self._tok, token_id)


@functools.cache
def _unicode_to_byte() -> dict[str, int]:
    """GPT-2's byte-level table, inverted: the printable character that stands for each
    byte in a ByteLevel vocabulary -> that byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


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
