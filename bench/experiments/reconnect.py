"""How long after a peer comes back on its port a channel that tried it while it was down
is READY again: gRPC's default reconnect backoff beside ortserve's (keepalive.RECONNECT_OPTIONS).

  .venv/bin/python -m bench.experiments.reconnect [--down-s 30] [--repeats 3]

A caller polls the channel (get_state, try_to_connect) every 200 ms while nothing listens
at the address, as a gateway asking about a worker that is down would; then a health
server starts on that port and the time until the channel is READY is measured. Prints
one JSON object (seconds, per repeat) on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import time

import grpc
from grpc_health.v1 import health, health_pb2_grpc

from ortserve.rpc import keepalive

POLL_S = 0.2  # how often the caller asks while the peer is down


def free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


async def back_to_ready_s(options: tuple, down_s: float) -> float:
    address = free_address()
    channel = grpc.aio.insecure_channel(address, options=options)
    until = time.monotonic() + down_s
    while time.monotonic() < until:
        channel.get_state(try_to_connect=True)
        await asyncio.sleep(POLL_S)
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    server.add_insecure_port(address)
    await server.start()
    back = time.monotonic()
    while channel.get_state(try_to_connect=True) != grpc.ChannelConnectivity.READY:
        await asyncio.sleep(0.05)
    waited_s = time.monotonic() - back
    await channel.close()
    await server.stop(None)
    return waited_s


async def run(down_s: float, repeats: int) -> dict:
    result: dict = {"down_s": down_s}
    for name, options in (("grpc_default", ()), ("ortserve", keepalive.RECONNECT_OPTIONS)):
        runs = []
        for i in range(repeats):
            print(f"{name}: repeat {i + 1}/{repeats}, the peer down {down_s:g} s", file=sys.stderr,
                  flush=True)
            runs.append(round(await back_to_ready_s(options, down_s), 3))
        result[f"{name}_ready_after_s"] = runs
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--down-s", type=float, default=30.0, help="how long the peer is down")
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    if a.down_s < 0 or a.repeats < 1:
        p.error("--down-s must be >= 0 and --repeats >= 1")
    print(json.dumps(asyncio.run(run(a.down_s, a.repeats))))


if __name__ == "__main__":
    main()
