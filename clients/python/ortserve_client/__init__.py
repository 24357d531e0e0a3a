"""ortserve's Python client: typed results, a streaming iterator, typed rejections."""

from .client import Client, GenerationStream
from .errors import (
    BudgetBusy,
    ContextLengthExceeded,
    ExceedsCapacity,
    GenerationFailed,
    InvalidRequest,
    NoWorker,
    OrtserveError,
    Rejected,
)
from .report import cap_notice, notice, print_stats, stats_lines
from .types import Admission, BudgetCap, GenerateResult, TextChunk, Timings, Usage

__all__ = [
    "Admission", "BudgetBusy", "BudgetCap", "Client", "ContextLengthExceeded", "ExceedsCapacity",
    "GenerateResult", "GenerationFailed", "GenerationStream", "InvalidRequest", "NoWorker",
    "OrtserveError", "Rejected", "TextChunk", "Timings", "Usage", "cap_notice", "notice",
    "print_stats", "stats_lines",
]
