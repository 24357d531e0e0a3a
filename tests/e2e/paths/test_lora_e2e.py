"""LoRA adapters through real processes: a worker started with --lora serves each adapter
by name (GenerateRequest.adapter), greedy tokens equal to transformers + peft, an unknown
adapter is NOT_FOUND naming the served ones, and the ledger's capacity is the KV capacity
less the adapters' bytes. The folder is `make lora-demo`'s."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from devtools.cluster import LocalCluster
from ortserve.v1 import scheduler_pb2, types_pb2
from tests.e2e.conftest import scheduler_stub
from tests.e2e.gateway.test_gateway_e2e import wait_reserved_zero
from tests.models import prepared_model_dir

CAPACITY_BYTES = 8 * 2**20
ADAPTERS = ("random0", "random1")


@pytest.fixture(scope="module", params=["tiny-llama-lora", "tiny-llama-lora-rows"])
def lora_dir(request):
    path = prepared_model_dir(request.param)
    if not (path / "lora-expected.json").is_file():
        pytest.skip(f"{path} has no lora-expected.json: run `make lora-demo`")
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, lora_dir):
    flags = [arg for name in ADAPTERS
             for arg in ("--lora", f"{name}={lora_dir / 'adapters' / f'{name}.onnx_adapter'}")]
    cluster = LocalCluster(model_dir=lora_dir, log_dir=tmp_path_factory.mktemp("logs-lora"),
                           kv_capacities=[str(CAPACITY_BYTES)], worker_args=flags,
                           threads=1).start()
    yield cluster
    cluster.stop()


def generate(address: str, prompt: list[int], new: int, adapter: str) -> list[int]:
    request = types_pb2.GenerateRequest(token_ids=types_pb2.TokenIds(ids=prompt),
                                        max_new_tokens=new, min_new_tokens=new, adapter=adapter)
    ids: list[int] = []
    for event in scheduler_stub(address).Generate(request, timeout=120):
        if event.HasField("chunk"):
            ids.extend(event.chunk.token_ids)
    return ids


def test_concurrent_requests_of_each_adapter_get_their_own_tokens(cluster, lora_dir):
    expected = json.loads((lora_dir / "lora-expected.json").read_text())
    new = expected["new_tokens"]
    jobs = [(name, i, prompt) for _ in range(2) for name in ("", *ADAPTERS)
            for i, prompt in enumerate(expected["prompts"])]
    with ThreadPoolExecutor(len(jobs)) as pool:
        got = list(pool.map(lambda job: generate(cluster.address, job[2], new, job[0]), jobs))
    for (name, i, _), tokens in zip(jobs, got, strict=True):
        assert tokens == expected[name or "base"][i], (name, i)


def test_an_unknown_adapter_is_not_found_naming_the_served(cluster):
    with pytest.raises(grpc.RpcError) as error:
        generate(cluster.address, [1, 2, 3], 4, "nope")
    assert error.value.code() == grpc.StatusCode.NOT_FOUND
    assert "'random0', 'random1'" in error.value.details()
    # Refused before anything was reserved (the earlier test's leases may still be returning).
    assert wait_reserved_zero(cluster.address, timeout_s=60) == 0


def test_the_ledger_capacity_is_the_kv_capacity_less_the_adapters(cluster, lora_dir):
    report = json.loads((lora_dir / "lora.json").read_text())
    adapter_bytes = sum(report["adapters"][name]["bytes"] for name in ADAPTERS)
    budget = scheduler_stub(cluster.address).GetBudget(scheduler_pb2.GetBudgetRequest(),
                                                       timeout=5)
    assert budget.total_capacity_bytes == CAPACITY_BYTES - adapter_bytes
