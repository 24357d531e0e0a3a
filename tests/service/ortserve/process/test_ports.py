"""ortserve/process/ports.py with real sockets and real grpc servers: a port is held by one process."""

from __future__ import annotations

import asyncio
import os
import socket

import grpc
import pytest

from ortserve.process import ports


def reuseport_socket(port: int) -> socket.socket:
    """What a grpc server with its default options does: SO_REUSEPORT, sharing allowed."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", port))
    return sock


def test_a_grpc_server_with_the_options_shares_its_port_with_no_one():
    asyncio.run(_a_grpc_server_shares_its_port_with_no_one())


async def _a_grpc_server_shares_its_port_with_no_one():
    first = grpc.aio.server(options=ports.GRPC_SERVER_OPTIONS)
    port = ports.bind_grpc(lambda: first.add_insecure_port("127.0.0.1:0"), "127.0.0.1", 0, "--port")
    await first.start()
    try:
        with pytest.raises(OSError):
            reuseport_socket(port)
        # A second grpc server, even one that asks to share, gets the refusal, not the port.
        second = grpc.aio.server()
        with pytest.raises(ports.PortUnavailable) as refused:
            ports.bind_grpc(lambda: second.add_insecure_port(f"127.0.0.1:{port}"), "127.0.0.1",
                            port, "--internal-port")
        assert str(refused.value).startswith(f"--internal-port {port} (127.0.0.1:{port}) is "
                                             f"already in use by pid {os.getpid()} (")
        assert str(refused.value).endswith("stop it or give another --internal-port")
    finally:
        await first.stop(0)


def test_check_free_refuses_a_listening_port_and_passes_a_free_one():
    with ports.listening_socket("127.0.0.1", 0, "--port") as held:
        port = held.getsockname()[1]
        with pytest.raises(ports.PortUnavailable, match=f"--metrics-port {port} "):
            ports.check_free("127.0.0.1", port, "--metrics-port")
        with pytest.raises(ports.PortUnavailable, match="already in use"):
            ports.check_free("0.0.0.0", port, "--port")  # the wildcard overlaps loopback
    ports.check_free("127.0.0.1", port, "--port")  # closed: free again
    ports.check_free("127.0.0.1", 0, "--port")
    ports.check_free("127.0.0.1", None, "--metrics-port")


def test_one_port_for_two_flags_is_refused_before_any_bind():
    with pytest.raises(ports.PortUnavailable, match="--internal-port 40001 is also --port"):
        ports.check_all_free("127.0.0.1", [("--port", 40001), ("--internal-port", 40001)])
    ports.check_all_free("127.0.0.1", [("--port", 0), ("--internal-port", 0), ("--metrics-port", None)])


def test_the_gateways_socket_is_listening_and_cannot_be_shared():
    with ports.listening_socket("127.0.0.1", 0, "--port") as held:
        port = held.getsockname()[1]
        with pytest.raises(OSError):
            reuseport_socket(port)
        with pytest.raises(ports.PortUnavailable, match=f"pid {os.getpid()} "):
            ports.listening_socket("127.0.0.1", port, "--port")
        socket.create_connection(("127.0.0.1", port), timeout=2).close()  # listening already


def test_a_holder_that_cannot_be_found_is_another_process():
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))  # bound, never listening: nobody holds it
        assert ports.holder(unused.getsockname()[1]) == "another process"
