"""The route table (gateway/routes.py) is the one list of routes: the app serves exactly
its lines, the 404 names each, and every line's API has its words in the one mapping
errors and caps go through (in_route_words), so no route can meet a KeyError there."""

from __future__ import annotations

import pytest
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from gateway.app import build_app, unrouted
from gateway.config import GatewayConfig
from gateway.reply.errors import ROUTE_FIELDS, in_route_words
from gateway.routes import ROUTES, served


def _line(route) -> str:
    return f"{route.method} {route.path}"


def test_the_app_serves_exactly_the_route_tables_lines():
    app = build_app(GatewayConfig())
    routed = sorted(f"{m} {r.path}" for r in app.routes if isinstance(r, APIRoute)
                    for m in r.methods)
    assert routed == sorted(_line(r) for r in ROUTES)


@pytest.mark.parametrize("route", ROUTES, ids=_line)
def test_every_route_speaks_its_apis_words(route):
    text = in_route_words("lower max_new_tokens to 8 or raise min_new_tokens", route.api.name)
    assert text == (f"lower {route.api.max_tokens_param} to 8 or raise "
                    f"{route.api.min_tokens_param}")


def test_the_route_fields_are_the_apis_the_table_names():
    assert set(ROUTE_FIELDS) == {r.api.name for r in ROUTES}


def test_an_unknown_route_is_answered_with_every_route_of_the_table():
    message = unrouted("GET", "/v1/nope", HTTPException(404)).body()["error"]["message"]
    assert message.endswith(served())
    for route in ROUTES:
        assert route.path in message
    assert "GET|DELETE /v1/responses/{response_id}" in message
