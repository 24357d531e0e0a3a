"""Typed views of the scheduler's messages that the gateway and the Python client both
read (ortserve_client.types re-exports them): the budget cap, the sampling echo."""

from __future__ import annotations

from dataclasses import dataclass

from ortserve.v1 import types_pb2


@dataclass(frozen=True)
class BudgetCap:
    requested_max_new_tokens: int
    admitted_max_new_tokens: int
    requested_was_unset: bool
    requested_bytes: int
    admitted_bytes: int
    available_bytes: int
    capacity_bytes: int
    bytes_per_token: int
    prompt_tokens: int
    worker_id: str
    reason: str
    # "tenant_quota": the caller's tenant's room in its quota bound it (then tenant_* say the
    # numbers); "worker": the worker's free bytes or capacity.
    limit: str = "worker"
    tenant: str = ""
    tenant_quota_bytes: int = 0
    tenant_reserved_bytes: int = 0
    # Where requested_max_new_tokens came from: "request", "server_default" or
    # "context_window" ("" from a scheduler that does not say).
    requested_source: str = ""
    # "deadline": the call's deadline at the predicted decode step bound it (time, not bytes:
    # docs/features/time-budget.md); then these two say the numbers.
    predicted_step_ms: float = 0.0
    deadline_ms: float = 0.0

    @classmethod
    def from_pb(cls, pb: types_pb2.BudgetCap) -> BudgetCap:
        fields = {f: getattr(pb, f) for f in cls.__dataclass_fields__
                  if f not in ("limit", "requested_source")}
        limit = {types_pb2.CAP_LIMIT_TENANT_QUOTA: "tenant_quota",
                 types_pb2.CAP_LIMIT_DEADLINE: "deadline"}.get(pb.limit, "worker")
        return cls(**fields, limit=limit, requested_source=max_tokens_source(pb.requested_source))


def max_tokens_source(value: int) -> str:
    """A MaxNewTokensSource as a word: request, server_default, context_window; "" unset."""
    if not value:
        return ""
    return types_pb2.MaxNewTokensSource.Name(value).removeprefix("MAX_NEW_TOKENS_FROM_").lower()



def sampling_dict(pb: types_pb2.SamplingParams) -> dict:
    """The set fields; logit_bias (a map, which has no presence) when not empty, its token
    ids as strings (JSON object keys)."""
    out = {f.name: getattr(pb, f.name) for f in pb.DESCRIPTOR.fields
           if f.has_presence and pb.HasField(f.name)}
    if pb.logit_bias:
        out["logit_bias"] = {str(k): v for k, v in sorted(pb.logit_bias.items())}
    return out
