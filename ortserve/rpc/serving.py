"""What every ortserve gRPC server has: its port bound exclusively, keepalive pings,
health (grpc.health.v1) and reflection."""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ortserve.process import ports
from ortserve.rpc import keepalive

OVERALL = ""  # grpc.health.v1's name for the server as a whole


def new_server(interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
               keepalive_s: float = keepalive.DEFAULT_INTERVAL_S) -> grpc.aio.Server:
    """A grpc.aio server with the options every ortserve server takes: no second process
    on its port (ports.py) and keepalive both ways (keepalive.py), pinging its callers
    every `keepalive_s` (0: not)."""
    return grpc.aio.server(interceptors=list(interceptors) or None,
                           options=ports.GRPC_SERVER_OPTIONS
                           + keepalive.server_options(keepalive_s))


def add_health_and_reflection(
    server: grpc.aio.Server, service_full_names: list[str]
) -> health.aio.HealthServicer:
    """Register health and reflection for `service_full_names` on `server`.

    Returns the health servicer so the caller can flip NOT_SERVING -> SERVING
    when it is ready (a worker: model loaded and provider verified).
    """
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [*service_full_names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             reflection.SERVICE_NAME]
    reflection.enable_server_reflection(names, server)
    return health_servicer


async def set_serving(
    health_servicer: health.aio.HealthServicer, service_full_names: list[str], serving: bool
) -> None:
    """Set every listed service and the overall status to SERVING or NOT_SERVING."""
    status = (
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    for name in [OVERALL, *service_full_names]:
        await health_servicer.set(name, status)
