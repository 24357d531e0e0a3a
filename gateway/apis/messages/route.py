"""POST /v1/messages (Anthropic's Messages API): the handler.

Runs as a chat request does (a plain Generate: the Messages API is
stateless), and answers in Anthropic's shapes: the message, its streamed
events (each with its `event:` line, as Anthropic's SDKs read them) and its
errors ({"type": "error", "error": {"type", "message"}}, the message naming
the field), before the stream and in it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace

import grpc
import structlog
from fastapi import Request
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse

from gateway import generation
from gateway.apis.messages import reply as ar
from gateway.apis.messages import request as am
from gateway.generation import Reader, Stream, Target
from gateway.reply.errors import HttpError, from_grpc, from_param_error
from gateway.reply.ortserve_numbers import admission_headers
from gateway.reply.output_parts import OutputParser
from gateway.request.param_error import ParamError
from gateway.request.translate import ParsedRequest
from gateway.request_metrics import NOT_REPORTED, Reporting, body_metrics
from gateway.upstream import StreamBroken

log = structlog.get_logger("ortserve.gateway")


async def create(request: Request, target: Target, reasoning_mode: str = "auto",
                 reporting: Reporting = NOT_REPORTED):
    """`reasoning_mode`: the gateway's --reasoning-parser (thinking blocks split as chat's
    reasoning_content is, when the Admission names the model's reasoning format);
    `reporting`: the per-request `metrics` and the GenAI histograms, as chat's."""
    try:
        return await _create(request, target, reasoning_mode, reporting)
    except HttpError as error:
        return error_response(error)


async def count_tokens(request: Request, target: Target):
    """POST /v1/messages/count_tokens: the prompt's tokens as the model's worker counts them
    (Scheduler.Tokenize: its chat template, tools included); nothing is reserved."""
    try:
        try:
            parsed, _, _ = am.parse(await generation.json_body(request), counting=True)
        except ParamError as error:
            raise from_param_error(error) from None
        try:
            answer = await target.upstream.tokenize(parsed.generate, target.metadata)
        except grpc.RpcError as error:
            raise am.renamed(from_grpc(error, "messages", "messages")) from None
    except HttpError as error:
        return error_response(error)
    return {"input_tokens": len(answer.token_ids)}


def error_response(error: HttpError) -> JSONResponse:
    return JSONResponse(am.error_body(error), status_code=error.status, headers=error.headers())


async def _create(request: Request, target: Target, reasoning_mode: str, reporting: Reporting):
    try:
        parsed, stream, thinking = am.parse(await generation.json_body(request))
    except ParamError as error:
        raise from_param_error(error) from None
    clock = reporting.clock("messages", parsed.model)  # the histograms count from the arrival
    with_metrics = reporting.asks(request.headers)
    parsed = replace(parsed, reasoning_mode=reasoning_mode)
    if thinking == "enabled" and reasoning_mode == "none":
        raise _thinking_refused("the gateway runs --reasoning-parser none, so thinking would "
                                "come as text")
    message_id = ar.new_id()
    try:
        asked = generation.generate_request(target, parsed, 0, message_id)
        opened = await generation.open_generate(target, asked)
    except (grpc.RpcError, StreamBroken) as error:
        raise am.renamed(generation.failure(error, "messages", "messages")) from None
    adm = opened.admission
    model = asked.adapter or adm.model or parsed.model  # an adapter answers by its name
    parser = OutputParser.for_stream(parsed, adm, lambda index: ar.new_id("toolu"))
    if thinking == "enabled" and not parser.splits_reasoning:
        opened.cancel()  # nothing was generated for the client: the lease is freed now
        # NOTE: not "or send disabled": such a template reads no enable_thinking switch as a
        # rule, and `disabled` is then refused too (a remedy that is another 400).
        raise _thinking_refused(f"model {model!r}'s chat template writes no reasoning, so it "
                                "does not think", "leave `thinking` out: its answers have no "
                                "thinking blocks either way")
    opened = generation.TimedStream(opened, clock, model)
    headers = {**admission_headers(adm), "x-request-id": message_id}
    log.info("admitted", request_id=message_id, lease_id=adm.lease_id, worker_id=adm.worker_id,
             model=model, api="messages", stream=stream)
    if stream:
        return EventSourceResponse(_events(message_id, model, parsed, opened, Reader(parser),
                                           with_metrics),
                                   headers=headers, sep="\n", ping=15)
    try:
        pieces, fin = await generation.unless_disconnected(
            request, generation.read_all(opened, Reader(parser)), opened.cancel, message_id)
    except (grpc.RpcError, StreamBroken) as error:
        raise am.renamed(generation.failure(error, "messages", "messages")) from None
    blocks = ar.ContentBlocks()
    blocks.add(pieces)
    blocks.close()
    body = ar.message_object(message_id, model, blocks.blocks, ar.stop_reason(fin, parser.called),
                             ar.usage_dict(fin.usage),
                             ar.ortserve_extension(adm, fin, parsed.resolved))
    if with_metrics:  # vLLM's per-request metrics, as chat's body carries them
        body["metrics"] = body_metrics(adm, fin)
    return JSONResponse(body, headers=headers)


async def _events(message_id: str, model: str, parsed: ParsedRequest, opened: Stream,
                  reader: Reader, with_metrics: bool = False) -> AsyncIterator[dict]:
    adm = opened.admission
    blocks = ar.ContentBlocks()
    finished = False
    try:
        usage = {"input_tokens": adm.prompt_tokens, "output_tokens": 0,
                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        yield _sse(*ar.sse_event("message_start", message=ar.message_object(
            message_id, model, [], (None, None), usage,
            ar.ortserve_extension(adm, None, parsed.resolved))))
        async for event in opened.events():
            kind = event.WhichOneof("event")
            if kind == "chunk":
                for out in blocks.add(reader.chunk(event.chunk)):
                    yield _sse(*out)
            elif kind == "finished":
                finished = True
                fin = event.finished
                for out in blocks.add(reader.end()) + blocks.close():
                    yield _sse(*out)
                stop, sequence = ar.stop_reason(fin, reader.parser.called)
                yield _sse(*ar.sse_event("message_delta",
                                      delta={"stop_reason": stop, "stop_sequence": sequence},
                                      usage=ar.usage_dict(fin.usage),
                                      ortserve={"finished": ar.ortserve_extension(
                                          adm, fin)["finished"]},
                                      **({"metrics": body_metrics(adm, fin)}
                                         if with_metrics else {})))
                yield _sse(*ar.sse_event("message_stop"))
                return
        raise StreamBroken("the stream ended without a Finished event")
    except grpc.RpcError as error:
        # The headers are gone already: a failure mid-way is an `error` event, which
        # Anthropic's SDKs raise.
        yield _sse("error", am.error_body(am.renamed(from_grpc(error, "messages", "messages"))))
    except StreamBroken as error:
        yield _sse("error", am.error_body(HttpError(502, str(error), "server_error",
                                                    "bad_upstream_stream")))
    finally:
        if not finished:
            # The client went away (sse-starlette cancels us) or the call failed: the gRPC
            # call ends now, so the lease is freed now, not at max_tokens.
            log.info("stream ended early", request_id=message_id, lease_id=adm.lease_id)
            opened.cancel()


def _thinking_refused(why: str, remedy: str = "leave `thinking` out or send "
                      "{\"type\": \"disabled\"}") -> HttpError:
    return HttpError(400, f"{{\"type\": \"enabled\"}} cannot be honoured: {why}; {remedy}",
                     "invalid_request_error", "unsupported_parameter", "thinking")


def _sse(kind: str, data: dict) -> dict:
    return {"event": kind, "data": json.dumps(data, separators=(",", ":"))}
