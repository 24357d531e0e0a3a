"""chat_template_kwargs reach the template; a variable it does not read is accepted and
named (as vLLM and SGLang accept it), one ortserve sets itself or a required one it does
not read is refused."""

from __future__ import annotations

import pytest

from ortserve.rules import request_rules
from ortserve.status.errors import InvalidField
from worker_service.core.chat_template import ChatTemplate

SOURCE = ("{% for m in messages %}{{ m['content'] }}{% endfor %}"
          "{% if enable_thinking is defined and enable_thinking is false %}<think></think>"
          "{% else %}<think>{% endif %}")


def test_a_variable_the_template_reads_changes_the_prompt():
    template = ChatTemplate(SOURCE, {"eos_token": "</s>"})
    assert template.render([("user", "hi")]) == "hi<think>"
    assert template.render([("user", "hi")], kwargs={"enable_thinking": False}) == \
        "hi<think></think>"
    assert template.reasoning_format == "think"


@pytest.mark.parametrize("name, words", [("messages", "set by ortserve"),
                                         ("add_generation_prompt", "set by ortserve"),
                                         ("eos_token", "set by ortserve")])
def test_a_variable_that_ortserve_sets_is_refused(name, words):
    template = ChatTemplate(SOURCE, {"eos_token": "</s>"})
    with pytest.raises(InvalidField) as info:
        template.render([("user", "hi")], kwargs={name: 1})
    assert info.value.field == f"chat.template_kwargs_json.{name}" and words in str(info.value)


def test_a_variable_it_does_not_read_is_accepted_and_named():
    # Fleets send {"enable_thinking": false} to every model; a template without the switch
    # renders as it would without it, and the names it ignored are said.
    template = ChatTemplate("{% for m in messages %}{{ m['content'] }}{% endfor %}", {})
    kwargs = {"enable_thinking": False, "budget": 1}
    assert template.render([("user", "hi")], kwargs=kwargs) == template.render([("user", "hi")])
    assert template.check_kwargs(kwargs) == ["budget", "enable_thinking"]
    assert ChatTemplate(SOURCE, {}).check_kwargs({"enable_thinking": False}) == []


def test_a_required_variable_it_does_not_read_is_refused():
    # An API parameter carried as a variable (reasoning_effort) is honoured or refused.
    template = ChatTemplate(SOURCE, {"eos_token": "</s>"})
    with pytest.raises(InvalidField) as info:
        template.render([("user", "hi")], kwargs={"reasoning_effort": "low"},
                        required=["reasoning_effort"])
    assert info.value.field == "chat.template_kwargs_json.reasoning_effort"
    assert "does not read 'reasoning_effort'" in str(info.value)
    # Read, a required variable renders as any other.
    assert template.render([("user", "hi")], kwargs={"enable_thinking": False},
                           required=["enable_thinking"]) == "hi<think></think>"


@pytest.mark.parametrize("text, ok", [("", True), ('{"a": 1}', True), ("[1]", False),
                                      ("{bad", False)])
def test_the_kwargs_are_a_json_object(text, ok):
    if ok:
        request_rules.template_kwargs(text)
    else:
        with pytest.raises(InvalidField, match="chat.template_kwargs_json"):
            request_rules.template_kwargs(text)


def test_the_fallback_tools_section_joins_the_first_user_turn_without_a_system_role():
    gemma = ("{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role "
             "not supported') }}{% endif %}{{ '<start_of_turn>' + m.role + '\\n' + m.content + "
             "'<end_of_turn>\\n' }}{% endfor %}")
    tools = [{"type": "function", "function": {"name": "f", "description": "", "parameters": {}}}]
    text = ChatTemplate(gemma, {}).render([("user", "hi")], tools)
    assert text.startswith("<start_of_turn>user\n") and "<tools>" in text and "hi" in text
    with pytest.raises(InvalidField, match="System role"):
        ChatTemplate(gemma, {}).render([("system", "be brief"), ("user", "hi")])
