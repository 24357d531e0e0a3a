"""Who is asking, for the scheduler: the HTTP request's key and tenant as gRPC metadata.

One forwarder for every route (chat, completions, responses, messages, tokenize, models):
the gateway holds no keys of its own, so the scheduler stays the one place that checks
them, and it reads the tenant from the same metadata whichever API the caller speaks.
"""

from __future__ import annotations

from fastapi import Request

from ortserve.rules.request_rules import TENANT_METADATA

Metadata = tuple[tuple[str, str], ...]


def passed_through(request: Request, api_key_header: str = "") -> Metadata:
    """The caller's `Authorization` (else its `api_key_header`, e.g. Anthropic's x-api-key,
    as a bearer key) and the value of the gateway's --tenant-header."""
    auth = request.headers.get("authorization")
    key = request.headers.get(api_key_header) if api_key_header else None
    if not auth and key:
        auth = f"Bearer {key}"
    passed = [("authorization", auth)] if auth else []
    # --tenant-header: the proxy in front of the gateway says whose request this is; the
    # scheduler honours it only when its tenants file trusts this metadata
    # (docs/features/tenants.md).
    header = getattr(request.app.state, "tenant_header", "")
    tenant = request.headers.get(header) if header else None
    if tenant:
        passed.append((TENANT_METADATA, tenant))
    return tuple(passed)
