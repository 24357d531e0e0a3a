"""Per-tenant request rates: a token bucket per tenant (pure; the admission queue asks it).

A tenant with `requests_per_s` starts at most that many requests a second on
average, `burst` at once after a quiet spell. A request refused for its rate
holds nothing and waits nowhere: the caller is told when a token is back.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler_service.ledger.tenants import Tenant


@dataclass
class _Bucket:
    tokens: float
    at: float  # when `tokens` was last brought up to date


class RateLimits:
    """The buckets of every tenant with a rate. Not thread-safe: the queue's lock guards it."""

    def __init__(self) -> None:
        self._buckets: dict[str, _Bucket] = {}

    def take(self, tenant: Tenant | None, now: float) -> float:
        """Take one request's token: 0.0 when taken, else the seconds until one is back."""
        if tenant is None or tenant.requests_per_s is None:
            return 0.0
        rate, burst = tenant.requests_per_s, tenant.burst
        bucket = self._buckets.setdefault(tenant.name, _Bucket(float(burst), now))
        # A reload may have changed the rate or the burst: refill at the rate in force.
        bucket.tokens = min(float(burst), bucket.tokens + max(0.0, now - bucket.at) * rate)
        bucket.at = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / rate
