"""Each HTTP API's names for what the scheduler's sentences name by GenerateRequest's
fields: the route table (gateway/routes.py) gives every route one of these, and
errors.ROUTE_FIELDS is built from them, so a route cannot name words nobody wrote."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Api:
    """One API as its callers spell it."""

    name: str  # the key errors and replies are told (from_grpc's `route`)
    max_tokens_param: str  # GenerateRequest.max_new_tokens
    min_tokens_param: str = "min_tokens"  # GenerateRequest.min_new_tokens (vLLM's name)


CHAT = Api("chat", "max_tokens")
COMPLETION = Api("completion", "max_tokens")
RESPONSES = Api("responses", "max_output_tokens")
MESSAGES = Api("messages", "max_tokens")
APIS = (CHAT, COMPLETION, RESPONSES, MESSAGES)
