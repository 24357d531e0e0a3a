"""The families the onnxruntime-genai builder converts (Llama, Qwen2, Qwen3, Mistral,
Phi-3, Gemma), each as a random-weight folder of a small shape made here (no downloads:
model_tools/families.py in .venv-tools), converted with `prepare --from-hf`, and served
behind one scheduler and the gateway: each answers a chat in its own template and calls
a tool in its template's format, enforced by the grammar and parsed back.
"""

from __future__ import annotations

import json

import pytest

from devtools.cluster import LocalCluster, model_cache, stop_service
from ortserve.v1 import types_pb2
from tests.e2e.conftest import scheduler_stub
from tests.e2e.gateway.test_gateway_e2e import openai_client, start_gateway
from tests.model.test_parity import TINY_TIMEOUT_S, prepare, run_tools

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

# family -> (the tool-call format its template asks for, its reasoning family)
FAMILIES = {"llama": ("llama3_json", ""), "qwen2": ("hermes", ""), "qwen3": ("hermes", "think"),
            "mistral": ("mistral", ""), "phi3": ("hermes", ""), "gemma": ("hermes", "")}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"], "additionalProperties": False}}}]
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    tokenizer = model_cache().expanduser() / "hf" / "smollm2-tokenizer"
    if not (tokenizer / "tokenizer.json").is_file():
        pytest.fail(f"{tokenizer} is missing: run `make tiny-model`")
    hf, cache = tmp_path_factory.mktemp("hf"), tmp_path_factory.mktemp("cache")
    made = run_tools("-m", "model_tools.families", str(tokenizer), str(hf), *FAMILIES,
                     timeout_s=TINY_TIMEOUT_S)
    assert made.returncode == 0, made.stderr[-4000:]
    out = {}
    for family in FAMILIES:
        result = prepare("--cache-dir", str(cache), "--from-hf", str(hf / f"tiny-{family}"),
                         "--name", f"tiny-{family}", timeout_s=TINY_TIMEOUT_S)
        assert result.returncode == 0, f"{family}: {result.stderr[-4000:]}"
        out[family] = cache / "models" / f"tiny-{family}"
    return out


@pytest.fixture(scope="module")
def cluster(folders, tmp_path_factory):
    dirs = list(folders.values())
    cluster = LocalCluster(model_dir=dirs[0], model_dirs=dirs, workers=len(dirs), threads=1,
                           kv_capacities=["8MiB"] * len(dirs),
                           log_dir=tmp_path_factory.mktemp("logs-families")).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def gateway(cluster, tmp_path_factory):
    service = start_gateway(tmp_path_factory, cluster.address)
    yield service
    stop_service(service)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_answers_a_chat_in_its_own_template(cluster, gateway, family):
    model = f"tiny-{family}"
    answer = openai_client(gateway).chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=4, temperature=0,
        extra_body={"min_tokens": 4})
    assert answer.model == model and answer.usage.completion_tokens == 4
    events = list(scheduler_stub(cluster.address).Generate(types_pb2.GenerateRequest(
        model=model, max_new_tokens=1, chat=types_pb2.ChatMessages(messages=[
            types_pb2.ChatMessage(role="user", content=MESSAGES[0]["content"])])), timeout=120))
    admission = events[0].admission
    assert (admission.tool_call_format, admission.reasoning_format) == FAMILIES[family]
    assert admission.prompt_tokens == answer.usage.prompt_tokens


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_calls_a_tool_in_its_templates_format(gateway, family):
    answer = openai_client(gateway).chat.completions.create(
        model=f"tiny-{family}", messages=MESSAGES, tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, max_tokens=60, temperature=0)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert set(json.loads(call.function.arguments)) == {"city"}
