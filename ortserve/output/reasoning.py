"""Reasoning output split from the answer, per template family (pure: no grpc, no HTTP).

A reasoning model writes its thoughts before its answer, between tags its chat
template knows. The one family here, `think` (DeepSeek-R1, Qwen3, QwQ and most
open reasoning models), writes

    <think>
    ...the reasoning...
    </think>

    the answer

and its template either leaves the opening tag to the model (Qwen3) or writes
it at the end of the generation prompt itself (DeepSeek-R1's newer templates,
Qwen3 with enable_thinking): then the output starts inside the reasoning. The
worker says which (`opens_reasoning`, from the rendered prompt's end), so the
parser never guesses from the output.

`ReasoningTokenCounter` is the worker's: it counts the reasoning tokens exactly from
each token's bytes. `ReasoningParser` is fed text deltas as they stream and answers (reasoning,
content) deltas; a possible start of a tag is held back until the next text
decides it, so no tag text ever leaks into either part. `close()` hands out
what is held when the output ends (a cut tag is text, not a tag).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

FAMILIES = ("think",)


@dataclass(frozen=True)
class Tags:
    open: str
    close: str


_TAGS = {"think": Tags("<think>", "</think>")}


def family_of_template(source: str) -> str:
    """The reasoning family a chat template writes, "" for none: a template that names
    the tags is one of a reasoning model."""
    for family, tags in _TAGS.items():
        if tags.open in source and tags.close in source:
            return family
    return ""


def prompt_opens_reasoning(family: str, prompt_tail: str) -> bool:
    """Whether a rendered prompt ending in `prompt_tail` leaves the reasoning open (its
    generation prompt wrote the opening tag), so the output starts inside it."""
    tags = _TAGS.get(family)
    if tags is None:
        return False
    tail = prompt_tail.rstrip()
    return tail.endswith(tags.open) or tail.rfind(tags.open) > tail.rfind(tags.close)


class _State(enum.Enum):
    START = "start"  # nothing but whitespace yet: the opening tag may still come
    REASONING = "reasoning"
    CONTENT = "content"


class ReasoningParser:
    """One output's text deltas -> (reasoning_delta, content_delta), for `family`."""

    def __init__(self, family: str = "think", opens_reasoning: bool = False) -> None:
        if family not in _TAGS:
            raise ValueError(f"reasoning family {family!r} is not one of {', '.join(FAMILIES)}")
        self._tags = _TAGS[family]
        self._state = _State.REASONING if opens_reasoning else _State.START
        self._held = ""  # text that may be the start of a tag
        self._after_close = False  # the blank lines after the closing tag are not content
        self._closed = False  # the closing tag was seen
        self.reasoning = ""  # everything handed out as reasoning so far
        self.content = ""  # everything handed out as content so far

    @property
    def in_reasoning(self) -> bool:
        """True while the output is (or may still be about to be) inside the reasoning."""
        return self._state is _State.REASONING

    @property
    def ended_reasoning(self) -> bool:
        """True once the reasoning block was closed (not for an output that had none)."""
        return self._closed

    def feed(self, text: str) -> tuple[str, str]:
        """The next delta of output text -> (reasoning delta, content delta)."""
        reasoning, content = self._step(self._held + text, final=False)
        return self._record(reasoning, content)

    def close(self) -> tuple[str, str]:
        """The output ended: whatever was held, as the part it was in."""
        reasoning, content = self._step(self._held, final=True)
        return self._record(reasoning, content)

    def _record(self, reasoning: str, content: str) -> tuple[str, str]:
        self.reasoning += reasoning
        self.content += content
        return reasoning, content

    def _step(self, text: str, final: bool) -> tuple[str, str]:
        self._held = ""
        reasoning, content = [], []
        while text:
            if self._state is _State.START:
                stripped = text.lstrip()
                if stripped.startswith(self._tags.open):
                    self._state = _State.REASONING
                    text = stripped[len(self._tags.open):]
                elif not final and self._tags.open.startswith(stripped):
                    self._held = text  # whitespace, or a prefix of the opening tag
                    return "".join(reasoning), "".join(content)
                else:
                    self._state = _State.CONTENT
            elif self._state is _State.REASONING:
                end = text.find(self._tags.close)
                if end >= 0:
                    reasoning.append(text[:end])
                    text = text[end + len(self._tags.close):]
                    self._state, self._after_close, self._closed = _State.CONTENT, True, True
                    continue
                keep = 0 if final else _partial_suffix(text, self._tags.close)
                reasoning.append(text[:len(text) - keep])
                self._held = text[len(text) - keep:]
                return "".join(reasoning), "".join(content)
            else:
                if self._after_close:
                    text = text.lstrip("\n")
                    if not text:
                        break
                    self._after_close = False
                content.append(text)
                break
        return "".join(reasoning), "".join(content)


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of `text` that is a proper start of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ReasoningTokenCounter:
    """One output's reasoning tokens, counted token by token from each token's bytes (the
    worker's count, Finished.usage.reasoning_tokens): every token from the first of the
    opening tag (from the first token when the prompt opened the reasoning) up to and
    including the one that completes the closing tag. Whitespace before an opening tag is
    not reasoning; an output that starts with anything else has none. Exact however the
    tokens are later chunked, unlike a count per chunk of text (reasoning_split.py).
    The tags are ASCII, so matching bytes never splits a character that matters."""

    def __init__(self, family: str = "think", opens_reasoning: bool = False) -> None:
        if family not in _TAGS:
            raise ValueError(f"reasoning family {family!r} is not one of {', '.join(FAMILIES)}")
        self._open = _TAGS[family].open.encode()
        self._close = _TAGS[family].close.encode()
        self._state = _State.REASONING if opens_reasoning else _State.START
        self._seen = b""  # START: the output so far; REASONING: the bytes a tag may span
        self._undecided = 0  # START: tokens since the first non-whitespace byte
        self.tokens = 0

    def push(self, token_bytes: bytes) -> None:
        """The next generated token's bytes (an ending EOS is not pushed)."""
        if self._state is _State.CONTENT:
            return
        if self._state is _State.START:
            self._seen += token_bytes
            stripped = self._seen.lstrip()
            if not stripped:
                return  # whitespace only: the opening tag may still come
            self._undecided += 1
            if stripped.startswith(self._open):
                self._state = _State.REASONING
                self.tokens = self._undecided
                self._seen = stripped[len(self._open):]
                self._closes()
            elif not self._open.startswith(stripped):
                self._state = _State.CONTENT  # no reasoning block: the answer began
            return
        self.tokens += 1
        self._seen += token_bytes
        self._closes()

    def _closes(self) -> None:
        if self._close in self._seen:
            self._state = _State.CONTENT
        else:  # only the end that may start the closing tag matters
            self._seen = self._seen[-(len(self._close) - 1):]
