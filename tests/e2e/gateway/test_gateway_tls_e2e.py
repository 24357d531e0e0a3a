"""The gateway over HTTPS (--tls-cert, --tls-key) and mutual TLS (--tls-client-ca): the
real openai client, certificates made at test time (tests/certs.py), real processes on
the tiny model."""

from __future__ import annotations

import ssl
import time
import urllib.error
import urllib.request

import openai
import pytest

from devtools.cluster import LocalCluster, start_service, stop_service
from ortserve.rpc.probe import check_http
from tests.certs import make_certs
from tests.e2e.conftest import BIN
from tests.models import prepared_model_dir

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = LocalCluster(model_dir=prepared_model_dir("tiny-llama"), kv_capacities=["64MiB"],
                           log_dir=tmp_path_factory.mktemp("logs-gateway-tls")).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


def start_https_gateway(tmp_path_factory, cluster, certs, *extra: str):
    service = start_service("gateway", [
        str(BIN / "ortserve-gateway"), "--port", "0", "--scheduler", cluster.address,
        "--tls-cert", certs.gateway.cert, "--tls-key", certs.gateway.key, *extra],
        tmp_path_factory.mktemp("logs-gateway"))
    deadline = time.monotonic() + 30
    url = f"https://{service.address}/health"
    while (status := check_http(url, 2.0, certs.ca, certs.worker.cert, certs.worker.key)) \
            != "SERVING" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert status == "SERVING", service.log_tail()
    return service


def context(certs, client_cert: bool) -> ssl.SSLContext:
    trust = ssl.create_default_context(cafile=certs.ca)
    if client_cert:  # any leaf the cluster's CA signed
        trust.load_cert_chain(certs.worker.cert, certs.worker.key)
    return trust


def client(gateway, certs, client_cert: bool = False) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"https://localhost:{gateway.address.rsplit(':', 1)[1]}/v1",
                         api_key="unused", max_retries=0, timeout=60,
                         http_client=openai.DefaultHttpxClient(verify=context(certs, client_cert)))


def chat(openai_client: openai.OpenAI) -> str:
    model = openai_client.models.list().data[0].id
    answer = openai_client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0)
    assert answer.usage.completion_tokens >= 1
    return answer.choices[0].finish_reason


def test_the_openai_client_over_https_and_plain_http_refused(cluster, certs, tmp_path_factory):
    gateway = start_https_gateway(tmp_path_factory, cluster, certs)
    try:
        assert chat(client(gateway, certs)) in ("stop", "length")
        with pytest.raises(openai.APIConnectionError):  # a CA it does not trust
            openai.OpenAI(base_url=f"https://localhost:{gateway.address.rsplit(':', 1)[1]}/v1",
                          api_key="unused", max_retries=0, timeout=10).models.list()
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # no plain HTTP
            urllib.request.urlopen(f"http://{gateway.address}/health", timeout=10)
    finally:
        stop_service(gateway)


def test_mutual_tls_needs_a_certificate_the_ca_signed(cluster, certs, tmp_path_factory):
    gateway = start_https_gateway(tmp_path_factory, cluster, certs, "--tls-client-ca", certs.ca)
    try:
        assert chat(client(gateway, certs, client_cert=True)) in ("stop", "length")
        with pytest.raises(openai.APIConnectionError):  # no client certificate: no handshake
            client(gateway, certs).models.list()
    finally:
        stop_service(gateway)


def test_https_flags_are_checked_and_read_from_the_environment(monkeypatch, capsys, certs):
    from gateway.__main__ import https_options, parse_config

    with pytest.raises(SystemExit) as exit_:
        parse_config(["--tls-cert", certs.gateway.cert])
    assert exit_.value.code == 2 and "--tls-key" in capsys.readouterr().err
    monkeypatch.setenv("ORTSERVE_GATEWAY_TLS_CERT", certs.gateway.cert)
    monkeypatch.setenv("ORTSERVE_GATEWAY_TLS_KEY", certs.gateway.key)
    monkeypatch.setenv("ORTSERVE_GATEWAY_TLS_CLIENT_CA", certs.ca)
    options = https_options(parse_config([]))
    assert options == {"ssl_certfile": certs.gateway.cert, "ssl_keyfile": certs.gateway.key,
                       "ssl_ca_certs": certs.ca, "ssl_cert_reqs": ssl.CERT_REQUIRED}
