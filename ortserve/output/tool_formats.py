"""Tool-call formats beyond Hermes: the grammar that enforces each and its parser (pure).

A model answers a call in the format it was trained on, which its chat template
asks for; the worker reads the format from the template (`format_of_template`),
enforces it with the grammar of that format (Constraint.tool_call) and says it in
the Admission, so the gateway parses it back with the parser of that format.

- `hermes` (Hermes, Qwen and ortserve's fallback template): ortserve/output/tool_calls.py,
  ortserve/output/tool_output.py.
- `llama3_json` (Llama 3.1 / 3.2 / 3.3 JSON tool calling): the output is
  `{"name": "f", "parameters": {...}}`, several separated by "; ", possibly after
  `<|python_tag|>` (the grammar writes none; the parser accepts it).
- `mistral` (Mistral v0.3 and its tokenizer's [TOOL_CALLS] token):
  `[TOOL_CALLS] [{"name": "f", "arguments": {...}}, ...]`.

Calls in these formats are reported when the output ends (whole), not as the
arguments stream: an output that starts as a call is held until then, text passes
through as it comes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from ortserve.output import tool_calls
from ortserve.output.tool_output import (
    CallArguments,
    CallStart,
    Event,
    ParsedCall,
    TextEvent,
    ToolCallParser,
)

FORMATS = ("hermes", "llama3_json", "mistral")
PYTHON_TAG = "<|python_tag|>"
MISTRAL_TAG = "[TOOL_CALLS]"


@dataclass(frozen=True)
class _Format:
    arguments_key: str  # the key the arguments object is under
    open: str  # what the grammar writes before the calls
    separator: str  # between two calls
    close: str  # after the calls
    markers: tuple[str, ...]  # how an output that is a call starts (the parser's test)


_FORMATS = {
    "llama3_json": _Format("parameters", "", "; ", "", ("{", PYTHON_TAG)),
    "mistral": _Format("arguments", MISTRAL_TAG + " [", ", ", "]", (MISTRAL_TAG,)),
}


def format_of_template(source: str) -> str:
    """The tool-call format a chat template asks for: Mistral's [TOOL_CALLS], Llama 3.1's
    <|python_tag|> JSON, else Hermes (the <tool_call> convention, and the fallback)."""
    if MISTRAL_TAG in source:
        return "mistral"
    if PYTHON_TAG in source or '"parameters": dictionary of argument name' in source:
        return "llama3_json"
    return "hermes"


def grammar(fmt: str, tools: Sequence[tool_calls.ToolLike], function_name: str = "",
            parallel: bool = False, allow_text: bool = False, answer_schema: str = "") -> str:
    """The llguidance Lark grammar of the allowed output in `fmt` (as tool_calls.grammar:
    one call, or several with `parallel`, of `function_name` or any tool; with
    `allow_text`, text that does not start as a call instead, or with `answer_schema`
    (hermes only: the others' calls are JSON too, so an answer could not be told from
    one) a JSON value of that schema)."""
    if fmt == "hermes":
        return tool_calls.grammar(tools, function_name, parallel, allow_text, answer_schema)
    if answer_schema:
        raise ValueError(f"a structured answer beside tools is not supported in the {fmt} "
                         "tool-call format (its calls are JSON too)")
    spec = _FORMATS[fmt]
    chosen = [t for t in tools if not function_name or t.name == function_name]
    lines = [f"fn_{i}: {json.dumps(_head(t.name, spec))} %json "
             f"{tool_calls.schema_json(t)} \"}}\"" for i, t in enumerate(chosen)]
    lines.append("fn: " + " | ".join(f"fn_{i}" for i in range(len(chosen))))
    calls = "fn" + (f" ({json.dumps(spec.separator)} fn)*" if parallel else "")
    body = " ".join(part for part in (json.dumps(spec.open) if spec.open else "", calls,
                                      json.dumps(spec.close) if spec.close else "") if part)
    if allow_text:
        starts = "|".join(re.escape(m).replace("/", "\\/") for m in spec.markers)
        lines += [f"start: TEXT | {body}",
                  f"TEXT: /(?s:.+)/ & ~/(?s:[ \\t\\r\\n]*({starts}).*)/"]
    else:
        lines.append(f"start: {body}")
    return "\n".join(lines) + "\n"


def _head(name: str, spec: _Format) -> str:
    return f'{{"name": {json.dumps(name)}, "{spec.arguments_key}": '


def parser(fmt: str) -> ToolCallParser | JsonCallParser:
    """A streaming parser of `fmt` (push(text) -> events, close() -> events, .calls)."""
    if fmt in ("", "hermes"):
        return ToolCallParser()
    if fmt not in _FORMATS:
        raise ValueError(f"tool-call format {fmt!r} is not one of {', '.join(FORMATS)}")
    return JsonCallParser(fmt)


@dataclass
class JsonCallParser:
    """Llama 3.1 JSON and Mistral calls: an output that starts as a call is held and parsed
    when it ends; any other output is text, passed on as it comes."""

    fmt: str
    calls: list[ParsedCall] = field(default_factory=list)
    _held: str = ""
    _mode: str = "start"  # start | text | calls

    def push(self, text: str) -> list[Event]:
        if self._mode == "text":
            return [TextEvent(text)] if text else []
        self._held += text
        if self._mode == "calls":
            return []
        lead = self._held.lstrip()
        markers = _FORMATS[self.fmt].markers
        if any(lead.startswith(m) for m in markers):
            self._mode = "calls"
            return []
        if not lead or any(m.startswith(lead) for m in markers):
            return []  # blank, or a marker still arriving
        self._mode, held, self._held = "text", self._held, ""
        return [TextEvent(held)]

    def close(self) -> list[Event]:
        held, self._held = self._held, ""
        if self._mode != "calls":
            return [TextEvent(held)] if held else []
        found = _parse_calls(self.fmt, held)
        if found is None:
            return [TextEvent(held)]  # not calls after all: the text as written
        events: list[Event] = []
        for i, call in enumerate(found):
            self.calls.append(call)
            events += [CallStart(i, call.name), CallArguments(i, call.arguments)]
        return events


def _parse_calls(fmt: str, text: str) -> list[ParsedCall] | None:
    """The calls in a whole output; a cut last call as incomplete (its arguments a
    prefix); None when the output is not calls."""
    spec = _FORMATS[fmt]
    text = text.strip()
    if fmt == "mistral":
        text = text.removeprefix(MISTRAL_TAG).strip()
    else:
        text = text.removeprefix(PYTHON_TAG).strip()
    decoder = json.JSONDecoder()
    try:
        value, end = decoder.raw_decode(text)
        items, rest = (value if isinstance(value, list) else [value]), text[end:]
        if fmt == "llama3_json":
            while rest.strip():  # "; {...}" after the first
                rest = rest.lstrip().removeprefix(";").lstrip()
                more, end = decoder.raw_decode(rest)
                items.append(more)
                rest = rest[end:]
    except ValueError:
        return _cut_call(spec, text)
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        arguments = item.get(spec.arguments_key, item.get("arguments", {}))
        calls.append(ParsedCall(item["name"], json.dumps(arguments, separators=(",", ":")),
                                complete=True))
    return calls or None


_CUT = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:parameters|arguments)"\s*:\s*')


def _cut_call(spec: _Format, text: str) -> list[ParsedCall] | None:
    """An output cut inside its first call (max_tokens): the name and the arguments' prefix."""
    match = _CUT.search(text)
    if match is None:
        return None
    return [ParsedCall(json.loads(f'"{match.group(1)}"'), text[match.end():], complete=False)]
