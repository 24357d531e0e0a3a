"""End to end with the openai client: tool calls in Llama 3.1's JSON and Mistral's
[TOOL_CALLS] formats, each chosen from the model folder's chat template, enforced by
its grammar under tool_choice required / named and parsed back into tool_calls.

The models are the tiny random one in folders made here, with templates in each
family's shape (they read `tools` and name the family's markers). A random model
writes whatever the grammar allows, so a parsed call proves the grammar and the
parser agree on the format the template asked for.
"""

from __future__ import annotations

import json

import pytest

from devtools.cluster import LocalCluster, model_cache, stop_service
from ortserve.v1 import types_pb2
from tests.e2e.conftest import scheduler_stub
from tests.e2e.gateway.test_gateway_e2e import openai_client, start_gateway

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

LLAMA_TEMPLATE = (
    "{{ '<|begin_of_text|>' }}{% if tools %}{{ '<|start_header_id|>system<|end_header_id|>\\n\\n"
    "Respond with a JSON for a function call: {\"name\": function name, \"parameters\": "
    "dictionary of argument name and its value}.\\n' }}{% for t in tools %}{{ t | tojson }}"
    "{% endfor %}{{ '<|eot_id|>' }}{% endif %}"
    "{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' }}"
    "{% if m.tool_calls %}{{ '<|python_tag|>' }}{% for c in m.tool_calls %}"
    "{{ '{\"name\": \"' + c.function.name + '\", \"parameters\": ' + (c.function.arguments | tojson)"
    " + '}' }}{% endfor %}{% else %}{{ m['content'] }}{% endif %}{{ '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}")
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% if tools %}{{ '[AVAILABLE_TOOLS] ' + (tools | tojson) + '[/AVAILABLE_TOOLS]' }}"
    "{% endif %}{% for m in messages %}{% if m['role'] == 'user' %}"
    "{{ '[INST] ' + m['content'] + '[/INST]' }}{% elif m.tool_calls %}{{ '[TOOL_CALLS] ' }}"
    "{{ m.tool_calls | tojson }}{{ eos_token }}{% else %}{{ m['content'] + eos_token }}{% endif %}"
    "{% endfor %}")
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "now", "parameters": {
        "type": "object", "properties": {}, "additionalProperties": False}}},
]
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


def folder(tmp_path_factory, name: str, template: str):
    tiny = model_cache() / "models" / "tiny-llama"
    if not (tiny / "genai_config.json").exists():
        pytest.fail(f"the tiny model is not prepared at {tiny}: run `make tiny-model`")
    path = tmp_path_factory.mktemp("models") / name
    path.mkdir()
    for item in ("genai_config.json", "model.onnx", "model.onnx.data", "tokenizer.json",
                 "tokenizer_config.json"):
        (path / item).symlink_to(tiny / item)
    (path / "chat_template.jinja").write_text(template)
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    llama = folder(tmp_path_factory, "tiny-llama31", LLAMA_TEMPLATE)
    mistral = folder(tmp_path_factory, "tiny-mistral", MISTRAL_TEMPLATE)
    cluster = LocalCluster(model_dir=llama, model_dirs=[llama, mistral], workers=2, threads=1,
                           kv_capacities=["8MiB", "8MiB"],
                           log_dir=tmp_path_factory.mktemp("logs-tool-formats")).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def gateway(cluster, tmp_path_factory):
    service = start_gateway(tmp_path_factory, cluster.address)
    yield service
    stop_service(service)


def call(gateway, model, **kw):
    return openai_client(gateway).chat.completions.create(
        model=model, messages=MESSAGES, tools=TOOLS, temperature=0, max_tokens=80, **kw)


@pytest.mark.parametrize("model, fmt", [("tiny-llama31", "llama3_json"),
                                        ("tiny-mistral", "mistral")])
def test_required_makes_a_call_in_the_templates_format(gateway, model, fmt):
    raw = openai_client(gateway).chat.completions.with_raw_response.create(
        model=model, messages=MESSAGES, tools=TOOLS, temperature=0, max_tokens=80,
        tool_choice="required", parallel_tool_calls=False)
    answer = raw.parse()
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    [tool_call] = choice.message.tool_calls
    assert tool_call.function.name in ("get_weather", "now")
    arguments = json.loads(tool_call.function.arguments)
    if tool_call.function.name == "get_weather":
        assert isinstance(arguments["city"], str) and set(arguments) == {"city"}
    else:
        assert arguments == {}
    assert answer.model_extra["ortserve"]["finished"]["constraint"]["satisfied"]
    assert answer.model_extra["ortserve"]["tool_call_format"] == fmt


@pytest.mark.parametrize("model", ["tiny-llama31", "tiny-mistral"])
def test_a_named_function_is_called_and_streams_as_deltas(gateway, model):
    named = {"type": "function", "function": {"name": "get_weather"}}
    answer = call(gateway, model, tool_choice=named)
    [tool_call] = answer.choices[0].message.tool_calls
    assert tool_call.function.name == "get_weather"
    assert set(json.loads(tool_call.function.arguments)) == {"city"}
    chunks = list(call(gateway, model, tool_choice=named, stream=True))
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].function.name == "get_weather" and deltas[0].id.startswith("call_")
    streamed = "".join(d.function.arguments or "" for d in deltas)
    assert json.loads(streamed) == json.loads(tool_call.function.arguments)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_call_round_trip_renders_in_the_templates_format(gateway):
    first = call(gateway, "tiny-llama31", tool_choice="required", parallel_tool_calls=False)
    message = first.choices[0].message
    tool_call = message.tool_calls[0]
    follow = openai_client(gateway).chat.completions.create(
        model="tiny-llama31", temperature=0, max_tokens=4, tools=TOOLS,
        messages=[*MESSAGES, message.model_dump(exclude_none=True),
                  {"role": "tool", "tool_call_id": tool_call.id, "content": '{"temp": 21}'}])
    assert follow.usage.prompt_tokens > first.usage.prompt_tokens


@pytest.mark.parametrize("model, start", [("tiny-llama31", '{"name": "'),
                                          ("tiny-mistral", '[TOOL_CALLS] [{"name": "')])
def test_the_raw_output_is_in_the_templates_format(cluster, model, start):
    # Over gRPC, the text as generated: the worker enforced the template's format.
    request = types_pb2.GenerateRequest(
        model=model, max_new_tokens=80, constraint=types_pb2.Constraint(
            tool_call=types_pb2.ToolCallConstraint()),
        chat=types_pb2.ChatMessages(
            messages=[types_pb2.ChatMessage(role="user", content=MESSAGES[0]["content"])],
            tools=[types_pb2.Tool(name=t["function"]["name"],
                                  parameters_json=json.dumps(t["function"]["parameters"]))
                   for t in TOOLS]))
    events = list(scheduler_stub(cluster.address).Generate(request, timeout=120))
    assert events[0].admission.tool_call_format == {"tiny-llama31": "llama3_json",
                                                    "tiny-mistral": "mistral"}[model]
    text = "".join(e.chunk.text for e in events if e.WhichOneof("event") == "chunk")
    assert text.startswith(start), text
