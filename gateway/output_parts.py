"""One output's text -> reasoning, text and tool-call pieces, as it streams (pure).

The Responses and Messages APIs show the same three things a chat choice does
(thoughts, text, calls), each in its own item or block. This runs the text
through the optional reasoning parser first, then the chat path's tool-call
parser (`tools.ToolCallChoice`, so the format and its rules are one), and
gives each API the same pieces to put in its own shape.

The reasoning hook: a `ReasoningParser` is anything with
`feed(text, final) -> (reasoning_delta, content_delta)`; `final` is True once,
for the output's end (whatever it held back goes out). None: no reasoning
parser, every character is content.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from . import tools


class ReasoningParser(Protocol):
    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        """(reasoning delta, content delta) of the next text delta of the output."""
        ...


# A model name -> its reasoning parser for one output (or None: the model does not think).
ReasoningFor = Callable[[str], ReasoningParser | None]


def no_reasoning(model: str) -> ReasoningParser | None:
    return None


@dataclass(frozen=True)
class Reasoning:
    text: str


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int  # the call's place among the output's calls (0, 1, ...)
    call_id: str
    name: str


@dataclass(frozen=True)
class CallArguments:
    index: int
    fragment: str  # the next piece of the arguments' JSON text


Piece = Reasoning | Text | CallStart | CallArguments


class OutputParser:
    """Pieces of one output. `call_id(index)` names each call (None: the chat path's
    random `call_...` ids); a session names them as it remembers them."""

    def __init__(self, tool_calls: bool, reasoning: ReasoningParser | None = None,
                 call_id: Callable[[int], str] | None = None) -> None:
        self._calls = tools.ToolCallChoice() if tool_calls else None
        self._reasoning = reasoning
        self._call_id = call_id
        self.reasoning_text = ""
        self.called = False  # the output made at least one call

    def push(self, text: str, final: bool = False) -> list[Piece]:
        pieces: list[Piece] = []
        if self._reasoning is not None:
            thought, text = self._reasoning.feed(text, final)
            if thought:
                self.reasoning_text += thought
                pieces.append(Reasoning(thought))
        if self._calls is None:
            if text:
                pieces.append(Text(text))
            return pieces
        for delta in self._calls.deltas(text, final):
            if "content" in delta:
                if delta["content"]:
                    pieces.append(Text(delta["content"]))
                continue
            for call in delta["tool_calls"]:
                function = call["function"]
                if "id" in call:
                    call_id = self._call_id(call["index"]) if self._call_id else call["id"]
                    pieces.append(CallStart(call["index"], call_id, function["name"]))
                    self.called = True
                if function.get("arguments"):
                    pieces.append(CallArguments(call["index"], function["arguments"]))
        return pieces


@dataclass
class Call:
    call_id: str
    name: str
    arguments: str = ""


@dataclass
class Collected:
    """A whole output: its reasoning, its text outside calls, its calls."""

    reasoning: str = ""
    text: str = ""
    calls: list[Call] | None = None

    def add(self, pieces: list[Piece]) -> None:
        for piece in pieces:
            if isinstance(piece, Reasoning):
                self.reasoning += piece.text
            elif isinstance(piece, Text):
                self.text += piece.text
            elif isinstance(piece, CallStart):
                self.calls = (self.calls or []) + [Call(piece.call_id, piece.name)]
            else:
                self.calls[piece.index].arguments += piece.fragment

    def chat_message(self) -> dict:
        """The output as the OpenAI chat assistant message a later turn sends back."""
        message: dict = {"role": "assistant", "content": self.text}
        if self.calls:
            message["content"] = self.text or None
            message["tool_calls"] = [{"id": c.call_id, "type": "function",
                                      "function": {"name": c.name, "arguments": c.arguments}}
                                     for c in self.calls]
        return message
