"""Typed exceptions: one per rejection cause, carrying the numbers, and the rest by status.

They live in ortserve.status.call_errors, which the gateway decodes with too; this module
keeps the client's names."""

from __future__ import annotations

from ortserve.status.call_errors import (
    RETRYABLE,
    BudgetBusy,
    ContextLengthExceeded,
    ExceedsCapacity,
    GenerationFailed,
    InvalidRequest,
    NoWorker,
    OrtserveError,
    QueueFull,
    QueueTimeout,
    Rejected,
    from_rpc_error,
    rejection_dict,
)

__all__ = ["RETRYABLE", "BudgetBusy", "ContextLengthExceeded", "ExceedsCapacity",
           "GenerationFailed", "InvalidRequest", "NoWorker", "OrtserveError", "QueueFull",
           "QueueTimeout", "Rejected", "from_rpc_error", "rejection_dict"]
