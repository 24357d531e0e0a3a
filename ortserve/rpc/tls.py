"""TLS with grpcio's own credentials: server ports and client channels from PEM files.

One shape for every service: a certificate and key (what this process shows),
and a CA (what it trusts in the peer). The same leaf serves as the server
certificate and, towards a peer that asks for one, the client certificate:
one file pair per process to issue and rotate.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

import grpc
import structlog

from ortserve.rpc import keepalive

log = structlog.get_logger("tls")


@dataclass(frozen=True)
class TlsFiles:
    """PEM paths; all empty: plaintext (the local demo)."""

    cert: str = ""  # this process's certificate chain
    key: str = ""  # its private key
    ca: str = ""  # the CA bundle peers' certificates must chain to

    @property
    def enabled(self) -> bool:
        return bool(self.cert or self.key or self.ca)

    def check(self, who: str, need_ca: bool, flag_prefix: str = "--tls-") -> None:
        """Raise ValueError naming what is missing or unreadable, and how to fix it."""
        if not self.enabled:
            return
        wanted = {"cert": self.cert, "key": self.key}
        if need_ca:
            wanted["ca"] = self.ca
        missing = [f"{flag_prefix}{name}" for name, path in wanted.items() if not path]
        if missing:
            raise ValueError(f"{who}: TLS needs {', '.join(f'{flag_prefix}{n}' for n in wanted)}; "
                             f"{', '.join(missing)} missing (give all of them, or none for plaintext)")
        for name, path in wanted.items():
            if not Path(path).is_file():
                raise ValueError(f"{who}: {flag_prefix}{name} {path!r} is not a readable file")


def add_arguments(parser, env_prefix: str, what: dict[str, str]) -> None:
    """--tls-cert, --tls-key, --tls-ca on `parser`, each defaulting to env
    <env_prefix>TLS_<NAME>; `what` says what each file is for this service."""
    for name in ("cert", "key", "ca"):
        env = f"{env_prefix}TLS_{name.upper()}"
        parser.add_argument(f"--tls-{name}", default=os.environ.get(env, ""),
                            help=f"{what[name]}; env {env}; none of the three: plaintext")


def _read(path: str) -> bytes:
    return Path(path).read_bytes()


def server_credentials(files: TlsFiles, require_client_cert: bool) -> grpc.ServerCredentials:
    """A TLS port; with require_client_cert, only peers whose certificate chains to files.ca."""
    return grpc.ssl_server_credentials(
        [(_read(files.key), _read(files.cert))],
        root_certificates=_read(files.ca) if files.ca else None,
        require_client_auth=require_client_cert)


def channel_credentials(ca: str = "", cert: str = "", key: str = "") -> grpc.ChannelCredentials:
    """A TLS channel trusting `ca` (empty: the system roots), showing cert/key when given."""
    return grpc.ssl_channel_credentials(
        root_certificates=_read(ca) if ca else None,
        private_key=_read(key) if key else None,
        certificate_chain=_read(cert) if cert else None)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind(server, address: str, files: TlsFiles, require_client_cert: bool, what: str) -> int:
    """Bind `address` with TLS when configured, else plaintext (loudly when beyond loopback)."""
    if files.enabled:
        return server.add_secure_port(address, server_credentials(files, require_client_cert))
    host = address.rsplit(":", 1)[0]
    if not is_loopback(host):
        log.warning("PLAINTEXT port bound beyond loopback: anyone on the network can read and "
                    "forge its traffic; give --tls-cert, --tls-key and --tls-ca",
                    port_role=what, address=address)
    return server.add_insecure_port(address)


def secure_or_insecure_channel(address: str, credentials: grpc.ChannelCredentials | None,
                               aio: bool = True, options=None):
    """grpc(.aio) channel to `address`: TLS when credentials are given; it reconnects to a
    lost peer within a second (keepalive.RECONNECT_OPTIONS)."""
    module = grpc.aio if aio else grpc
    options = (*(options or ()), *keepalive.RECONNECT_OPTIONS)
    if credentials is None:
        return module.insecure_channel(address, options=options)
    return module.secure_channel(address, credentials, options=options)
