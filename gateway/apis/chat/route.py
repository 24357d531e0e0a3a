"""POST /v1/chat/completions and POST /v1/completions: the handler.

One request shape for both (`kind`), n choices as n Generate calls, each admitted on its
own (n_choices.py), opened, read and watched through generation.py as every API's are;
stream.py writes the SSE chunks or the one JSON body.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import grpc
import structlog
from fastapi import Request
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse

from gateway import generation
from gateway.apis.chat import n_choices
from gateway.apis.chat import reply as chat_reply
from gateway.apis.chat.stream import PROMPT_PARAM, collect, sse
from gateway.generation import Target
from gateway.reply.errors import from_param_error
from gateway.reply.ortserve_numbers import DECISION_HEADER
from gateway.request.translate import Kind, ParamError, ParsedRequest, parse_request
from gateway.request_metrics import NOT_REPORTED, Reporting
from gateway.upstream import StreamBroken

log = structlog.get_logger("ortserve.gateway")


async def create(kind: Kind, request: Request, target: Target, reasoning_parser: str = "auto",
                 reporting: Reporting = NOT_REPORTED):
    """`reasoning_parser`: the gateway's --reasoning-parser; `reporting`: the per-request
    `metrics` and the GenAI histograms."""
    parsed = replace(_parse(kind, await generation.json_body(request)),
                     reasoning_mode=reasoning_parser)
    clock = reporting.clock(kind, parsed.model)  # the histograms count from the arrival
    body_metrics = reporting.asks(request.headers)
    # NOTE: no local check of `model`: the scheduler resolves it against what its
    # workers serve now (an unknown one is its NOT_FOUND, a 404 here) and places
    # the request only on that model's workers.
    meta = chat_reply.ChatReplyMeta.new(kind, parsed.model)
    requests = [generation.generate_request(target, parsed, i,
                                            meta.id if i == 0 else f"{meta.id}-{i}")
                for i in range(parsed.n)]
    try:
        streams = await n_choices.open_all(partial(generation.open_generate, target), requests)
    except (grpc.RpcError, StreamBroken) as error:
        raise generation.failure(error, PROMPT_PARAM[kind], kind) from None
    admissions = [s.admission for s in streams]
    adm = admissions[0]
    # The model that answers, as resolved; under an adapter its name, as vLLM answers.
    meta = replace(meta, model=requests[0].adapter or adm.model or meta.model)
    streams = [generation.TimedStream(s, clock, meta.model, i) for i, s in enumerate(streams)]
    headers = {**chat_reply.choices_headers(admissions), "x-request-id": meta.id}
    log.info("admitted", request_id=meta.id, lease_id=adm.lease_id, worker_id=adm.worker_id,
             model=meta.model, decision=headers[DECISION_HEADER],
             stream=parsed.stream, choices=len(streams))
    if parsed.stream:
        return EventSourceResponse(sse(meta, parsed, streams, body_metrics),
                                   headers=headers, sep="\n", ping=15)
    body = await generation.unless_disconnected(
        request, collect(meta, parsed, streams, body_metrics),
        partial(n_choices.cancel_all, streams), meta.id)
    return JSONResponse(body, headers=headers)


def _parse(kind: Kind, body: object) -> ParsedRequest:
    try:
        return parse_request(kind, body)
    except ParamError as error:
        raise from_param_error(error) from None
