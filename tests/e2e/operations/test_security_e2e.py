"""A cluster with TLS on every channel and API keys, as processes: grpcurl, Python and Node generate.

docs/operations/security.md's grpcurl lines run as written (only the port
is changed), in the folder that holds ca.pem, with ORTSERVE_API_KEY set.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request

import grpc
import openai
import pytest
from ortserve_client import Client

from devtools.cluster import LocalCluster, start_service, stop_service
from ortserve.v1 import scheduler_pb2, worker_pb2, worker_pb2_grpc
from tests.certs import make_certs
from tests.e2e.conftest import BIN, ROOT, grpcurl, require_model

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

GENERATE_KEY = "gen-e2e-0123456789abcdef"
ADMIN_KEY = "adm-e2e-0123456789abcdef"
CHAT = [("user", "What is the capital of France? Answer in one sentence.")]


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    certs = make_certs(tmp_path_factory.mktemp("certs"))
    keys = certs.dir / "keys.txt"
    keys.write_text(f"generate:{GENERATE_KEY}\nadmin:{ADMIN_KEY}\n")
    keys.chmod(0o600)
    cluster = LocalCluster(model_dir=require_model(), log_dir=tmp_path_factory.mktemp("logs-tls"),
                           kv_capacities=["256MiB"], tls_dir=certs.dir, api_key=GENERATE_KEY,
                           scheduler_args=["--api-keys-file", str(keys)]).start()
    yield cluster, certs
    cluster.stop()


def documented_secure_commands() -> list[str]:
    text = (ROOT / "docs" / "operations" / "security.md").read_text()
    block = re.search(r"<!-- grpcurl-secure-examples -->\s*```(?:bash|sh)?\n(.*?)```", text, re.S)
    assert block, "docs/operations/security.md lost its grpcurl-secure-examples block"
    return [line for line in block.group(1).splitlines() if line.startswith("grpcurl ")]


def test_the_documented_secure_grpcurl_lines_work_as_written(secure):
    cluster, certs = secure
    port = cluster.address.rsplit(":", 1)[1]
    commands = documented_secure_commands()
    assert len(commands) == 4
    env = {**os.environ, "ORTSERVE_API_KEY": GENERATE_KEY,
           "PATH": f"{os.path.dirname(grpcurl())}:{os.environ['PATH']}"}
    results = [subprocess.run(["bash", "-c", c.replace("localhost:50051", f"localhost:{port}")],
                              cwd=certs.dir, env=env, capture_output=True, text=True, timeout=120)
               for c in commands]
    listed, no_key, budget, generated = results
    assert listed.returncode == 0, listed.stderr
    assert "ortserve.v1.Scheduler" in listed.stdout.split()
    assert "ortserve.v1.SchedulerInternal" not in listed.stdout  # not on the public port
    assert no_key.returncode != 0 and "Unauthenticated" in no_key.stderr
    assert "authorization: Bearer" in no_key.stderr
    assert budget.returncode == 0, budget.stderr
    assert len(json.loads(budget.stdout)["workers"]) == 1
    assert generated.returncode == 0, generated.stderr
    events = [json.loads(doc) for doc in re.split(r"(?<=})\n(?={)", generated.stdout.strip())]
    assert "lease_secret" not in json.dumps(events[0]) and "leaseSecret" not in json.dumps(events[0])
    assert "Paris" in "".join(e["chunk"].get("text", "") for e in events if "chunk" in e)


def test_the_python_client_and_cli_generate_over_tls_with_a_key(secure):
    cluster, certs = secure
    with Client(cluster.address.replace("127.0.0.1", "localhost"), timeout_s=120,
                cacert=certs.ca, api_key=GENERATE_KEY) as client:
        result = client.generate(chat=CHAT, max_new_tokens=24)
        assert "Paris" in result.text
        assert client.budget().total_reserved_bytes == 0
    cli = subprocess.run(
        [str(BIN / "ortserve"), "--address", cluster.address, "--cacert", certs.ca,
         "generate", CHAT[0][1], "--chat", "--max-new-tokens", "24"],
        env={**os.environ, "ORTSERVE_API_KEY": GENERATE_KEY}, capture_output=True, text=True,
        timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert "Paris" in cli.stdout
    without = subprocess.run(
        [str(BIN / "ortserve"), "--address", cluster.address, "--cacert", certs.ca, "budget"],
        env={k: v for k, v in os.environ.items() if k != "ORTSERVE_API_KEY"},
        capture_output=True, text=True, timeout=60)
    assert without.returncode == 1 and "UNAUTHENTICATED" in without.stderr


def test_the_gateway_reaches_a_tls_scheduler_with_each_callers_key(secure, tmp_path):
    """--cacert: TLS to the scheduler; every caller's key travels on (the model list and
    the model check included), and /health needs none (grpc.health is open)."""
    cluster, certs = secure
    gateway = start_service("gateway", [str(BIN / "ortserve-gateway"), "--port", "0", "--scheduler",
                                        cluster.address.replace("127.0.0.1", "localhost"),
                                        "--cacert", certs.ca], tmp_path)
    try:
        health = wait_for_health(gateway)
        assert health == {"scheduler": cluster.address.replace("127.0.0.1", "localhost"),
                          "tls": True, "status": "ok"}
        base_url = f"http://{gateway.address}/v1"
        with openai.OpenAI(base_url=base_url, api_key=GENERATE_KEY, timeout=120) as client:
            assert [m.id for m in client.models.list().data] == [require_model().name]
            answer = client.chat.completions.create(
                model=require_model().name, max_tokens=24, temperature=0,
                messages=[{"role": "user", "content": CHAT[0][1]}])
            assert "Paris" in answer.choices[0].message.content
        with openai.OpenAI(base_url=base_url, api_key="not-a-key", timeout=60, max_retries=0) as client:
            with pytest.raises(openai.AuthenticationError):
                client.models.list()
            with pytest.raises(openai.AuthenticationError):
                client.chat.completions.create(model=require_model().name, max_tokens=4,
                                               messages=[{"role": "user", "content": "Hi"}])
    finally:
        stop_service(gateway)


def test_the_python_client_reads_a_tls_worker_with_its_certificate_and_relays_without_one(
        secure, caplog):
    """The client's default path: with a certificate the workers take, the tokens come
    from the worker; with one they refuse, the lease goes back and the scheduler relays
    the request (said once in a warning), the same answer and nothing left reserved."""
    cluster, certs = secure
    address = cluster.address.replace("127.0.0.1", "localhost")
    good = (certs.ca, certs.worker.cert, certs.worker.key)
    refused = (certs.ca, certs.rogue_worker.cert, certs.rogue_worker.key)
    answers = {}
    for name, worker_tls in (("direct", good), ("refused", refused)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="ortserve_client"), \
                Client(address, timeout_s=120, cacert=certs.ca, api_key=GENERATE_KEY,
                       worker_tls=worker_tls, worker_connect_s=3) as client:
            result = client.generate(chat=CHAT, max_new_tokens=24, temperature=0)
            answers[name] = result.text
            warned = [r.getMessage() for r in caplog.records if r.name == "ortserve_client"]
            assert bool(warned) == (name == "refused"), warned
            assert client.budget().total_reserved_bytes == 0
    assert answers["direct"] == answers["refused"] and "Paris" in answers["direct"]


def test_the_gateway_reads_a_tls_worker_with_its_certificate_and_relays_without_one(
        secure, tmp_path):
    """Worker TLS given: the two-step path over mutual TLS. A client certificate the
    workers refuse: the handshake never completes, so the default path relays through the
    scheduler instead, and says so once in a warning."""
    cluster, certs = secure
    scheduler = cluster.address.replace("127.0.0.1", "localhost")
    good = ["--worker-tls-ca", certs.ca, "--worker-tls-cert", certs.worker.cert,
            "--worker-tls-key", certs.worker.key]
    refused = ["--worker-tls-ca", certs.ca, "--worker-tls-cert", certs.rogue_worker.cert,
               "--worker-tls-key", certs.rogue_worker.key]
    for name, worker_tls in (("direct", good), ("refused", refused)):
        gateway = start_service(f"gateway-{name}", [
            str(BIN / "ortserve-gateway"), "--port", "0", "--scheduler", scheduler,
            "--cacert", certs.ca, *worker_tls], tmp_path / name)
        try:
            wait_for_health(gateway)
            with openai.OpenAI(base_url=f"http://{gateway.address}/v1", api_key=GENERATE_KEY,
                               timeout=120) as client:
                answer = client.chat.completions.create(
                    model=require_model().name, max_tokens=24, temperature=0,
                    messages=[{"role": "user", "content": CHAT[0][1]}])
            assert "Paris" in answer.choices[0].message.content
            log = gateway.log_path.read_text()
            if name == "direct":  # its own Relay call to the worker: the tokens came from there
                assert "relay call opened" in log and "not reachable" not in log
            else:
                assert "worker not reachable from the gateway" in log
                assert "relay call opened" not in log
        finally:
            stop_service(gateway)


def wait_for_health(gateway, timeout_s: float = 30) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"http://{gateway.address}/health", timeout=2) as reply:
                return json.loads(reply.read())
        except (urllib.error.URLError, ConnectionError) as error:
            if time.monotonic() > deadline:
                pytest.fail(f"gateway /health: {error}; {gateway.log_tail()}")
        time.sleep(0.2)


def test_a_gateway_cacert_that_is_not_a_file_is_refused_naming_the_flag():
    out = subprocess.run([str(BIN / "ortserve-gateway"), "--cacert", "/nonexistent/ca.pem"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--cacert '/nonexistent/ca.pem' is not a readable file" in out.stderr


def test_the_node_client_generates_over_tls_with_a_key(secure):
    cluster, certs = secure
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node/npm not installed on this machine: the Node.js client cannot be tested")
    client_dir = ROOT / "clients" / "node"
    if not (client_dir / "node_modules" / "@grpc" / "grpc-js").exists():
        subprocess.run([npm, "install", "--no-audit", "--no-fund"], cwd=client_dir, check=True,
                       capture_output=True, timeout=300)
    result = subprocess.run(
        [node, str(client_dir / "generate.js"), "--address", cluster.address, "--cacert", certs.ca,
         "--chat", "--max-new-tokens", "24", CHAT[0][1]],
        env={**os.environ, "ORTSERVE_API_KEY": GENERATE_KEY}, capture_output=True, text=True,
        timeout=120)
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout


def test_plaintext_and_certificate_less_callers_are_turned_away(secure):
    cluster, certs = secure
    with grpc.insecure_channel(cluster.address) as channel:  # plaintext to a TLS port
        with pytest.raises(grpc.RpcError) as err:
            channel.unary_unary("/ortserve.v1.Scheduler/GetBudget")(
                scheduler_pb2.GetBudgetRequest().SerializeToString(), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    # A worker's port is mutual TLS: TLS without a cluster certificate cannot reach Info.
    worker = cluster.worker_services[0].address
    with grpc.secure_channel(worker, cluster.credentials()) as channel:
        with pytest.raises(grpc.RpcError) as err:
            worker_pb2_grpc.WorkerStub(channel).Info(worker_pb2.InfoRequest(), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    with grpc.secure_channel(worker, cluster.credentials(client_cert=True)) as channel:
        assert worker_pb2_grpc.WorkerStub(channel).Info(worker_pb2.InfoRequest(), timeout=5).worker_id
