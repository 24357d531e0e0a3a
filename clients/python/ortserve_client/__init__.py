"""ortserve's Python client: typed results, a streaming iterator, typed rejections."""

from .client import Client, GenerationStream, Retry
from .errors import (
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
)
from .report import (
    cap_notice,
    constraint_notice,
    notice,
    print_stats,
    queued_notice,
    stats_lines,
)
from .request import build_request
from .types import (
    Admission,
    BudgetCap,
    ConstraintResult,
    GenerateResult,
    Queued,
    TextChunk,
    Timings,
    TokenLogprob,
    TopLogprob,
    Usage,
)

__all__ = [
    "Admission", "BudgetBusy", "BudgetCap", "Client", "ConstraintResult", "ContextLengthExceeded",
    "ExceedsCapacity", "GenerateResult", "GenerationFailed", "GenerationStream", "InvalidRequest",
    "NoWorker", "OrtserveError", "Queued", "QueueFull", "QueueTimeout", "Rejected", "Retry",
    "TextChunk", "Timings", "TokenLogprob", "TopLogprob", "Usage", "build_request", "cap_notice",
    "constraint_notice", "notice", "print_stats", "queued_notice", "stats_lines",
]
