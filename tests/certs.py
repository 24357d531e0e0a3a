"""Test certificates made at test time (trustme): one cluster CA, and a rogue CA that nobody trusts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme

from ortserve.rpc.tls import TlsFiles

HOSTS = ("localhost", "127.0.0.1")


@dataclass(frozen=True)
class Certs:
    dir: Path
    ca: str  # the cluster CA every process trusts
    scheduler: TlsFiles
    worker: TlsFiles
    gateway: TlsFiles  # the gateway's HTTPS certificate (--tls-cert, --tls-key)
    rogue_worker: TlsFiles  # a well-formed certificate from a CA the cluster does not trust


def _leaf(ca: trustme.CA, trusted_ca: str, out: Path, name: str,
          hosts: tuple[str, ...] = HOSTS) -> TlsFiles:
    cert = ca.issue_cert(*hosts)
    cert_path, key_path = out / f"{name}.pem", out / f"{name}-key.pem"
    cert_path.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    cert.private_key_pem.write_to_path(str(key_path))
    return TlsFiles(cert=str(cert_path), key=str(key_path), ca=trusted_ca)


def make_certs(out: Path, scheduler_hosts: tuple[str, ...] = HOSTS,
               worker_hosts: tuple[str, ...] = HOSTS,
               gateway_hosts: tuple[str, ...] = HOSTS) -> Certs:
    """ca.pem, scheduler.pem/-key.pem, worker.pem/-key.pem, gateway.pem/-key.pem (the names
    compose's TLS profile uses), each leaf naming its hosts (compose: the service names the
    others dial)."""
    out.mkdir(parents=True, exist_ok=True)
    ca, rogue = trustme.CA(), trustme.CA()
    ca_path = out / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    return Certs(dir=out, ca=str(ca_path),
                 scheduler=_leaf(ca, str(ca_path), out, "scheduler", scheduler_hosts),
                 worker=_leaf(ca, str(ca_path), out, "worker", worker_hosts),
                 gateway=_leaf(ca, str(ca_path), out, "gateway", gateway_hosts),
                 rogue_worker=_leaf(rogue, str(ca_path), out, "rogue-worker"))
