"""Output text -> text and tool calls, as it streams (the format of ortserve/output/tool_calls.py).

`ToolCallParser.push(text)` returns events as soon as they are known: a call's
name as soon as its head `<tool_call>\\n{"name": "...", "arguments": ` is
whole, then its arguments in fragments as they arrive (the raw JSON text of
the arguments object), and text outside calls (held back only while it could
be the start of `<tool_call>`). Under Constraint.tool_call the head is exactly
that; a call written otherwise (a model without the constraint) is parsed when
its `</tool_call>` arrives, and a block that is not a call stays text.
`close()` ends the output: a call still open is reported as it is (the output
was cut: its arguments are a prefix).

Pure: no grpc or protobuf; the gateway turns the events into OpenAI's
tool_calls, a gRPC caller may use it on the text it streams.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from ortserve.output.tool_calls import CLOSE_TAG, OPEN_TAG

# The head of a call as the grammar writes it (and as most models do).
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


@dataclass(frozen=True)
class TextEvent:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int  # 0, 1, ... in output order
    name: str


@dataclass(frozen=True)
class CallArguments:
    index: int
    fragment: str  # the next piece of the arguments' JSON text


Event = TextEvent | CallStart | CallArguments


@dataclass
class ParsedCall:
    name: str
    arguments: str = ""
    complete: bool = False


@dataclass
class ToolCallParser:
    calls: list[ParsedCall] = field(default_factory=list)
    _buffer: str = ""
    _state: str = "text"  # text | head | arguments | tail
    _depth: int = 0  # the arguments' nesting depth while in "arguments"
    _in_string: bool = False
    _escaped: bool = False

    def push(self, text: str) -> list[Event]:
        self._buffer += text
        events: list[Event] = []
        while True:
            before = (self._state, len(self._buffer))
            getattr(self, "_" + self._state)(events)
            if (self._state, len(self._buffer)) == before:
                return events

    def close(self) -> list[Event]:
        """The output ended: what is held goes out (a cut call stays incomplete)."""
        events: list[Event] = []
        if self._state == "text" and (self._buffer.strip() or self._buffer and not self.calls):
            events.append(TextEvent(self._buffer))
        elif self._state == "head":
            events.append(TextEvent(OPEN_TAG + self._buffer))
        elif self._state == "arguments" and self._buffer:
            self._arguments_fragment(self._buffer, events)
        self._buffer = ""
        return events

    def _text(self, events: list[Event]) -> None:
        at = self._buffer.find(OPEN_TAG)
        end = at if at >= 0 else len(self._buffer) - _partial_tag_length(self._buffer)
        out = self._buffer[:end]
        # Between and after calls, the newlines the format puts there are not text.
        if out and (out.strip() or not self.calls):
            events.append(TextEvent(out))
            self._buffer = self._buffer[end:]
        if at >= 0:
            self._buffer = self._buffer[self._buffer.find(OPEN_TAG) + len(OPEN_TAG):]
            self._state = "head"

    def _head(self, events: list[Event]) -> None:
        match = _HEAD.match(self._buffer)
        if match and self._buffer[match.end():match.end() + 1] == "{":
            self.calls.append(ParsedCall(json.loads(f'"{match.group(1)}"')))
            events.append(CallStart(len(self.calls) - 1, self.calls[-1].name))
            self._buffer = self._buffer[match.end():]
            self._state, self._depth, self._in_string, self._escaped = "arguments", 0, False, False
            return
        end = self._buffer.find(CLOSE_TAG)
        if end >= 0:  # not the grammar's head: parse the whole block, or keep it as text
            block, self._buffer = self._buffer[:end], self._buffer[end + len(CLOSE_TAG):]
            self._state = "text"
            call = _whole_call(block)
            if call is None:
                events.append(TextEvent(OPEN_TAG + block + CLOSE_TAG))
                return
            self.calls.append(ParsedCall(call[0], call[1], complete=True))
            index = len(self.calls) - 1
            events += [CallStart(index, call[0]), CallArguments(index, call[1])]

    def _arguments(self, events: list[Event]) -> None:
        for i, ch in enumerate(self._buffer):
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif ch == "\\":
                    self._escaped = True
                elif ch == '"':
                    self._in_string = False
            elif ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self._arguments_fragment(self._buffer[:i + 1], events)
                    self.calls[-1].complete = True
                    self._buffer = self._buffer[i + 1:]
                    self._state = "tail"
                    return
        if self._buffer:
            self._arguments_fragment(self._buffer, events)
            self._buffer = ""

    def _arguments_fragment(self, text: str, events: list[Event]) -> None:
        self.calls[-1].arguments += text
        events.append(CallArguments(len(self.calls) - 1, text))

    def _tail(self, events: list[Event]) -> None:
        # The call's closing brace and tag: not part of the arguments nor of the text.
        end = self._buffer.find(CLOSE_TAG)
        if end >= 0:
            self._buffer = self._buffer[end + len(CLOSE_TAG):]
            self._state = "text"


def _partial_tag_length(text: str) -> int:
    """The longest tail of `text` that begins OPEN_TAG (held back: it may become a call)."""
    for k in range(min(len(OPEN_TAG) - 1, len(text)), 0, -1):
        if text.endswith(OPEN_TAG[:k]):
            return k
    return 0


def _whole_call(block: str) -> tuple[str, str] | None:
    """A call block written in another order or spacing: (name, arguments JSON) or None."""
    try:
        value = json.loads(block)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return value["name"], json.dumps(arguments, separators=(",", ":"))


def parse(text: str) -> tuple[str, list[ParsedCall]]:
    """A whole output: (its text outside calls, the calls)."""
    parser = ToolCallParser()
    events = parser.push(text) + parser.close()
    return "".join(e.text for e in events if isinstance(e, TextEvent)), parser.calls
