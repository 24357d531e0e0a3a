"""LoRA adapters loaded on demand through real processes (a scheduler with an adapter
catalog, one worker on the per-row tiny base, no adapter loaded at start): a request naming
a catalogued adapter that no worker serves loads it on the worker, whose capacity in the
ledger moves by its bytes, and the answer is the adapter's own greedy output; where no worker
has the adapter's bytes free, the request is RESOURCE_EXHAUSTED (ADAPTER_NO_ROOM) with the
numbers, and the same request is served once they are free. The folder is `make
lora-demo`'s (the test skips without it)."""

from __future__ import annotations

import json
import socket
import urllib.request

import grpc
import pytest
from google.rpc import error_details_pb2
from prometheus_client.parser import text_string_to_metric_families

from devtools.cluster import LocalCluster
from ortserve.status import rich_status
from ortserve.v1 import scheduler_pb2, types_pb2
from tests.e2e.conftest import scheduler_stub
from tests.models import prepared_model_dir

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

BASE = "tiny-llama-lora-rows"
CAPACITY_BYTES = 8 * 2**20


@pytest.fixture(scope="module")
def lora_dir():
    path = prepared_model_dir(BASE)
    if not (path / "lora-expected.json").is_file():
        pytest.skip(f"{path} has no lora-expected.json: run `make lora-demo`")
    return path


@pytest.fixture(scope="module")
def expected(lora_dir):
    return json.loads((lora_dir / "lora-expected.json").read_text())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, lora_dir):
    catalog = tmp_path_factory.mktemp("catalog") / "adapters.toml"
    catalog.write_text("".join(
        f'[adapters.{name}]\nmodel = "{BASE}"\npath = "{lora_dir / "adapters" / f"{name}.onnx_adapter"}"\n'
        for name in ("random0", "random1")))
    metrics_port = free_port()
    cluster = LocalCluster(model_dir=lora_dir, log_dir=tmp_path_factory.mktemp("logs-lora-od"),
                           kv_capacities=[str(CAPACITY_BYTES)], threads=1,
                           scheduler_args=["--adapter-catalog", str(catalog), "--claim-ttl-s",
                                           "600", "--metrics-port", str(metrics_port)]).start()
    cluster.metrics_port = metrics_port
    yield cluster
    cluster.stop()


def budget(address: str) -> scheduler_pb2.WorkerBudget:
    (worker,) = scheduler_stub(address).GetBudget(scheduler_pb2.GetBudgetRequest(),
                                                  timeout=5).workers
    return worker


def generate(address: str, prompt: list[int], new: int, adapter: str) -> list[int]:
    request = types_pb2.GenerateRequest(token_ids=types_pb2.TokenIds(ids=prompt),
                                        max_new_tokens=new, min_new_tokens=new, adapter=adapter)
    return [i for event in scheduler_stub(address).Generate(request, timeout=120)
            if event.HasField("chunk") for i in event.chunk.token_ids]


def adapter_gauge(port: int) -> dict[tuple[str, str], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {(s.labels["worker_id"], s.labels["adapter"]): s.value
            for f in text_string_to_metric_families(text)
            if f.name == "ortserve_model_server_adapter_bytes" for s in f.samples}


def test_a_catalogued_adapter_loaded_nowhere_loads_charged_and_answers_as_itself(cluster,
                                                                                expected):
    before = budget(cluster.address)
    assert list(before.adapters) == [] and adapter_gauge(cluster.metrics_port) == {}
    new, prompt = expected["new_tokens"], expected["prompts"][0]
    assert generate(cluster.address, prompt, new, "random0") == expected["random0"][0]
    after = budget(cluster.address)
    (loaded,) = after.adapters
    assert loaded.name == "random0" and loaded.held_bytes > 0
    assert after.capacity_bytes == before.capacity_bytes - loaded.held_bytes
    assert adapter_gauge(cluster.metrics_port) == {(after.worker_id, "random0"): loaded.held_bytes}
    # Served now: the next request loads nothing more.
    assert generate(cluster.address, expected["prompts"][1], new, "random0") == expected["random0"][1]
    assert budget(cluster.address).capacity_bytes == after.capacity_bytes


def test_no_worker_with_room_is_adapter_no_room_with_numbers_then_it_loads(cluster, expected):
    stub = scheduler_stub(cluster.address)
    file_bytes = (prepared_model_dir(BASE) / "adapters" / "random1.onnx_adapter").stat().st_size
    held = []  # leases the test holds (Admit: the two-step path's), CAPPED to what fits
    while budget(cluster.address).available_bytes >= file_bytes:
        held.append(stub.Admit(scheduler_pb2.AdmitRequest(request=types_pb2.GenerateRequest(
            token_ids=types_pb2.TokenIds(ids=expected["prompts"][0]), max_new_tokens=2048 - len(expected["prompts"][0]),
            min_new_tokens=1, request_id=f"fill{len(held)}")), timeout=30))
        assert held[-1].decision in (types_pb2.ADMITTED, types_pb2.CAPPED)
        assert len(held) < 64
    free = budget(cluster.address).available_bytes
    with pytest.raises(grpc.RpcError) as error:
        generate(cluster.address, expected["prompts"][0], expected["new_tokens"], "random1")
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    info = rich_status.unpack(rich_status.details_of(error.value), error_details_pb2.ErrorInfo)
    assert info.reason == "ADAPTER_NO_ROOM"
    assert info.metadata["adapter"] == "random1"
    assert (int(info.metadata["adapter_bytes"]), int(info.metadata["largest_available_bytes"])) == (
        file_bytes, free)
    assert "random1" in error.value.details() and f"{free:,} bytes" in error.value.details()
    assert [a.name for a in budget(cluster.address).adapters] == ["random0"]  # nothing loaded
    for admission in held:
        stub.Release(scheduler_pb2.ReleaseRequest(lease_id=admission.lease_id,
                                                  lease_secret=admission.lease_secret), timeout=10)
    new = expected["new_tokens"]
    assert generate(cluster.address, expected["prompts"][1], new, "random1") == expected["random1"][1]
    assert sorted(a.name for a in budget(cluster.address).adapters) == ["random0", "random1"]
