"""OpenAI's response_format -> GenerateRequest.constraint (pure: no HTTP, no grpc).

The gateway checks the object's shape and names the field it refuses; the
scheduler compiles the schema itself (one rule for every API).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from gateway.request.param_error import ParamError
from ortserve.v1 import types_pb2


def set_response_format(req: types_pb2.GenerateRequest, fmt: object) -> None:
    """OpenAI's response_format -> GenerateRequest.constraint. The scheduler compiles the
    schema (one rule for both APIs): one it cannot compile is a 400 naming
    `constraint.json_schema`, with the library's reason."""
    if fmt is None:
        return
    if not isinstance(fmt, Mapping) or not isinstance(fmt.get("type"), str):
        raise ParamError("response_format", "must be an object with a type: text, json_object "
                         "or json_schema")
    kind = fmt["type"]
    allowed = {"text": {"type"}, "json_object": {"type"}, "json_schema": {"type", "json_schema"}}
    if kind not in allowed:
        raise ParamError("response_format.type", f"{kind!r} is not supported: use text, "
                         "json_object or json_schema", code="unsupported_parameter")
    extra = set(fmt) - allowed[kind]
    if extra:
        raise ParamError(f"response_format.{sorted(extra)[0]}", f"is not part of a {kind!r} "
                         "response_format; remove it", code="unsupported_parameter")
    if kind == "json_object":
        req.constraint.json_object = True
    elif kind == "json_schema":
        req.constraint.json_schema = _json_schema_text(fmt.get("json_schema"))


def _json_schema_text(spec: object) -> str:
    where = "response_format.json_schema"
    if not isinstance(spec, Mapping):
        raise ParamError(where, "must be an object with name and schema")
    extra = set(spec) - {"name", "description", "schema", "strict"}
    if extra:
        raise ParamError(f"{where}.{sorted(extra)[0]}", "is not supported (only name, "
                         "description, schema and strict)", code="unsupported_parameter")
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise ParamError(f"{where}.name", "required: a name for the schema")
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise ParamError(f"{where}.strict", f"{spec['strict']!r} is not true or false")
    # NOTE: strict or not, ortserve always enforces the schema (strict's promise, kept
    # even when not asked): the output matches it unless it ends first (finish_reason
    # "length", and ortserve.finished.constraint says so).
    schema = spec.get("schema")
    if not isinstance(schema, Mapping | bool):
        raise ParamError(f"{where}.schema", "required: the JSON Schema, as a JSON object")
    return json.dumps(schema)
