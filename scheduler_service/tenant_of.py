"""Which tenant a call is charged to: its API key's, or a trusted gateway's metadata.

The edge's half of tenants (the table and its rule are ledger/tenants.py's): reads
the caller's key digest the auth interceptor set and the call's metadata.
"""

from __future__ import annotations

import structlog

from ortserve.rpc.auth import caller_key_digest
from scheduler_service.ledger import tenants
from scheduler_service.ledger.ledger import Ledger
from scheduler_service.ledger.tenants import METADATA_KEY, TenantTable

log = structlog.get_logger("scheduler")


def caller_tenant(table: TenantTable, context) -> str:
    """The tenant of the call on `context` ("": none); raises INVALID_REQUEST for tenant
    metadata the table cannot honour (untrusted, unknown, or not the key's tenant)."""
    claimed = None
    for key, value in context.invocation_metadata() or ():
        if key == METADATA_KEY:
            claimed = value.decode() if isinstance(value, bytes) else value
    if not table.enabled and not claimed:
        return ""
    return table.resolve(caller_key_digest(), claimed)


def reload(ledger: Ledger, path: str) -> bool:
    """Read the tenants file again (SIGHUP) and put it in force; a file that is refused
    or unreadable is logged and the table in force stays. Returns whether it changed."""
    try:
        table = tenants.load(path)
    except (OSError, tenants.TenantFileError) as error:
        log.error("tenants file refused; the tenants in force stay", path=path, error=str(error),
                  tenants=len(ledger.tenants.tenants))
        return False
    ledger.set_tenants(table)
    log.info("tenants reloaded", path=path, tenants=len(table.tenants),
             keys=len(table.tenant_of_digest), default_tenant=table.default_tenant,
             trust_tenant_metadata=table.trust_tenant_metadata)
    return True
