"""Listening ports held by one process only, and a taken port refused in one line.

grpc servers set SO_REUSEPORT by default: a second scheduler started on a running
one's port binds it too, and the kernel spreads connections over two ledgers that
each promise the same bytes. Every ortserve port is therefore bound exclusively
(`GRPC_SERVER_OPTIONS`; the gateway's socket never asks for SO_REUSEPORT), and a
port that is taken is refused at start-up, naming the port and, when /proc lets us
see it, the process that holds it.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NoReturn

import structlog

from ortserve.process.logs import json_enabled

# Every grpc server ortserve starts: no second process may share its port.
GRPC_SERVER_OPTIONS = (("grpc.so_reuseport", 0),)

EXIT_PORT_UNAVAILABLE = 2  # as a bad flag (argparse): the command line must change
_LISTEN = "0A"  # /proc/net/tcp's state code for a listening socket
_COMMAND_CHARS = 100  # the holder's command line is shortened to this


class PortUnavailable(Exception):
    """A port this process must listen on cannot be had; the message says why and what to do."""


def _addresses(host: str, port: int) -> list[tuple]:
    """What binding host:port means: every address the host resolves to (grpc binds each)."""
    try:
        return socket.getaddrinfo(host.strip("[]") or None, port, type=socket.SOCK_STREAM,
                                  flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return []  # the bind itself will say the host is wrong


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            if len(fields) > 9 and fields[3] == _LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def _command(pid: str) -> str:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    argv = [os.path.basename(a) if a.startswith("/") else a for a in argv if a]
    if len(argv) > 1 and argv[0].startswith("python"):
        argv = argv[1:]  # a console script run by its interpreter: the script says more
    command = " ".join(argv)
    return command if len(command) <= _COMMAND_CHARS else command[:_COMMAND_CHARS - 3] + "..."


def holder(port: int) -> str:
    """Who listens on `port`: 'pid N (command)' when /proc shows it, else 'another process'."""
    links = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    if links:
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                for fd in (proc / "fd").iterdir():
                    if os.readlink(fd) in links:
                        return f"pid {proc.name} ({_command(proc.name)})"
            except OSError:
                continue  # another user's process, or one that just exited
    return "another process"


def unavailable(host: str, port: int, flag: str, cause: int = errno.EADDRINUSE) -> PortUnavailable:
    """The refusal for host:port, given by `flag`, naming what holds it."""
    where = f"{flag} {port} ({host}:{port})"
    if cause == errno.EACCES:
        return PortUnavailable(f"{where}: permission denied (ports below 1024 need privileges); "
                               f"give another {flag}")
    return PortUnavailable(f"{where} is already in use by {holder(port)}; stop it or give "
                           f"another {flag}")


def check_free(host: str, port: int | None, flag: str) -> None:
    """Raise PortUnavailable when host:port cannot be listened on now (None and 0: nothing to check).

    A plain bind and close, before any server starts, so a taken port is refused
    before anything else has happened (and before grpc's own multi-line log of it).
    """
    if not port:
        return
    for family, kind, proto, _, address in _addresses(host, port):
        with socket.socket(family, kind, proto) as probe:
            # As grpc and uvicorn do: a port left in TIME_WAIT by a stopped server is free.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as error:
                if error.errno in (errno.EADDRINUSE, errno.EACCES):
                    raise unavailable(host, port, flag, error.errno) from None
                # Anything else (an address this host lacks): the real bind decides.


def check_all_free(host: str, ports: Iterable[tuple[str, int | None]]) -> None:
    """check_free for each (flag, port), and refuse one port given to two flags."""
    seen: dict[int, str] = {}
    for flag, port in ports:
        if port and port in seen:
            raise PortUnavailable(f"{flag} {port} is also {seen[port]}: each port serves one "
                                  f"thing; give another {flag}")
        if port:
            seen[port] = flag
        check_free(host, port, flag)


def bind_grpc(bind: Callable[[], int], host: str, port: int, flag: str) -> int:
    """Run a grpc add_*_port call; a failed bind (a port taken since check_free) becomes
    PortUnavailable instead of grpc's RuntimeError or 0."""
    try:
        bound = bind()
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise unavailable(host, port, flag)
    return bound


def listening_socket(host: str, port: int, flag: str) -> socket.socket:
    """A listening TCP socket on host:port, SO_REUSEADDR only: never shared."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as error:
        sock.close()
        if error.errno in (errno.EADDRINUSE, errno.EACCES):
            raise unavailable(host, port, flag, error.errno) from None
        raise PortUnavailable(f"{flag} {port} ({host}:{port}): {error.strerror}") from None
    # Listening at once: two sockets bound with SO_REUSEADDR may coexist until one listens.
    sock.listen()
    return sock


def refuse(program: str, error: PortUnavailable) -> NoReturn:
    """Exit EXIT_PORT_UNAVAILABLE with one line on stderr: JSON when the logs are JSON."""
    if json_enabled():
        structlog.get_logger(program).error("port unavailable", error=str(error))
    else:
        print(f"{program}: {error}", file=sys.stderr, flush=True)
    sys.exit(EXIT_PORT_UNAVAILABLE)
