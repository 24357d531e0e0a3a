"""The floor under the token path: what one grpc.aio server-stream message costs in Python.

  python -m bench.served.grpc_floor [--streams 8] [--messages 20000]

A bare grpc.aio server (no ortserve code) streams `messages` small
pre-serialized frames (a one-token TokenChunk's bytes) on each of `streams`
calls to a client in another process; the server's own CPU time (user +
system) divided by the messages sent is what a relaying process pays per
token and client before any work of its own. The scheduler's relayed path
sends one such message per token and request (docs/benchmarks.md, round 4).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

import grpc

FRAME = b"\x12\x06\n\x01\x01\x12\x01a"  # GenerateEvent{chunk{token_ids: [1], text: "a"}}

CLIENT = """
import grpc, sys, threading
channel = grpc.insecure_channel(sys.argv[1])
method = channel.unary_stream("/floor.Floor/Stream", request_serializer=None,
                              response_deserializer=None)
def one():
    for _ in method(b""):
        pass
threads = [threading.Thread(target=one) for _ in range(int(sys.argv[2]))]
[t.start() for t in threads]
[t.join() for t in threads]
"""


def cpu_s() -> float:
    times = os.times()
    return times.user + times.system


async def measure(streams: int, messages: int) -> dict:
    async def stream(request, context):
        for _ in range(messages):
            yield FRAME

    server = grpc.aio.server()
    handlers = {"Stream": grpc.unary_stream_rpc_method_handler(
        stream, request_deserializer=None, response_serializer=None)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("floor.Floor", handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        start_cpu, start_wall = cpu_s(), time.perf_counter()
        client = await asyncio.create_subprocess_exec(sys.executable, "-c", CLIENT,
                                                      f"127.0.0.1:{port}", str(streams))
        if await client.wait() != 0:
            raise RuntimeError("the client process failed")
        used_s, wall_s = cpu_s() - start_cpu, time.perf_counter() - start_wall
    finally:
        await server.stop(0)
    sent = streams * messages
    return {"streams": streams, "messages": sent, "grpc_version": grpc.__version__,
            "server_cpu_us_per_message": round(used_s / sent * 1e6, 1),
            "messages_per_s": round(sent / wall_s)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.served.grpc_floor", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--messages", type=int, default=20_000, help="per stream")
    a = p.parse_args(argv)
    print(json.dumps(asyncio.run(measure(a.streams, a.messages))))


if __name__ == "__main__":
    main()
