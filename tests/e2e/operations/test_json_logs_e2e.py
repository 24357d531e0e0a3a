"""With --log-json, every line a service writes is one JSON object: gRPC's own C-core lines
(a failed TLS handshake per bad client) on stderr and the start-up banner on stdout included
(a collector reads one JSON object a line). Real processes, real TLS, real bad clients."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import grpc
import pytest

from ortserve.process import banner
from ortserve.rpc.tls import channel_credentials
from ortserve.v1 import internal_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from tests.certs import make_certs
from tests.e2e.conftest import BIN

pytestmark = [pytest.mark.e2e]


def json_lines(text: str) -> list[dict]:
    """Every non-empty line as a JSON object; fails naming the first line that is not one."""
    records = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            pytest.fail(f"a line that is not JSON: {line!r}")
        assert isinstance(record, dict), line
        records.append(record)
    return records


def start(argv: list[str]) -> tuple[subprocess.Popen, str, banner.Banner]:
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               stdin=subprocess.DEVNULL)
    line = process.stdout.readline()
    announced = banner.parse(line)
    if announced is None:
        process.kill()
        pytest.fail(f"no banner: {line!r} {process.communicate()[1][-2000:]}")
    return process, line, announced


def stop(process: subprocess.Popen, codes: tuple[int, ...] = (0,)) -> tuple[str, str]:
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode in codes, err[-2000:]
    return out, err


def bad_clients(public: str, internal: str, certs) -> None:
    """A plaintext client on both ports, a client certificate from a CA nobody trusts, and
    an HTTP/1 request: each fails its TLS handshake on the scheduler's side."""
    for address in (public, internal):
        with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError):
            scheduler_pb2_grpc.SchedulerStub(channel).GetBudget(
                scheduler_pb2.GetBudgetRequest(), timeout=5)
    rogue = channel_credentials(certs.ca, certs.rogue_worker.cert, certs.rogue_worker.key)
    port = internal.rsplit(":", 1)[1]
    with (grpc.secure_channel(f"localhost:{port}", rogue) as channel,
          pytest.raises(grpc.RpcError)):
        internal_pb2_grpc.SchedulerInternalStub(channel).Heartbeat(
            scheduler_pb2.HeartbeatRequest(worker_id="rogue"), timeout=5)
    host, public_port = public.rsplit(":", 1)
    with socket.create_connection((host, int(public_port)), timeout=5) as raw:
        raw.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        raw.recv(100)


def test_a_tls_scheduler_hit_by_bad_clients_writes_only_json(tmp_path):
    certs = make_certs(tmp_path / "certs")
    process, line, announced = start([
        str(BIN / "ortserve-scheduler"), "--host", "127.0.0.1", "--port", "0",
        "--internal-port", "0", "--log-json", "--tls-cert", certs.scheduler.cert,
        "--tls-key", certs.scheduler.key, "--tls-ca", certs.ca])
    try:
        assert json.loads(line)["event"] == "listening" and announced.internal_address
        bad_clients(announced.address, announced.internal_address, certs)
        time.sleep(0.5)  # the server logs each failed handshake on its own thread
    finally:
        out, err = stop(process)
    assert json_lines(out) == []  # the banner was all; nothing plain after it
    records = json_lines(err)
    core = [r for r in records if r.get("logger") == "grpc-core"]
    # gRPC's own lines are there (not silenced), each one JSON object with its level.
    assert len(core) >= 3 and all("Handshake failed" in r["event"] for r in core), records
    assert {r["level"] for r in core} <= {"info", "warning", "error", "critical"}
    assert any(r["event"] == "scheduler serving" for r in records)


def test_the_gateways_banner_and_logs_are_json_with_log_json():
    process, line, announced = start([str(BIN / "ortserve-gateway"), "--host", "127.0.0.1",
                                      "--port", "0", "--scheduler", "127.0.0.1:1", "--log-json"])
    record = json.loads(line)
    assert (record["event"], record["logger"]) == ("listening", "gateway")
    assert announced.address == record["address"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # serving (uvicorn's SIGTERM handler installed)
        try:
            urllib.request.urlopen(f"http://{announced.address}/health", timeout=2)
            break
        except urllib.error.HTTPError:
            break  # 503: no scheduler there, as expected
        except OSError:
            time.sleep(0.1)
    # uvicorn re-raises the SIGTERM it caught once it has shut down: -15 is its clean exit.
    out, err = stop(process, codes=(0, -signal.SIGTERM))
    assert out == ""
    json_lines(err)
