"""A stored response's input items, as OpenAI lists them (gateway/apis/responses/input_items.py)."""

from __future__ import annotations

import pytest

from gateway.apis.responses.input_items import items_of, page
from gateway.request.param_error import ParamError


def test_a_string_input_is_one_user_message_with_an_id():
    [item] = items_of("Hi")
    assert item["type"] == "message" and item["role"] == "user"
    assert item["content"] == [{"type": "input_text", "text": "Hi"}]
    assert item["id"].startswith("msg_")


def test_items_keep_their_ids_and_get_one_when_they_came_without():
    items = items_of([
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "assistant", "content": "Sure.", "id": "msg_a"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "21C", "status": None}])
    assert [i["type"] for i in items] == ["message", "message", "function_call",
                                          "function_call_output"]
    assert items[1]["id"] == "msg_a"
    assert items[1]["content"] == [{"type": "output_text", "text": "Sure."}]
    assert items[2]["id"].startswith("fc_") and items[3]["id"].startswith("fco_")
    assert "status" not in items[3]  # a null is no value, as in the request
    assert len({i["id"] for i in items}) == 4


def test_pages_newest_first_by_default_with_after_before_and_limit():
    items = [{"id": f"i{n}", "type": "message"} for n in range(5)]
    first = page(items, {})
    assert [i["id"] for i in first["data"]] == ["i4", "i3", "i2", "i1", "i0"]
    assert (first["first_id"], first["last_id"], first["has_more"]) == ("i4", "i0", False)
    asc = page(items, {"order": "asc", "limit": "2"})
    assert [i["id"] for i in asc["data"]] == ["i0", "i1"] and asc["has_more"]
    after = page(items, {"order": "asc", "after": "i1", "limit": "2"})
    assert [i["id"] for i in after["data"]] == ["i2", "i3"] and after["has_more"]
    assert [i["id"] for i in page(items, {"before": "i1"})["data"]] == ["i4", "i3", "i2"]
    assert page([], {}) == {"object": "list", "data": [], "first_id": None, "last_id": None,
                            "has_more": False}


@pytest.mark.parametrize("query,param", [
    ({"order": "up"}, "order"), ({"limit": "0"}, "limit"), ({"limit": "101"}, "limit"),
    ({"limit": "x"}, "limit"), ({"after": "nope"}, "after"), ({"before": "nope"}, "before"),
    ({"include": "message.input_image.image_url"}, "include"), ({"ordr": "asc"}, "ordr"),
])
def test_a_bad_query_is_refused_naming_it(query, param):
    with pytest.raises(ParamError) as err:
        page([{"id": "i0"}], query)
    assert err.value.param == param and err.value.message.startswith(param + ":")
