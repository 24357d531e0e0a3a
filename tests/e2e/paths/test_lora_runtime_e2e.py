"""LoRA adapters at runtime through real processes (scheduler, worker, gateway) on the
per-row tiny base: an adapter loaded through Scheduler.LoadAdapter serves beside two
loaded at start and the base, 12 concurrent clients (ortserve's gRPC client with
`adapter`, and the openai client whose `model` names the adapter) each get their own adapter's greedy output; unloaded while
idle (ortserve unload-adapter) it is NOT_FOUND; the ledger's capacity moves by its bytes
both ways. The folder is
`make lora-demo`'s (the test skips without it)."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import onnxruntime as ort
import openai
import pytest
from ortserve_client import Client

from devtools.cluster import LocalCluster, stop_service
from ortserve.v1 import scheduler_pb2, types_pb2
from tests.e2e.conftest import BIN, reserved_bytes, scheduler_stub
from tests.e2e.gateway.test_gateway_e2e import start_gateway, wait_reserved_zero
from tests.models import prepared_model_dir

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

CAPACITY_BYTES = 8 * 2**20
AT_START = ("random0", "random1")
LATE = "mixed"  # made by the test: random0's A matrices with random1's B


@pytest.fixture(scope="module")
def lora_dir():
    path = prepared_model_dir("tiny-llama-lora-rows")
    if not (path / "lora-expected.json").is_file():
        pytest.skip(f"{path} has no lora-expected.json: run `make lora-demo`")
    return path


@pytest.fixture(scope="module")
def expected(lora_dir):
    return json.loads((lora_dir / "lora-expected.json").read_text())


@pytest.fixture(scope="module")
def late_adapter(lora_dir, tmp_path_factory) -> str:
    """A third adapter, distinct from both: random0's lora_A weights, random1's lora_B."""
    def params(name):
        adapter = ort.AdapterFormat.read_adapter(str(lora_dir / "adapters" / f"{name}.onnx_adapter"))
        return {k: v.numpy().copy() for k, v in adapter.get_parameters().items()}

    a, b = params("random0"), params("random1")
    out = ort.AdapterFormat()
    out.set_adapter_version(1)
    out.set_model_version(1)
    out.set_parameters({k: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(
        a[k] if ".lora_A." in k else b[k])) for k in a})
    path = tmp_path_factory.mktemp("late-adapter") / f"{LATE}.onnx_adapter"
    out.export_adapter(str(path))
    return str(path)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, lora_dir):
    flags = [arg for name in AT_START
             for arg in ("--lora", f"{name}={lora_dir / 'adapters' / f'{name}.onnx_adapter'}")]
    cluster = LocalCluster(model_dir=lora_dir, log_dir=tmp_path_factory.mktemp("logs-lora-rt"),
                           kv_capacities=[str(CAPACITY_BYTES)], worker_args=flags,
                           threads=1).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def gateway(cluster, tmp_path_factory):
    service = start_gateway(tmp_path_factory, cluster.address)
    yield service
    stop_service(service)


def budget(address: str) -> scheduler_pb2.WorkerBudget:
    (worker,) = scheduler_stub(address).GetBudget(scheduler_pb2.GetBudgetRequest(),
                                                  timeout=5).workers
    return worker


def grpc_generate(address: str, prompt: list[int], new: int, adapter: str) -> tuple[list[int], str]:
    request = types_pb2.GenerateRequest(token_ids=types_pb2.TokenIds(ids=prompt),
                                        max_new_tokens=new, min_new_tokens=new, adapter=adapter)
    ids, text = [], ""
    for event in scheduler_stub(address).Generate(request, timeout=120):
        if event.HasField("chunk"):
            ids.extend(event.chunk.token_ids)
            text += event.chunk.text
    return ids, text


def openai_text(gateway, model: str, prompt: list[int], new: int) -> str:
    client = openai.OpenAI(base_url=f"http://{gateway.address}/v1", api_key="unused",
                           timeout=120, max_retries=0)
    answer = client.completions.create(model=model, prompt=prompt, max_tokens=new,
                                       temperature=0, extra_body={"min_tokens": new})
    assert answer.model == model  # the adapter's name answers, as vLLM's does
    return answer.choices[0].text


@pytest.fixture(scope="module")
def loaded(cluster, late_adapter):
    """The late adapter loaded through the scheduler; the capacity before and after."""
    before = budget(cluster.address)
    with Client(cluster.address, timeout_s=60) as client:
        change = client.load_adapter(LATE, late_adapter, worker_id=before.worker_id)
    return before, change


def test_loading_at_runtime_takes_the_adapters_bytes_out_of_the_ledgers_capacity(cluster,
                                                                                loaded):
    before, change = loaded
    (late,) = [a for a in change.adapters if a.name == LATE]
    assert late.held_bytes > 0
    after = budget(cluster.address)
    assert after.capacity_bytes == before.capacity_bytes - late.held_bytes
    assert change.capacity_bytes == after.capacity_bytes
    assert sorted(a.name for a in after.adapters) == sorted([*AT_START, LATE])


def test_three_adapters_and_the_base_interleaved_by_12_clients_each_get_their_own(
        cluster, gateway, loaded, expected):
    new = expected["new_tokens"]
    prompts = expected["prompts"]
    names = ["", *AT_START, LATE]
    # One client at a time first: the late adapter's reference, every adapter's text.
    alone = {(name, i): grpc_generate(cluster.address, prompt, new, name)
             for name in names for i, prompt in enumerate(prompts)}
    for name in ("", *AT_START):
        for i in range(len(prompts)):
            assert alone[name, i][0] == expected[name or "base"][i], (name, i)
    assert alone[LATE, 0][0] not in (expected["base"][0], expected["random0"][0],
                                     expected["random1"][0])
    model = {"": "tiny-llama-lora-rows", **{n: n for n in names if n}}
    jobs = [(kind, name, i) for name in names
            for kind, i in (("grpc", 0), ("grpc", 1), ("openai", names.index(name) % 2))]
    assert len(jobs) == 12

    def run(job):
        kind, name, i = job
        if kind == "grpc":  # the project's Python client
            with Client(cluster.address, timeout_s=120) as client:
                return list(client.generate(prompts[i], adapter=name, max_new_tokens=new,
                                            min_new_tokens=new).token_ids)
        return openai_text(gateway, model[name], prompts[i], new)

    with ThreadPoolExecutor(len(jobs)) as pool:
        got = list(pool.map(run, jobs))
    for (kind, name, i), out in zip(jobs, got, strict=True):
        want = alone[name, i][0] if kind == "grpc" else alone[name, i][1]
        assert out == want, (kind, name, i)
    # A worker releases a lease after its stream's last event: the ledger empties soon after.
    assert wait_reserved_zero(cluster.address, timeout_s=60) == 0


def test_v1_models_lists_each_adapter_with_its_base_as_parent(gateway, loaded):
    client = openai.OpenAI(base_url=f"http://{gateway.address}/v1", api_key="unused")
    listed = {m.id: m for m in client.models.list().data}
    for name in (*AT_START, LATE):
        assert listed[name].parent == "tiny-llama-lora-rows"
    assert listed["tiny-llama-lora-rows"].parent is None


def test_the_responses_and_messages_apis_answer_under_the_adapter_named_as_model(cluster,
                                                                                gateway):
    client = openai.OpenAI(base_url=f"http://{gateway.address}/v1", api_key="unused",
                           timeout=120, max_retries=0)
    # store defaults to true: a Generate under the adapter, its prefix kept in the cache.
    answer = client.responses.create(model="random0", input="Hello", max_output_tokens=4)
    assert answer.model == "random0" and answer.status in ("completed", "incomplete")
    client.responses.delete(answer.id)  # its session's K/V goes with it (closed after)
    assert wait_reserved_zero(cluster.address, timeout_s=60) == 0
    request = urllib.request.Request(
        f"http://{gateway.address}/v1/messages", method="POST",
        headers={"content-type": "application/json"},
        data=json.dumps({"model": "random1", "max_tokens": 4,
                         "messages": [{"role": "user", "content": "Hello"}]}).encode())
    with urllib.request.urlopen(request, timeout=120) as reply:
        assert json.loads(reply.read())["model"] == "random1"


def test_an_idle_adapter_unloads_its_bytes_come_back_and_it_is_then_not_found(
        cluster, gateway, loaded):
    before, _ = loaded
    cli = subprocess.run([str(BIN / "ortserve"), "--address", cluster.address, "unload-adapter",
                          LATE, "--json"], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    change = json.loads(cli.stdout)
    assert change["unloaded"] == LATE and change["adapters"] == sorted(AT_START)
    after = budget(cluster.address)
    assert after.capacity_bytes == before.capacity_bytes == change["capacity_bytes"]
    assert sorted(a.name for a in after.adapters) == sorted(AT_START)
    with pytest.raises(grpc.RpcError) as error:
        grpc_generate(cluster.address, [1, 2, 3], 4, LATE)
    assert error.value.code() == grpc.StatusCode.NOT_FOUND
    assert "'random0', 'random1'" in error.value.details()
    with pytest.raises(openai.NotFoundError):
        openai_text(gateway, LATE, [1, 2, 3], 4)
    assert reserved_bytes(cluster.address) == 0
