"""End to end: client -> scheduler -> worker, real processes and the real model."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import grpc
import pytest
from ortserve_client import Client, ExceedsCapacity

from ortserve.v1 import types_pb2, worker_pb2
from scheduler_service.default_tokens import DEFAULT_TOKENS
from tests.e2e.conftest import (
    BIN,
    prompt_tokens,
    reserved_bytes,
    start_cluster,
    worker_held_bytes,
    worker_stub,
)

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

BPT = 46_080  # SmolLM2-135M fp32: 2 x 30 layers x 3 kv heads x 64 dims x 4 bytes
FRANCE = "What is the capital of France? Answer in one sentence."
ESSAY = "Write a long, detailed essay about the history of the Roman Empire, from its founding to its fall."
CAP_ROOM_TOKENS = 120


def run_cli(address: str, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "ortserve"), "--address", address, *args],
                          capture_output=True, text=True, timeout=timeout_s)


def test_a_request_that_fits_is_admitted_streams_and_answers(roomy):
    with Client(roomy.address, timeout_s=120) as client:
        stream = client.stream(chat=[("user", FRANCE)], max_new_tokens=32)
        kinds = []
        for _chunk in stream:
            kinds.append("chunk" if stream.admission else "chunk-before-admission")
        result = stream.result
    assert stream.admission.decision == "ADMITTED" and stream.admission.budget_cap is None
    assert kinds and set(kinds) == {"chunk"}
    assert "Paris" in result.text
    assert result.finish_reason in ("EOS", "LENGTH")
    assert result.usage.generated_tokens == len(result.token_ids)
    assert result.execution_provider == "CPUExecutionProvider"
    assert result.timings.ttft_ms > 0 and result.timings.decode_tokens_per_s > 0
    assert reserved_bytes(roomy.address) == 0


def test_the_incident_unset_max_new_tokens_is_capped_before_the_first_token(tmp_path_factory):
    n_prompt = prompt_tokens(ESSAY)
    budget = (n_prompt + CAP_ROOM_TOKENS) * BPT
    cluster = start_cluster(tmp_path_factory, "incident", kv_capacities=[str(budget)])
    try:
        block = worker_stub(cluster.worker_services[0].address).Info(
            worker_pb2.InfoRequest(), timeout=5).block_tokens
        # The ledger charges whole blocks: the cap is what whole blocks of the budget hold.
        room = (n_prompt + CAP_ROOM_TOKENS) // block * block - n_prompt
        assert CAP_ROOM_TOKENS - block < room <= CAP_ROOM_TOKENS
        with Client(cluster.address, timeout_s=120) as client:
            seen_before_first_chunk = []
            stream = client.stream(ESSAY, on_admission=seen_before_first_chunk.append)
            chunks = list(stream)
        adm = seen_before_first_chunk[0]
        assert adm.decision == "CAPPED" and chunks
        cap = adm.budget_cap
        assert cap.requested_was_unset
        # Unset asks for the scheduler's default (--default-max-new-tokens), not the window.
        assert cap.requested_max_new_tokens == DEFAULT_TOKENS < 8192 - n_prompt
        assert cap.requested_source == "server_default"
        assert adm.max_new_tokens_source == "server_default"
        assert cap.admitted_max_new_tokens == room
        assert cap.bytes_per_token == BPT and cap.capacity_bytes == budget == cap.available_bytes
        assert cap.admitted_bytes == (n_prompt + room) * BPT <= budget
        assert cap.requested_bytes == -(-(n_prompt + DEFAULT_TOKENS) // block) * block * BPT
        result = stream.result
        assert result.finish_reason == "LENGTH"
        assert result.budget_cap == cap  # repeated in the final event
        assert result.usage.generated_tokens == room

        # The CLI: text only on stdout, the cap on stderr; --json carries the cap.
        plain = run_cli(cluster.address, "generate", ESSAY, "--stats")
        assert plain.returncode == 0, plain.stderr
        assert "CAPPED" in plain.stderr and f"-> {room}" in plain.stderr
        assert "ortserve:" not in plain.stdout and "CAPPED" not in plain.stdout
        assert plain.stdout.strip() and "budget_cap requested=" in plain.stderr
        as_json = run_cli(cluster.address, "generate", ESSAY, "--json")
        assert as_json.returncode == 0, as_json.stderr
        doc = json.loads(as_json.stdout)
        assert doc["budget_cap"]["admitted_max_new_tokens"] == room
        assert doc["finish_reason"] == "LENGTH" and "CAPPED" in as_json.stderr

        # Strict cap policy: the same request is rejected, with the numbers.
        with Client(cluster.address, timeout_s=60) as client, pytest.raises(ExceedsCapacity) as err:
            client.generate(ESSAY, strict=True)
        assert err.value.cap_refused and err.value.admissible_max_new_tokens == room
        assert err.value.capacity_bytes == budget
        strict = run_cli(cluster.address, "generate", ESSAY, "--strict")
        assert strict.returncode == 3 and strict.stdout == ""
        assert "--kv-capacity" in strict.stderr
        assert reserved_bytes(cluster.address) == 0
    finally:
        cluster.stop()


def test_two_concurrent_requests_never_exceed_one_budget_and_end_at_zero(tmp_path_factory):
    budget = 600 * BPT
    cluster = start_cluster(tmp_path_factory, "pair", kv_capacities=[str(budget)])
    try:
        peaks: list[int] = []
        stop = threading.Event()

        def watch():
            while not stop.is_set():
                peaks.append(reserved_bytes(cluster.address))
                time.sleep(0.02)

        results = {}

        def one(name):
            with Client(cluster.address, timeout_s=120) as client:
                results[name] = client.generate(ESSAY, max_new_tokens=400)

        watcher = threading.Thread(target=watch)
        watcher.start()
        threads = [threading.Thread(target=one, args=(n,)) for n in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stop.set()
        watcher.join()
        assert max(peaks) <= budget
        assert {r.admission.decision for r in results.values()} <= {"ADMITTED", "CAPPED"}
        assert any(r.budget_cap for r in results.values())  # 2 x 400+ tokens cannot both fit whole
        assert reserved_bytes(cluster.address) == 0
        assert worker_held_bytes(cluster.worker_services[0].address) == 0
    finally:
        cluster.stop()


def test_killing_the_client_mid_stream_frees_the_lease_and_the_buffer(roomy):
    cli = subprocess.Popen([str(BIN / "ortserve"), "--address", roomy.address, "generate", ESSAY,
                            "--max-new-tokens", "2000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert cli.stdout.read(8)  # tokens are flowing
    assert reserved_bytes(roomy.address) > 0
    assert worker_held_bytes(roomy.worker_services[0].address) > 0
    cli.kill()
    cli.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (reserved_bytes(roomy.address)
                                           or worker_held_bytes(roomy.worker_services[0].address)):
        time.sleep(0.05)
    assert reserved_bytes(roomy.address) == 0
    assert worker_held_bytes(roomy.worker_services[0].address) == 0


def test_the_worker_refuses_a_request_without_a_live_lease(roomy):
    stub = worker_stub(roomy.worker_services[0].address)
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Generate(worker_pb2.WorkerGenerateRequest(
            lease_id="forged", request=types_pb2.GenerateRequest(text="hi", max_new_tokens=4)), timeout=10))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND  # LEASE_NOT_FOUND, as on the scheduler
    assert "admitted" in err.value.details()


def test_info_reports_what_was_resolved(roomy):
    info = worker_stub(roomy.worker_services[0].address).Info(worker_pb2.InfoRequest(), timeout=5)
    assert info.requested_device == "cpu" and info.device == "cpu"
    assert info.execution_provider == "CPUExecutionProvider"
    assert info.bytes_per_token == BPT and info.context_length == 8192
    assert info.capacity_bytes == 512 * 2**20
    assert info.kv_layout == "arena" and info.max_batch_rows >= 8 and info.block_tokens == 16
    # ORT's own placement: every node on the CPU provider, and there are nodes.
    assert set(info.nodes_by_provider) == {"CPUExecutionProvider"}
    assert info.nodes_by_provider["CPUExecutionProvider"] > 30


def test_a_bad_sampling_parameter_is_rejected_naming_the_field(roomy):
    # Out of range: the CLI refuses it before any call (usage error).
    result = run_cli(roomy.address, "generate", FRANCE, "--top-p", "1.5", "--temperature", "0.7")
    assert result.returncode == 2 and result.stdout == "" and "--top-p" in result.stderr
    # In range but meaningless (greedy decoding has no use for top_p): the server refuses it.
    result = run_cli(roomy.address, "generate", FRANCE, "--top-p", "0.5")
    assert result.returncode == 4 and result.stdout == ""
    assert "top_p" in result.stderr
    assert reserved_bytes(roomy.address) == 0



def test_ortserve_info_says_what_the_cluster_runs(roomy):
    from importlib import metadata

    version = metadata.version("ortserve")
    text = run_cli(roomy.address, "info")
    assert text.returncode == 0, text.stderr
    assert f"scheduler  {roomy.address}  ortserve {version}" in text.stdout
    assert "model smollm2-135m-instruct-fp32" in text.stdout and "device cpu" in text.stdout
    doc = json.loads(run_cli(roomy.address, "info", "--json").stdout)
    [worker] = doc["workers"]
    assert doc["scheduler"]["version"] == worker["version"] == version
    assert worker["execution_provider"] == "CPUExecutionProvider"
    assert worker["capacity_bytes"] == 512 * 2**20


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
