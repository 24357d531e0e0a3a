"""The route table: every route the gateway serves, one line each (llama.cpp's shape).

The router is built from it (app.py), the 404's list of routes is written from it
(`served`), and each line names its API (reply/api_words.py), whose words the route's
errors and caps speak (errors.ROUTE_FIELDS is built from those APIs). Adding an endpoint
is a folder under gateway/apis/ and a line here (docs/gateway.md#adding-an-endpoint).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fastapi import Request

from gateway import server_routes as server
from gateway.apis.chat import route as chat
from gateway.apis.messages import route as messages
from gateway.apis.responses import route as responses
from gateway.reply.api_words import CHAT, COMPLETION, MESSAGES, RESPONSES, Api
from gateway.state import GatewayState

Handler = Callable[[Request, GatewayState], Awaitable]


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Handler
    api: Api  # whose parameter names the route's errors and caps use


def _response_id(request: Request) -> str:
    return request.path_params["response_id"]


# Anthropic's SDKs send their key as x-api-key; the Messages routes pass it on as a
# bearer key and answer errors in Anthropic's shape (messages/route.py).
ROUTES: tuple[Route, ...] = (
    Route("POST", "/v1/chat/completions", lambda rq, s: chat.create(
        "chat", rq, s.target(rq), s.config.reasoning_parser, s.reporting), CHAT),
    Route("POST", "/v1/completions", lambda rq, s: chat.create(
        "completion", rq, s.target(rq), "auto", s.reporting), COMPLETION),
    Route("POST", "/v1/responses", lambda rq, s: responses.create(
        rq, s.target(rq), s.stored, s.config.reasoning_parser, s.reporting), RESPONSES),
    Route("GET", "/v1/responses/{response_id}", lambda rq, s: responses.get(
        s.stored, s.target(rq), _response_id(rq)), RESPONSES),
    Route("DELETE", "/v1/responses/{response_id}", lambda rq, s: responses.delete(
        s.stored, s.target(rq), _response_id(rq)), RESPONSES),
    Route("POST", "/v1/responses/{response_id}/cancel", lambda rq, s: responses.cancel(
        s.stored, s.target(rq), _response_id(rq)), RESPONSES),
    Route("GET", "/v1/responses/{response_id}/input_items", lambda rq, s:
          responses.list_input_items(s.stored, s.target(rq), _response_id(rq),
                                     rq.query_params), RESPONSES),
    Route("POST", "/v1/messages", lambda rq, s: messages.create(
        rq, s.target(rq, "x-api-key"), s.config.reasoning_parser, s.reporting), MESSAGES),
    Route("POST", "/v1/messages/count_tokens", lambda rq, s: messages.count_tokens(
        rq, s.target(rq, "x-api-key")), MESSAGES),
    Route("GET", "/v1/models", server.models, CHAT),
    # {model_id:path}: a model's name may hold slashes (a Hugging Face id, org/name).
    Route("GET", "/v1/models/{model_id:path}", lambda rq, s: server.model(
        rq, s, rq.path_params["model_id"]), CHAT),
    Route("POST", "/tokenize", server.tokenize_route, CHAT),
    Route("POST", "/detokenize", server.detokenize_route, CHAT),
    Route("GET", "/health", server.health, CHAT),
    Route("GET", "/metrics", server.prometheus_metrics, CHAT),
)


def served(routes: tuple[Route, ...] = ROUTES) -> str:
    """"POST /v1/chat/completions, ..., GET|DELETE /v1/responses/{response_id}, ...":
    the routes in the table's order, one path's methods together."""
    methods: dict[str, list[str]] = {}
    for route in routes:
        methods.setdefault(route.path, []).append(route.method)
    return ", ".join(f"{'|'.join(m)} {path}" for path, m in methods.items())
