"""ortserve-probe: exit 0 when a server's grpc.health.v1 says SERVING (compose healthchecks).

  ortserve-probe 127.0.0.1:50051 [--service ortserve.v1.Worker] [--timeout 2]
                 [--cacert ca.pem [--cert c.pem --key k.pem]]   (TLS; env ORTSERVE_PROBE_*)
  ortserve-probe http://127.0.0.1:8000/health   (the gateway: exit 0 on HTTP 2xx)
"""

from __future__ import annotations

import argparse
import os
import ssl
import sys
import urllib.error
import urllib.request

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ortserve.process.version import package_version
from ortserve.rpc.tls import channel_credentials, secure_or_insecure_channel


def check(address: str, service: str = "", timeout_s: float = 2.0,
          credentials: grpc.ChannelCredentials | None = None) -> str:
    """The serving status name, or the gRPC error code name when the call fails.

    `credentials`: TLS (a worker's port also wants a client certificate: mutual TLS).
    """
    with secure_or_insecure_channel(address, credentials, aio=False) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as error:
            return error.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def check_http(url: str, timeout_s: float = 2.0, cacert: str = "", cert: str = "",
               key: str = "") -> str:
    """"SERVING" when GET url answers 2xx, else what it answered (status and body) or why not.
    https: trusting `cacert` (empty: the system's roots), showing cert/key when given."""
    context = None
    if url.startswith("https://"):
        context = ssl.create_default_context(cafile=cacert or None)
        if cert:
            context.load_cert_chain(cert, key or None)
    try:
        with urllib.request.urlopen(url, timeout=timeout_s, context=context) as reply:
            return "SERVING" if 200 <= reply.status < 300 else f"HTTP {reply.status}"
    except urllib.error.HTTPError as error:
        return f"HTTP {error.code} {error.read(500).decode(errors='replace').strip()}"
    except (urllib.error.URLError, OSError) as error:
        return f"unreachable ({getattr(error, 'reason', error)})"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="ortserve-probe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    p.add_argument("address", help="host:port (gRPC health), or an http:// or https:// URL "
                                   "(GET, 2xx)")
    p.add_argument("--service", default="", help="a service name; empty: the whole server")
    p.add_argument("--timeout", type=float, default=2.0)
    for name in ("cacert", "cert", "key"):
        p.add_argument(f"--{name}", default=os.environ.get(f"ORTSERVE_PROBE_{name.upper()}", ""),
                       help=f"TLS: {'the CA (PEM) to trust' if name == 'cacert' else 'client ' + name} "
                            f"(env ORTSERVE_PROBE_{name.upper()})")
    a = p.parse_args(argv)
    if a.address.startswith(("http://", "https://")):
        status = check_http(a.address, a.timeout, a.cacert, a.cert, a.key)
    else:
        credentials = channel_credentials(a.cacert, a.cert, a.key) if a.cacert else None
        status = check(a.address, a.service, a.timeout, credentials)
    if status != "SERVING":
        print(f"ortserve-probe: {a.address} {a.service or '(server)'}: {status}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
