"""Lease secrets: proof that a caller holds the lease Admit gave it.

A secret is HMAC-SHA256(process key, lease_id): stateless (nothing to store or
expire beside the ledger), unguessable without the key, and checked in
constant time. The key is drawn per scheduler process; an unclaimed lease does
not outlive its scheduler anyway (only claimed leases are restored, by their
workers, on the internal service).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from ortserve.status.errors import DomainError, ErrorReason, quoted


class LeaseSecrets:
    def __init__(self, key: bytes | None = None) -> None:
        self._key = key or secrets.token_bytes(32)

    def of(self, lease_id: str) -> str:
        return hmac.new(self._key, lease_id.encode(), hashlib.sha256).hexdigest()

    def check(self, lease_id: str, secret: str) -> None:
        """Raise LEASE_SECRET_MISMATCH unless `secret` is the lease's (the ledger is not touched)."""
        if secret and hmac.compare_digest(self.of(lease_id), secret):
            return
        given = f"a {len(secret)}-char secret that is not this lease's" if secret else "no lease_secret"
        raise DomainError(
            ErrorReason.LEASE_SECRET_MISMATCH,
            f"release of lease {quoted(lease_id)} refused: it carried {given}; only the caller "
            "that Admit answered may release a lease: send the Admission's lease_secret (a "
            "Generate stream's lease is released by the scheduler itself)",
            metadata={"lease_id": lease_id, "secret_chars": len(secret)})
