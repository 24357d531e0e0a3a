"""Domain errors of the worker's engine.

Each message names the cause, the numbers and a next step, so whoever reads it
(a log, a gRPC status) can act. The servicer maps the classes to status codes
in one table; the engine never imports grpc.
"""

from __future__ import annotations

from ortserve.units import human_bytes, tokens


class EngineError(Exception):
    """Base of every error the engine raises or reports in a Failed event."""


class InvalidRequest(EngineError):
    """A request field is malformed (INVALID_ARGUMENT); `.field` names it, e.g. "sampling.top_p"."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class ContextWindowFull(EngineError):
    """Prompt (+ max_new_tokens) does not fit the model's context window (INVALID_ARGUMENT)."""

    def __init__(self, prompt_tokens: int, max_new_tokens: int, context_length: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.max_new_tokens = max_new_tokens
        self.context_length = context_length
        if prompt_tokens >= context_length:
            message = (
                f"the prompt is {tokens(prompt_tokens)} and fills the model's context window of "
                f"{tokens(context_length)}: a full context window is an error, not an empty turn; "
                f"shorten the prompt to at most {tokens(context_length - 1)}"
            )
        else:
            room = context_length - prompt_tokens
            message = (
                f"the prompt is {tokens(prompt_tokens)} and max_new_tokens {max_new_tokens:,} "
                f"need {tokens(prompt_tokens + max_new_tokens)}, beyond the model's context window "
                f"of {tokens(context_length)}; lower max_new_tokens to {room:,} or shorten the prompt"
            )
        super().__init__(message)


class CapacityExceeded(EngineError):
    """Reserving a sequence's KV would exceed the worker's capacity (RESOURCE_EXHAUSTED)."""

    def __init__(self, needed_bytes: int, held_bytes: int, capacity_bytes: int,
                 detail: str = "") -> None:
        self.needed_bytes = needed_bytes
        self.held_bytes = held_bytes
        self.capacity_bytes = capacity_bytes
        free_bytes = max(capacity_bytes - held_bytes, 0)
        message = (
            f"the sequence needs {human_bytes(needed_bytes)} of KV cache ({needed_bytes:,} bytes)"
            f"{' for ' + detail if detail else ''}; this worker holds {human_bytes(held_bytes)} "
            f"of {human_bytes(capacity_bytes)} ({human_bytes(free_bytes)} free); retry when "
            "running sequences finish, lower max_new_tokens, or raise --kv-budget"
        )
        super().__init__(message)


class DeviceUnavailable(EngineError):
    """The requested device cannot be used (raised at start-up); the message names what is missing."""


class ModelLoadError(EngineError):
    """A model folder is missing files or has a graph the engine cannot serve."""
