"""The Scheduler's stored-response RPCs: protobuf <-> StoredResponses (stored_responses.py).

The servicer delegates PutStoredResponse, GetStoredResponse, DeleteStoredResponse,
ClaimStoredResponse and EndStoredTurn here. Sessions to close go back to the caller,
which closes them with its own key (CloseSession checks that a session is its caller's).
Every record is its caller's tenant's: another tenant's caller finds none (stored_responses.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ortserve.rules import request_rules
from ortserve.status.errors import InvalidField
from ortserve.v1 import scheduler_pb2
from scheduler_service.ledger.tenants import TenantTable
from scheduler_service.sessions.stored_responses import Record, StoredResponses
from scheduler_service.tenant_of import caller_tenant

MAX_ID_CHARS = 256
MAX_RECORD_BYTES = 16 * 1024 * 1024


class StoredResponseRPCs:
    def __init__(self, store: StoredResponses | None = None,
                 tenants: Callable[[], TenantTable] | None = None) -> None:
        self.store = store or StoredResponses()
        self._tenants = tenants  # the ledger's table in force (None: no tenants)

    def _tenant(self, context) -> str:
        return caller_tenant(self._tenants(), context) if self._tenants and context else ""

    async def PutStoredResponse(self, request: scheduler_pb2.StoredResponse, context):
        _id(request.id)
        request_rules.bounded("session_id", request.session_id, MAX_ID_CHARS)
        if len(request.record) > MAX_RECORD_BYTES:
            raise InvalidField("record", f"is {len(request.record):,} bytes, more than the "
                               f"{MAX_RECORD_BYTES:,} kept", length=len(request.record),
                               limit=MAX_RECORD_BYTES)
        if not (math.isfinite(request.ttl_s) and request.ttl_s > 0):
            raise InvalidField("ttl_s", f"{request.ttl_s:g} must be a number of seconds above 0")
        closing = self.store.put(Record(request.id, request.session_id, request.record,
                                        request.ttl_s, tenant=self._tenant(context)),
                                 request.max_responses)
        if closing is None:
            raise InvalidField("id", f"{request.id!r} is taken; store the response under a "
                               "new id")
        return scheduler_pb2.StoredResponseChange(found=True, closing_session_ids=closing)

    async def GetStoredResponse(self, request: scheduler_pb2.StoredResponseRequest, context):
        _id(request.id)
        record = self.store.get(request.id, self._tenant(context))
        if record is None:
            return scheduler_pb2.StoredResponseLookup(found=False)
        return scheduler_pb2.StoredResponseLookup(found=True, response=scheduler_pb2.StoredResponse(
            id=record.id, session_id=record.session_id, record=record.record, ttl_s=record.ttl_s,
            max_responses=self.store.max_responses))

    async def DeleteStoredResponse(self, request: scheduler_pb2.StoredResponseRequest, context):
        _id(request.id)
        found, closing = self.store.delete(request.id, self._tenant(context))
        return scheduler_pb2.StoredResponseChange(found=found, closing_session_ids=closing)

    async def ClaimStoredResponse(self, request: scheduler_pb2.StoredResponseRequest, context):
        _id(request.id)
        return scheduler_pb2.StoredResponseClaim(
            session_id=self.store.claim(request.id, self._tenant(context)))

    async def EndStoredTurn(self, request: scheduler_pb2.EndStoredTurnRequest, context):
        request_rules.bounded("session_id", request.session_id, MAX_ID_CHARS)
        closing = self.store.turn_ended(request.session_id, request.kept, self._tenant(context))
        return scheduler_pb2.StoredResponseChange(found=True, closing_session_ids=closing)


def _id(response_id: str) -> None:
    if not response_id:
        raise InvalidField("id", "is empty; name the stored response")
    request_rules.bounded("id", response_id, MAX_ID_CHARS)
