"""A request's output constraint (structured output) as llguidance grammar text, checked.

Vocabulary-independent, so both edges run the same check before anything is
reserved: the scheduler (through `request_rules.constraint`) and the worker,
whose `worker_service/core/token_mask.py` adds the tokenizer. Pure: no grpc or
protobuf; llguidance is imported on first use, so a process that never sees a
constraint never loads it.

Why llguidance (docs/features/structured-output.md has the figures): it installs alone
(xgrammar needs torch, transformers and triton), builds its tokenizer from the
tokenizer.json the worker already has, computes a mask in ~20-50 us per token on
a 49k vocabulary and validates a grammar without any tokenizer.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

from ortserve.status.errors import InvalidField, clip

# tool_call: a Lark grammar ortserve builds from the chat's tools (ortserve/output/tool_calls.py).
KINDS = ("json_schema", "json_object", "regex", "grammar", "tool_call")
MAX_CONSTRAINT_CHARS = 100_000
# The JSON compiler's defaults (a schema's own "x-guidance" overrides them): no
# free whitespace between tokens, so a small model cannot loop on blank lines
# inside an object; the output is compact JSON (',' and ':').
JSON_DEFAULTS = {"whitespace_flexible": False}
_ANY_OBJECT_SCHEMA = '{"type": "object"}'
_CACHE_ENTRIES = 256


@dataclass(frozen=True)
class ConstraintSpec:
    """What the output must match: `kind` is one of KINDS; `text` its schema, regex or
    grammar ("" for json_object)."""

    kind: str
    text: str = ""

    @property
    def field(self) -> str:
        """The proto path that names it in errors: constraint.json_schema etc."""
        return "constraint." + self.kind


def library_version() -> str:
    import llguidance

    return f"llguidance {llguidance.__version__}"


def check(spec: ConstraintSpec, prefix: str = "") -> str:
    """The spec's llguidance grammar, or InvalidField naming `prefix + spec.field` and the
    library's reason. Cached by text (bounded): a repeated schema is checked once."""
    if spec.kind not in KINDS:
        raise InvalidField(prefix + "constraint", f"kind {spec.kind!r} is not one of "
                           f"{', '.join(KINDS)}")
    if len(spec.text) > MAX_CONSTRAINT_CHARS:
        raise InvalidField(prefix + spec.field, f"is {len(spec.text):,} characters, more than "
                           f"the {MAX_CONSTRAINT_CHARS:,} allowed; send a smaller one",
                           length=len(spec.text), limit=MAX_CONSTRAINT_CHARS)
    grammar, error = _grammar(spec.kind, spec.text)
    if error:
        raise InvalidField(prefix + spec.field, error)
    return grammar


def schema_error(text: str) -> str:
    """Why a JSON Schema (JSON text) cannot compile, with a next step; "" when it can.
    Cached as `check` is (a tool's parameters are checked on every request)."""
    return _grammar("json_schema", text)[1]


@functools.lru_cache(maxsize=_CACHE_ENTRIES)
def _grammar(kind: str, text: str) -> tuple[str, str]:
    """(grammar, "") or ("", why it cannot compile, with a next step)."""
    from llguidance import LLMatcher

    if kind == "json_object":
        grammar = LLMatcher.grammar_from_json_schema(_ANY_OBJECT_SCHEMA, defaults=JSON_DEFAULTS)
    elif kind == "json_schema":
        if not text.strip():
            return "", "is empty: send a JSON Schema as JSON text, e.g. {\"type\": \"object\"}"
        try:
            schema = json.loads(text)
        except ValueError as exc:
            return "", f"is not JSON ({exc}); send the schema as JSON text"
        if not isinstance(schema, dict | bool):
            return "", (f"is a JSON {type(schema).__name__}, not a schema (an object); send "
                        "e.g. {\"type\": \"object\", \"properties\": {...}}")
        grammar = LLMatcher.grammar_from_json_schema(text, defaults=JSON_DEFAULTS)
    elif kind == "regex":
        if not text:
            return "", "is empty: an empty regex matches only the empty output; send a pattern"
        grammar = LLMatcher.grammar_from_regex(text)
    else:  # grammar, or a tool_call grammar built from the tools
        if not text.strip():
            return "", "is empty: send a Lark grammar with a `start` rule"
        grammar = LLMatcher.grammar_from_lark(text)
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        message = messages[0] if messages else "no reason given"
        what = {"json_schema": "schema", "regex": "regex", "grammar": "grammar",
                "tool_call": "tool-call grammar"}.get(kind, kind)
        return "", (f"{library_version()} cannot compile this {what}: "
                    f"{clip(message.strip(), 600)}; fix it and send it again")
    return grammar, ""
