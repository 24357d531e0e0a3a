"""A chat session's remembered conversation: whole messages and the session's tools. Pure.

A session turn's prompt is its worker's chat template over the conversation so far
plus the turn's messages, and the worker reuses the K/V of the longest common token
prefix. So what a session remembers must render as it rendered before: every field
the template reads (role, content, an assistant turn's tool_calls, a tool turn's
tool_call_id) and the tools the session was given. The scheduler's registry and the
worker's copy (the restore path after a scheduler restart) both keep these.

No protobuf import: `message_of` / `tool_of` read ChatMessage / Tool (or anything
shaped like them) and `add_message` / `add_tool` fill a repeated field of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ortserve.output import tool_output


@dataclass(frozen=True)
class Call:
    """A function call an assistant turn made (ToolCall)."""

    id: str
    name: str
    arguments_json: str


@dataclass(frozen=True)
class Message:
    """One turn (ChatMessage): tool_calls on assistant turns, tool_call_id on tool turns."""

    role: str
    content: str
    tool_calls: tuple[Call, ...] = ()
    tool_call_id: str = ""


@dataclass(frozen=True)
class ToolSpec:
    """A function the session offers the model (Tool)."""

    name: str
    description: str = ""
    parameters_json: str = ""


def message_of(pb) -> Message:
    return Message(pb.role, pb.content,
                   tuple(Call(c.id, c.name, c.arguments_json) for c in pb.tool_calls),
                   pb.tool_call_id)


def tool_of(pb) -> ToolSpec:
    return ToolSpec(pb.name, pb.description, pb.parameters_json)


def add_message(repeated, message: Message) -> None:
    """Append `message` to a repeated ChatMessage field."""
    pb = repeated.add(role=message.role, content=message.content,
                      tool_call_id=message.tool_call_id)
    for call in message.tool_calls:
        pb.tool_calls.add(id=call.id, name=call.name, arguments_json=call.arguments_json)


def add_tool(repeated, tool: ToolSpec) -> None:
    repeated.add(name=tool.name, description=tool.description,
                 parameters_json=tool.parameters_json)


def call_id(turn: int, index: int) -> str:
    """The id of the `index`-th call (0-based) made in a session's `turn`-th turn (1-based).

    Deterministic, so the scheduler's registry and the worker's copy remember the same
    id without telling each other, and a gRPC client knows what its tool turn answers.
    """
    return f"call_{turn}_{index}"


def reply(text: str, tools_offered: bool, turn: int) -> Message:
    """The assistant turn a session remembers for its reply.

    With tools offered, the output's whole calls become tool_calls (ids: `call_id`),
    as an application hands them back, so the template renders them as the past
    calls they are; a call cut short (length) is no call: the text stays as written.
    """
    if tools_offered:
        content, calls = tool_output.parse(text)
        if calls and all(c.complete for c in calls):
            # The fallback template writes a newline between text and calls: not twice.
            return Message("assistant", content.rstrip("\n"), tuple(
                Call(call_id(turn, i), c.name, c.arguments) for i, c in enumerate(calls)))
    return Message("assistant", text)

