"""One typed parameter read from a request body, refused naming it when it is not that type (pure).

Booleans are not integers here (JSON's `true` is no token id or count).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from gateway.request.param_error import ParamError


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def int_param(params: Mapping[str, Any], key: str, low: int, high: int) -> int | None:
    value = params.get(key)
    if value is None:
        return None
    if not is_int(value) or not low <= value <= high:
        raise ParamError(key, f"{value!r} is not an integer from {low:,} to {high:,}")
    return value


def number_param(params: Mapping[str, Any], key: str, default: float | None) -> float | None:
    value = params.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ParamError(key, f"{value!r} is not a number")
    return float(value)


def bool_param(params: Mapping[str, Any], key: str, default: bool, where: str = "") -> bool:
    value = params.get(key, default)
    if not isinstance(value, bool):
        raise ParamError(where or key, f"{value!r} is not true or false")
    return value


def body_params(body: object, api: str, other_api_names: Mapping[str, str],
                refused: Collection[str]) -> dict[str, Any]:
    """The keys of an `api` body that have a value (null is "not given", as in OpenAI's
    and Anthropic's APIs), after refusing the OpenAI chat API's names for what `api`
    names otherwise (`other_api_names`: chat's -> `api`'s) and the keys it does not serve."""
    if not isinstance(body, Mapping):
        raise ParamError("body", "the request body must be a JSON object")
    params = {k: v for k, v in body.items() if v is not None}
    for key in params:
        if key in other_api_names:
            raise ParamError(key, f"is the OpenAI chat API's; the {api} API takes "
                             f"`{other_api_names[key]}`", code="unsupported_parameter")
        if key in refused:
            raise ParamError(key, f"is not supported by ortserve's {api} endpoint; remove it "
                             "(every parameter is honoured or refused, never ignored)",
                             code="unsupported_parameter")
    return params


def model_param(params: Mapping[str, Any]) -> str:
    """`model`: a non-empty string. Missing and mistyped are told apart (a client that sends
    `"model": 5` is told what it sent, not that it sent nothing)."""
    model = params.get("model")
    if model is None or model == "":
        raise ParamError("model", "required: the name of a model from /v1/models")
    if not isinstance(model, str):
        raise ParamError("model", f"{model!r} is not a string: send the name of a model from "
                         "/v1/models")
    return model
