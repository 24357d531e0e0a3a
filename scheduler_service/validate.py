"""Bounds on what callers send, checked at the edge before anything is echoed or stored.

Only what the scheduler must know itself: field sizes (so no error message or
log line carries a 5,000-character id) and, for token-id prompts, the
vocabulary (so an Admit needs no worker round trip). The worker validates
the rest of the request (sampling, template) once, in its own prepare.
"""

from __future__ import annotations

from ortserve.chat import CHAT_ROLES
from ortserve.errors import InvalidField, quoted
from ortserve.v1 import types_pb2

MAX_REQUEST_ID_CHARS = 256
MAX_LEASE_ID_CHARS = 128
MAX_WORKER_ID_CHARS = 128
MAX_ADDRESS_CHARS = 256
MAX_STOP_SEQUENCES = 16
MAX_STOP_CHARS = 256
MAX_CHAT_MESSAGES = 1_024


def bounded(field: str, value: str, limit: int) -> None:
    if len(value) > limit:
        raise InvalidField(field, f"is {len(value):,} characters, more than the {limit:,} allowed; "
                           "send a shorter value", length=len(value), limit=limit)


def generate_request(request: types_pb2.GenerateRequest, prefix: str = "") -> None:
    """Raise InvalidField (a proto path under `prefix`) for a field out of bounds."""
    bounded(prefix + "request_id", request.request_id, MAX_REQUEST_ID_CHARS)
    kind = request.WhichOneof("prompt")
    if kind is None:
        raise InvalidField(prefix + "prompt", "is missing: set one of text, token_ids or chat")
    if kind == "token_ids" and not request.token_ids.ids:
        raise InvalidField(prefix + "token_ids.ids", "is empty: send at least one token id")
    if kind == "chat":
        turns = request.chat.messages
        if not turns:
            raise InvalidField(prefix + "chat.messages", "is empty: send at least one turn")
        if len(turns) > MAX_CHAT_MESSAGES:
            raise InvalidField(prefix + "chat.messages", f"has {len(turns):,} turns, more than "
                               f"{MAX_CHAT_MESSAGES:,}; send fewer", count=len(turns))
        for i, turn in enumerate(turns):
            if turn.role not in CHAT_ROLES:
                raise InvalidField(prefix + f"chat.messages[{i}].role",
                                   f"{quoted(turn.role)} is not a role: use one of "
                                   f"{', '.join(CHAT_ROLES)}")
    if len(request.stop) > MAX_STOP_SEQUENCES:
        raise InvalidField(prefix + "stop", f"has {len(request.stop):,} sequences, more than "
                           f"{MAX_STOP_SEQUENCES}; send fewer", count=len(request.stop))
    for i, stop in enumerate(request.stop):
        if not stop:
            raise InvalidField(prefix + f"stop[{i}]", "is empty: an empty stop sequence would "
                               "stop at once; remove it")
        bounded(prefix + f"stop[{i}]", stop, MAX_STOP_CHARS)
    if request.cap_policy not in types_pb2.CapPolicy.values():
        raise InvalidField(prefix + "cap_policy", f"{request.cap_policy} is not a CapPolicy: use "
                           "CAP_POLICY_ALLOW, CAP_POLICY_STRICT or CAP_POLICY_WAIT_FULL")


def token_ids(ids, vocab_size: int, prefix: str = "") -> None:
    """Every id < vocab_size, naming the first that is not (`token_ids.ids[i]`)."""
    if max(ids) < vocab_size:
        return
    i = next(i for i, t in enumerate(ids) if t >= vocab_size)
    raise InvalidField(prefix + f"token_ids.ids[{i}]",
                       f"{ids[i]:,} is outside the model's vocabulary [0, {vocab_size:,}); send "
                       "ids from this model's tokenizer", token_id=ids[i], vocab_size=vocab_size)
