"""A stored response's input items (GET /v1/responses/{id}/input_items; the openai SDK's
`responses.input_items.list`), pure: the request's `input` as OpenAI lists it, and one page
of it.

The items are the response's own input (a string is one user message), not the earlier
turns a previous_response_id brought in, nor the instructions, as OpenAI lists them. Each
gets an id when it came without one. Only a request already parsed (request.parse) is
stored, so the input read here is well formed.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence

from gateway.request.param_error import ParamError

DEFAULT_LIMIT = 20  # OpenAI's default page
MAX_LIMIT = 100
_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco",
              "reasoning": "rs"}


def items_of(input_value: object) -> list[dict]:
    """The request's `input` as listed items: every item an object with a type and an id,
    a message's string content as one text part."""
    if isinstance(input_value, str):
        input_value = [{"role": "user", "content": input_value}]
    items = []
    for raw in input_value if isinstance(input_value, Sequence) else ():
        item = {k: v for k, v in raw.items() if v is not None} if isinstance(raw, Mapping) else {}
        kind = item.setdefault("type", "message")
        if kind == "message" and isinstance(item.get("content"), str):
            part = "output_text" if item.get("role") == "assistant" else "input_text"
            item["content"] = [{"type": part, "text": item["content"]}]
        item.setdefault("id", f"{_ID_PREFIX.get(kind, 'item')}_{uuid.uuid4().hex}")
        items.append(item)
    return items


def page(items: list[dict], query: Mapping[str, str]) -> dict:
    """OpenAI's list object of `items` for the query (`order` desc by default, `limit`,
    `after` and `before` item ids); a bad value raises ParamError naming it."""
    unknown = sorted(set(query) - {"order", "limit", "after", "before", "include"})
    if unknown:
        raise ParamError(unknown[0], "is not a query parameter of input_items (order, limit, "
                         "after, before, include)", code="unknown_parameter")
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise ParamError("order", f"{order!r} is not asc or desc")
    limit_text = query.get("limit", str(DEFAULT_LIMIT))
    if not limit_text.isdigit() or not 1 <= int(limit_text) <= MAX_LIMIT:
        raise ParamError("limit", f"{limit_text!r} is not an integer from 1 to {MAX_LIMIT}")
    if query.get("include"):
        raise ParamError("include", f"{query['include']!r}: ortserve adds no optional item "
                         "data; leave it out", code="unsupported_parameter")
    ordered = items if order == "asc" else items[::-1]
    ids = [item["id"] for item in ordered]
    for key in ("after", "before"):
        if key in query and query[key] not in ids:
            raise ParamError(key, f"{query[key]!r} is not an input item of this response")
    start = ids.index(query["after"]) + 1 if "after" in query else 0
    end = ids.index(query["before"]) if "before" in query else len(ordered)
    data = ordered[start:end][:int(limit_text)]
    return {"object": "list", "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": start + len(data) < end}
