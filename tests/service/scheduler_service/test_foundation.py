"""The protos compile for any language, and every server has health and reflection."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from ortserve.v1 import internal_pb2_grpc, scheduler_pb2
from scheduler_service.config import SchedulerConfig
from scheduler_service.server import build_server
from tests.aio_thread import LoopThread

ROOT = Path(__file__).resolve().parents[3]


def test_protos_compile_with_only_the_protos_include_path(tmp_path):
    protos = sorted(str(p) for p in (ROOT / "protos").rglob("*.proto"))
    out = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I", str(ROOT / "protos"),
         f"--descriptor_set_out={tmp_path / 'set.pb'}", "--include_imports", *protos],
        capture_output=True, text=True,
    )
    assert out.returncode == 0, out.stderr
    fds = descriptor_pb2.FileDescriptorSet.FromString((tmp_path / "set.pb").read_bytes())
    packages = {f.package for f in fds.file if f.name.startswith("ortserve/")}
    assert packages == {"ortserve.v1"}
    services = {s.name for f in fds.file for s in f.service if f.package == "ortserve.v1"}
    assert services == {"Scheduler", "SchedulerInternal", "Worker"}


def test_every_rpc_and_field_in_the_protos_has_a_comment(tmp_path):
    protos = sorted(str(p) for p in (ROOT / "protos").rglob("*.proto"))
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", str(ROOT / "protos"),
                    f"--descriptor_set_out={tmp_path / 'set.pb'}", "--include_source_info", *protos],
                   check=True)
    fds = descriptor_pb2.FileDescriptorSet.FromString((tmp_path / "set.pb").read_bytes())
    missing = []
    for f in fds.file:
        commented = {tuple(loc.path) for loc in f.source_code_info.location
                     if loc.leading_comments.strip()}
        for mi, message in enumerate(f.message_type):
            for fi, field in enumerate(message.field):
                if (4, mi, 2, fi) not in commented:
                    missing.append(f"{f.name}: {message.name}.{field.name}")
        for si, service in enumerate(f.service):
            for ri, rpc in enumerate(service.method):
                if (6, si, 2, ri) not in commented:
                    missing.append(f"{f.name}: {service.name}.{rpc.name}")
    assert missing == []


@pytest.fixture()
def scheduler():
    loop = LoopThread()
    running = loop.run(build_server(SchedulerConfig(port=0, internal_port=0)))
    yield running
    loop.run(running.stop(0))
    loop.close()


def test_server_has_health_check_and_watch_and_is_ready_only_with_a_worker(scheduler):
    SERVING, NOT_SERVING = (health_pb2.HealthCheckResponse.SERVING,
                            health_pb2.HealthCheckResponse.NOT_SERVING)
    with grpc.insecure_channel(f"127.0.0.1:{scheduler.port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        check = lambda service: health.Check(  # noqa: E731
            health_pb2.HealthCheckRequest(service=service), timeout=5).status
        assert check("") == SERVING  # alive
        assert check("ortserve.v1.Scheduler") == NOT_SERVING  # not ready: no worker
        watch = health.Watch(health_pb2.HealthCheckRequest(service="ortserve.v1.Scheduler"),
                             timeout=10)
        assert next(watch).status == NOT_SERVING
        internal = internal_pb2_grpc.SchedulerInternalStub(
            grpc.insecure_channel(f"127.0.0.1:{scheduler.internal_port}"))
        internal.RegisterWorker(scheduler_pb2.RegisterWorkerRequest(
            worker_id="w1", address="127.0.0.1:1", model="m", context_length=64,
            bytes_per_token=8, capacity_bytes=4096, block_tokens=1), timeout=5)
        assert next(watch).status == SERVING
        internal.Heartbeat(
            scheduler_pb2.HeartbeatRequest(worker_id="w1", draining=True), timeout=5)
        assert next(watch).status == NOT_SERVING  # its only worker drains
        watch.cancel()
        with pytest.raises(grpc.RpcError) as err:
            health.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=5)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_server_reflection_lists_the_services(scheduler):
    with grpc.insecure_channel(f"127.0.0.1:{scheduler.port}") as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                            timeout=5)
        names = {s.name for s in next(replies).list_services_response.service}
    assert {"ortserve.v1.Scheduler", "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection"} <= names
