"""A chat or completion's choices, from their streams to the client: SSE chunks as the
tokens arrive (`sse`), or one JSON body once every choice has finished (`collect`, which
route.py awaits while the client is there). route.py opens the streams."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import grpc
import structlog

from gateway.apis.chat import n_choices
from gateway.apis.chat import reply as chat_reply
from gateway.generation import Stream, failure
from gateway.reply.errors import HttpError
from gateway.reply.logprobs_json import ChoiceLogprobs
from gateway.reply.reasoning_split import ChoiceReasoning
from gateway.request import tools
from gateway.request.translate import ParsedRequest
from gateway.request_metrics import body_metrics
from gateway.upstream import StreamBroken
from ortserve.v1 import types_pb2

log = structlog.get_logger("ortserve.gateway")
PROMPT_PARAM = {"chat": "messages", "completion": "prompt"}


def _logprobs(meta: chat_reply.ChatReplyMeta, parsed: ParsedRequest, n: int
              ) -> list[ChoiceLogprobs | None]:
    return [ChoiceLogprobs(meta.kind) if parsed.logprobs else None for _ in range(n)]


async def collect(meta: chat_reply.ChatReplyMeta, parsed: ParsedRequest,
                  streams: list[Stream], with_metrics: bool = False) -> dict:
    texts: list[list[str]] = [[] for _ in streams]
    finished: list[types_pb2.Finished | None] = [None] * len(streams)
    logprobs = _logprobs(meta, parsed, len(streams))
    splits = [ChoiceReasoning.for_choice(meta.kind, s.admission, parsed.reasoning_mode)
              for s in streams]
    try:
        async for index, event in n_choices.merged(streams):
            kind = event.WhichOneof("event")
            if kind == "chunk":
                text = event.chunk.text
                if splits[index] is not None:
                    text = splits[index].feed(text, len(event.chunk.token_ids))[1]
                texts[index].append(text)
                if logprobs[index] is not None:
                    logprobs[index].add(event.chunk.logprobs)
            elif kind == "finished":
                finished[index] = event.finished
                if splits[index] is not None:
                    splits[index].finished(event.finished.usage)
    except (grpc.RpcError, StreamBroken) as error:
        raise failure(error, PROMPT_PARAM[meta.kind], meta.kind) from None
    if any(f is None for f in finished):
        raise HttpError(502, "the stream ended without a Finished event", "server_error",
                        "bad_upstream_stream")
    for i, split in enumerate(splits):
        if split is not None:
            texts[i].append(split.close()[1])
    whole = ["".join(t) + _stop_text(parsed, f) for t, f in zip(texts, finished, strict=True)]
    body = chat_reply.choices_response(meta, [
        chat_reply.Choice(whole[i], s.admission, finished[i],
                         logprobs[i].whole() if logprobs[i] is not None else None,
                         tools.ToolCallChoice(s.admission.tool_call_format).message(whole[i])
                         if parsed.tool_calls else None,
                         splits[i].reasoning if splits[i] is not None else None,
                         splits[i].tokens if splits[i] is not None else None)
        for i, s in enumerate(streams)], parsed.resolved)
    if with_metrics:  # vLLM's per-request metrics: choice 0's, as `usage` counts its prompt
        body["metrics"] = body_metrics(streams[0].admission, finished[0])
    return body


def _reasoning_tokens(splits: list[ChoiceReasoning | None]) -> int | None:
    """The choices' reasoning tokens summed; None when no choice splits reasoning."""
    counted = [s.tokens for s in splits if s is not None]
    return sum(counted) if counted else None


def _stop_text(parsed: ParsedRequest, fin: types_pb2.Finished) -> str:
    """include_stop_str_in_output: the stop sequence that ended the output, which the
    worker leaves out of the text, put back at its end (vLLM's behaviour)."""
    if parsed.include_stop_str and fin.finish_reason == types_pb2.STOP_SEQUENCE:
        return fin.stop_sequence
    return ""


async def sse(meta: chat_reply.ChatReplyMeta, parsed: ParsedRequest,
              streams: list[Stream], with_metrics: bool = False) -> AsyncIterator[dict]:
    usage = parsed.include_usage
    finished: list[types_pb2.Finished | None] = [None] * len(streams)
    logprobs = _logprobs(meta, parsed, len(streams))
    # Per choice, the chunk JSON from one template: per token only the text is encoded.
    text_json = [chat_reply.text_chunk_encoder(meta, usage, i) for i in range(len(streams))]
    # Tools: each choice's text goes through its tool-call parser (name, then arguments).
    calls = [tools.ToolCallChoice(s.admission.tool_call_format) if parsed.tool_calls else None
             for s in streams]
    # continuous_usage_stats: every chunk carries its choice's usage so far (vLLM's shape).
    generated = [0] * len(streams)
    # A reasoning model's chat: its reasoning goes out as reasoning_content deltas.
    splits = [ChoiceReasoning.for_choice(meta.kind, s.admission, parsed.reasoning_mode)
              for s in streams]

    def out(chunk: dict, index: int) -> dict:
        if parsed.continuous_usage:
            prompt = streams[index].admission.prompt_tokens
            chunk["usage"] = {"prompt_tokens": prompt, "completion_tokens": generated[index],
                              "total_tokens": prompt + generated[index]}
        return _data(chunk)

    try:
        for index, stream in enumerate(streams):
            yield out(chat_reply.first_chunk(meta, stream.admission, usage, index,
                                            parsed.resolved if index == 0 else None), index)
        async for index, event in n_choices.merged(streams):
            kind = event.WhichOneof("event")
            lp = logprobs[index]
            if kind == "chunk":
                generated[index] += len(event.chunk.token_ids)
                if lp is not None:
                    lp.add(event.chunk.logprobs)
                text = event.chunk.text
                if splits[index] is not None and text:
                    thought, text = splits[index].feed(text, len(event.chunk.token_ids))
                    if thought:
                        yield out(chat_reply.delta_chunk(meta, {"reasoning_content": thought},
                                                        usage, index,
                                                        lp.take() if lp is not None else None),
                                  index)
                # An empty chunk is a character still incomplete: nothing to show yet
                # (its logprobs wait for the chunk that shows its text).
                if text and calls[index] is not None:
                    for chunk in _tool_chunks(meta, calls[index], text, usage,
                                              index, lp, emit=out):
                        yield chunk
                elif text:
                    if lp is None and not parsed.continuous_usage:
                        # Bytes go out as they are: the SSE line, without an event object per token.
                        yield b"data: " + text_json[index](text).encode() + b"\n\n"
                    else:
                        yield out(chat_reply.text_chunk(meta, text, usage, index,
                                                       lp.take() if lp is not None else None),
                                  index)
            elif kind == "finished":
                finished[index] = event.finished
                generated[index] = event.finished.usage.generated_tokens
                stop_text = _stop_text(parsed, event.finished)
                if splits[index] is not None:
                    splits[index].finished(event.finished.usage)
                    thought, rest = splits[index].close()
                    if thought:
                        yield out(chat_reply.delta_chunk(meta, {"reasoning_content": thought},
                                                        usage, index), index)
                    stop_text = rest + stop_text
                called = False
                if calls[index] is not None:
                    for chunk in _tool_chunks(meta, calls[index], stop_text, usage, index, lp,
                                              True, emit=out):
                        yield chunk
                    called = calls[index].called
                elif stop_text:
                    yield out(chat_reply.text_chunk(meta, stop_text, usage, index), index)
                last = chat_reply.final_chunk(meta, event.finished, usage, index,
                                             lp.take() if lp is not None else None, called)
                if with_metrics:  # vLLM's per-request metrics, on each choice's last chunk
                    last["metrics"] = body_metrics(streams[index].admission, event.finished)
                yield out(last, index)
        if usage:
            yield _data(chat_reply.usage_chunk(meta, finished, _reasoning_tokens(splits)))
        yield {"data": "[DONE]"}
    except grpc.RpcError as error:
        # The headers are gone already: a mid-stream failure is an error event,
        # which the openai clients raise as APIError.
        yield _data(failure(error, PROMPT_PARAM[meta.kind], meta.kind).body())
    except StreamBroken as error:
        yield _data(failure(error, "", meta.kind).body())
    finally:
        # The client went away (sse-starlette cancels us) or we failed: either
        # way the gRPC call must end, so the lease is freed now, not at the end.
        if any(f is None for f in finished):
            log.info("stream ended early", request_id=meta.id,
                     lease_id=streams[0].admission.lease_id)
            n_choices.cancel_all(streams)


def _tool_chunks(meta: chat_reply.ChatReplyMeta, parser: tools.ToolCallChoice, text: str,
                 usage: bool, index: int, lp: ChoiceLogprobs | None, final: bool = False,
                 emit=None) -> list[dict]:
    """A choice's text as tool-call and content deltas; logprobs ride on the first chunk
    (text held back, e.g. a possible "<tool_call>", keeps them for the next). `emit`
    (chunk, index) -> SSE item; default: the chunk as it is."""
    out = []
    for delta in parser.deltas(text, final):
        chunk = chat_reply.delta_chunk(meta, delta, usage, index,
                                      lp.take() if lp is not None else None)
        out.append(emit(chunk, index) if emit is not None else _data(chunk))
    return out


def _data(obj: dict) -> dict:
    return {"data": json.dumps(obj, separators=(",", ":"))}
