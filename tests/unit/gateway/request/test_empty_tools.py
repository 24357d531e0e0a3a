"""`tools: []` is no tools on all three APIs, as OpenAI's Responses API and vLLM take it
(the OpenAI Agents SDK sends it for every agent without tools, langchain-anthropic with
none bound); a tool_choice that needs a tool, with none offered, stays a 400 naming it."""

from __future__ import annotations

import pytest

from gateway.apis.messages import request as am
from gateway.apis.responses import request as orr
from gateway.request.param_error import ParamError
from gateway.request.translate import parse_request

MESSAGES = [{"role": "user", "content": "Hi"}]


def parsed(api: str, **body):
    if api == "chat":
        return parse_request("chat", {"model": "m", "messages": MESSAGES, **body})
    if api == "responses":
        return orr.parse({"model": "m", "input": "Hi", **body}).chat([])
    return am.parse({"model": "m", "max_tokens": 9, "messages": MESSAGES, **body})[0]


# Each API's "offer nothing", "let the model choose" and "must call" in its own words.
CHOICES = {
    "chat": (None, "none", "auto"),
    "responses": (None, "none", "auto"),
    "messages": (None, {"type": "none"}, {"type": "auto"}),
}
NEEDS_A_TOOL = {
    "chat": ("required", {"type": "function", "function": {"name": "f"}}),
    "responses": ("required", {"type": "function", "name": "f"}),
    "messages": ({"type": "any"}, {"type": "tool", "name": "f"}),
}


@pytest.mark.parametrize("api", sorted(CHOICES))
def test_an_empty_tools_list_is_no_tools(api):
    for choice in CHOICES[api]:
        body = {"tools": []} if choice is None else {"tools": [], "tool_choice": choice}
        request = parsed(api, **body)
        assert not request.tool_calls, (api, choice)
        assert not request.generate.chat.tools
        assert not request.generate.HasField("constraint")
        # The same request as one without the key.
        bare = parsed(api) if choice is None else parsed(api, tool_choice=choice)
        assert request.generate == bare.generate


@pytest.mark.parametrize("api", sorted(NEEDS_A_TOOL))
def test_a_tool_choice_that_needs_a_tool_with_none_offered_is_refused_naming_it(api):
    for choice in NEEDS_A_TOOL[api]:
        with pytest.raises(ParamError) as err:
            parsed(api, tools=[], tool_choice=choice)
        assert err.value.param == "tool_choice", (api, choice)
        assert "offers none" in err.value.message
