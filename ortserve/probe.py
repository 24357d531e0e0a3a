"""ortserve-probe: exit 0 when a server's grpc.health.v1 says SERVING (compose healthchecks).

  ortserve-probe 127.0.0.1:50051 [--service ortserve.v1.Worker] [--timeout 2]
"""

from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check(address: str, service: str = "", timeout_s: float = 2.0) -> str:
    """The serving status name, or the gRPC error code name when the call fails."""
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as error:
            return error.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="ortserve-probe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("address")
    p.add_argument("--service", default="", help="a service name; empty: the whole server")
    p.add_argument("--timeout", type=float, default=2.0)
    a = p.parse_args(argv)
    status = check(a.address, a.service, a.timeout)
    if status != "SERVING":
        print(f"ortserve-probe: {a.address} {a.service or '(server)'}: {status}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
