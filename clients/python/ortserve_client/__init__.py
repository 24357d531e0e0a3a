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
from .report import cap_notice, notice, print_stats, queued_notice, stats_lines
from .types import Admission, BudgetCap, GenerateResult, Queued, TextChunk, Timings, Usage

__all__ = [
    "Admission", "BudgetBusy", "BudgetCap", "Client", "ContextLengthExceeded", "ExceedsCapacity",
    "GenerateResult", "GenerationFailed", "GenerationStream", "InvalidRequest", "NoWorker",
    "OrtserveError", "Queued", "QueueFull", "QueueTimeout", "Rejected", "Retry", "TextChunk",
    "Timings", "Usage", "cap_notice", "notice", "print_stats", "queued_notice", "stats_lines",
]
