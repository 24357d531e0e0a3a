"""One output's text -> reasoning, text and tool-call pieces, as it streams (pure).

The Responses and Messages APIs show the same three things a chat choice does
(thoughts, text, calls), each in its own item or block. This runs the text
through the optional reasoning parser first, then the chat path's tool-call
parser (`tools.ToolCallChoice`, so the format and its rules are one), and
gives each API the same pieces to put in its own shape.

Which parsers an output goes through is the stream's Admission's to say, as
for a chat choice: the reasoning family and whether the prompt opened the
block (`ChoiceReasoning.for_choice`, under the gateway's --reasoning-parser)
and the tool-call format the model's template asks for. The reasoning tokens
are counted by chat's rule (gateway/reply/reasoning_split.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gateway.reply.reasoning_split import ChoiceReasoning
from gateway.request import tools
from gateway.request.translate import ParsedRequest
from ortserve.v1 import types_pb2


@dataclass(frozen=True)
class Reasoning:
    text: str


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class CallStartPiece:
    index: int  # the call's place among the output's calls (0, 1, ...)
    call_id: str
    name: str


@dataclass(frozen=True)
class CallArgumentsPiece:
    index: int
    fragment: str  # the next piece of the arguments' JSON text


Piece = Reasoning | Text | CallStartPiece | CallArgumentsPiece


class OutputParser:
    """Pieces of one output. `call_id(index)` names each call (None: the chat path's
    random `call_...` ids); a session names them as it remembers them."""

    def __init__(self, tool_calls: bool, reasoning: ChoiceReasoning | None = None,
                 call_id: Callable[[int], str] | None = None,
                 tool_format: str = "hermes") -> None:
        self._calls = tools.ToolCallChoice(tool_format) if tool_calls else None
        self._reasoning = reasoning
        self._call_id = call_id
        self.reasoning_text = ""
        self.called = False  # the output made at least one call

    @classmethod
    def for_stream(cls, parsed: ParsedRequest, adm: types_pb2.Admission,
                   call_id: Callable[[int], str] | None = None) -> OutputParser:
        """The parser of an admitted stream's output: the parsers its Admission names."""
        return cls(parsed.tool_calls,
                   ChoiceReasoning.for_choice(parsed.kind, adm, parsed.reasoning_mode),
                   call_id, adm.tool_call_format or "hermes")

    @property
    def splits_reasoning(self) -> bool:
        return self._reasoning is not None

    @property
    def reasoning_tokens(self) -> int:
        """The output's tokens counted as reasoning so far (chat's rule)."""
        return self._reasoning.tokens if self._reasoning is not None else 0

    def finished(self, usage: types_pb2.Usage) -> None:
        """The output's Finished usage (the worker's reasoning count, where it sent one)."""
        if self._reasoning is not None:
            self._reasoning.finished(usage)

    def push(self, text: str, n_tokens: int = 0, final: bool = False) -> list[Piece]:
        """The next text of the output (`n_tokens` tokens) -> its pieces; `final` once, at
        the output's end, hands out whatever the parsers held back."""
        pieces: list[Piece] = []
        if self._reasoning is not None:
            thought, text = (self._reasoning.close() if final
                             else self._reasoning.feed(text, n_tokens))
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
                    pieces.append(CallStartPiece(call["index"], call_id, function["name"]))
                    self.called = True
                if function.get("arguments"):
                    pieces.append(CallArgumentsPiece(call["index"], function["arguments"]))
        return pieces


@dataclass
class CollectedCall:
    call_id: str
    name: str
    arguments: str = ""


@dataclass
class Collected:
    """A whole output: its reasoning, its text outside calls, its calls."""

    reasoning: str = ""
    text: str = ""
    calls: list[CollectedCall] | None = None

    def add(self, pieces: list[Piece]) -> None:
        for piece in pieces:
            if isinstance(piece, Reasoning):
                self.reasoning += piece.text
            elif isinstance(piece, Text):
                self.text += piece.text
            elif isinstance(piece, CallStartPiece):
                self.calls = (self.calls or []) + [CollectedCall(piece.call_id, piece.name)]
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
