"""deploy/k8s's gateway: stateless replicas behind one Service, probed on /health,
calling the scheduler's client Service; the https overlay serves it over TLS from a
Secret."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.unit.deploy.k8s.manifests import (
    K8S_VERSIONS,
    container,
    env_of,
    find,
    pod_spec,
    render,
    validate_all,
)


def test_the_gateway_is_stateless_replicas_behind_one_service_probed_on_health(overlay,
                                                                              monkeypatch):
    from gateway.__main__ import parse_config

    _, objects = overlay
    gateway = find(objects, "Deployment", "ortserve-gateway")
    assert gateway["spec"]["replicas"] >= 2
    c = container(objects, "ortserve-gateway", "gateway")
    assert c["command"] == ["ortserve-gateway"]
    assert c["image"] == "ortserve:scheduler"  # the gateway ships in the scheduler image
    for key in [k for k in os.environ if k.startswith("ORTSERVE_")]:
        monkeypatch.delenv(key)
    for key, value in env_of(objects, "ortserve-gateway", "gateway", "10.9.9.8").items():
        monkeypatch.setenv(key, value)
    config = parse_config(c.get("args", []))
    (port,) = [p for p in c["ports"] if p["name"] == "http"]
    assert (config.host, config.port, config.log_json) == ("0.0.0.0", port["containerPort"], True)
    # Ready on /health (the scheduler SERVING); alive on a path that never asks it.
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["livenessProbe"]["httpGet"]["path"] != "/health"
    # It calls the scheduler's client Service, on its public port.
    host, scheduler_port = config.scheduler_address.split(":")
    client = find(objects, "Service", host)["spec"]
    assert [p["targetPort"] for p in client["ports"]] == ["grpc"]
    assert [p["port"] for p in client["ports"]] == [int(scheduler_port)]
    service = find(objects, "Service", "ortserve-gateway")["spec"]
    assert service["selector"].items() <= gateway["spec"]["template"]["metadata"]["labels"].items()
    assert [p["targetPort"] for p in service["ports"]] == ["http"]
    pdb = find(objects, "PodDisruptionBudget", "ortserve-gateway")["spec"]
    assert pdb["selector"] == gateway["spec"]["selector"] and pdb["maxUnavailable"] == 1


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_https_overlay_serves_the_gateway_over_tls_from_a_secret(version, monkeypatch,
                                                                     tmp_path):
    from gateway.__main__ import https_options, parse_config

    objects = render("https")
    validate_all(objects, version)
    c = container(objects, "ortserve-gateway", "gateway")
    pod = pod_spec(objects, "ortserve-gateway")
    [mount] = [m for m in c["volumeMounts"] if m["name"] == "gateway-tls"]
    [volume] = [v for v in pod["volumes"] if v["name"] == "gateway-tls"]
    assert volume["secret"]["secretName"] == "ortserve-gateway-tls" and mount["readOnly"]
    # The gateway reads the Secret's files where the mount puts them, and serves HTTPS.
    env = env_of(objects, "ortserve-gateway", "gateway", "10.9.9.8")
    for key in [k for k in os.environ if k.startswith("ORTSERVE_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        if key.startswith("ORTSERVE_GATEWAY_TLS_"):
            assert value.startswith(mount["mountPath"] + "/"), (key, value)
            value = str(tmp_path / value.rsplit("/", 1)[1])  # the files, here
            Path(value).write_text("pem")
        monkeypatch.setenv(key, value)
    options = https_options(parse_config(c.get("args", [])))
    assert options["ssl_certfile"].endswith("tls.crt") and options["ssl_keyfile"].endswith("tls.key")
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["scheme"] == "HTTPS"
    annotations = find(objects, "Deployment", "ortserve-gateway")["spec"]["template"]["metadata"][
        "annotations"]
    assert annotations["prometheus.io/scheme"] == "https"
