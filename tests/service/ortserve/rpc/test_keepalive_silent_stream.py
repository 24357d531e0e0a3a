"""A stream that sends nothing for a while (a long prefill, a wait for the first token)
stays open under ortserve's keepalive pings: a real server (serving.new_server) and a real
channel at the most frequent interval ortserve allows, through loopback."""

from __future__ import annotations

import asyncio

import grpc

from ortserve.rpc import keepalive, serving

SILENT_S = 7.0  # seven pings at 1 s: main cut the stream after four ("Too many pings")


def _same(data: bytes) -> bytes:
    return data


async def _silent_then_one(request: bytes, context):
    await asyncio.sleep(SILENT_S)  # no data frame: the state under test, not a timing
    yield b"first token"


async def _call_silent_stream(channel_options) -> list[bytes]:
    server = serving.new_server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.Silent", {
        "Stream": grpc.unary_stream_rpc_method_handler(
            _silent_then_one, request_deserializer=_same, response_serializer=_same)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}",
                                             options=channel_options) as channel:
            call = channel.unary_stream("/t.Silent/Stream", request_serializer=_same,
                                        response_deserializer=_same)
            return [message async for message in call(b"prompt")]
    finally:
        await server.stop(0)


def test_a_silent_stream_outlives_many_pings_at_the_most_frequent_interval():
    options = keepalive.channel_options(keepalive.MIN_INTERVAL_S)
    assert asyncio.run(_call_silent_stream(options)) == [b"first token"]
