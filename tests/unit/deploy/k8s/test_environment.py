"""deploy/k8s agrees with the code it runs: the scheduler and the worker read the
environment the manifests give them as intended, and every env name set is one a
service reads."""

from __future__ import annotations

import os
import re

from tests.unit.deploy.k8s.manifests import ROOT, container, env_of, find

# Set here ahead of the code that reads it (the graceful drain).
PENDING_ENV: set[str] = set()  # names the manifests set ahead of the code (none now)


def test_the_worker_reads_its_environment_as_intended(overlay, monkeypatch):
    from worker_service.__main__ import parse_config

    name, objects = overlay
    env = env_of(objects, "ortserve-worker", "worker", pod_ip="10.1.2.3")
    for key in [k for k in os.environ if k.startswith("ORTSERVE_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    c = container(objects, "ortserve-worker", "worker")
    assert c["command"] == ["ortserve-worker"]
    config = parse_config(c["args"])
    assert config.device == {"cpu": "cpu", "gpu": "cuda"}[name]
    assert (config.host, config.port) == ("0.0.0.0", 50052)
    # The scheduler dials the pod IP, never a Service or the pod's hostname.
    assert config.advertise_address == f"10.1.2.3:{config.port}"
    assert config.worker_id == "ortserve-worker-abc12-xyz34"
    assert config.intra_op_threads == int(c["resources"]["limits"]["cpu"])
    assert config.kv_capacity_bytes is not None and config.kv_capacity_bytes >= 2**30
    # The scheduler address is the Service that routes to a not-yet-ready scheduler.
    host, port = config.scheduler_address.split(":")
    service = find(objects, "Service", host)
    assert service["spec"].get("publishNotReadyAddresses") is True
    assert [p["port"] for p in service["spec"]["ports"]] == [int(port)]
    # ... and it is the scheduler's internal (worker-facing) port, not the public one.
    (target,) = [p["targetPort"] for p in service["spec"]["ports"]]
    scheduler_ports = {p["name"]: p["containerPort"]
                       for p in container(objects, "ortserve-scheduler", "scheduler")["ports"]}
    assert target == "internal" and scheduler_ports[target] == int(port) != scheduler_ports["grpc"]
    scheduler_labels = find(objects, "Deployment", "ortserve-scheduler")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= scheduler_labels.items()


def test_the_scheduler_reads_its_environment_as_intended(overlay, monkeypatch):
    from scheduler_service.__main__ import parse_config

    _, objects = overlay
    for key in [k for k in os.environ if k.startswith("ORTSERVE_")]:
        monkeypatch.delenv(key)
    for key, value in env_of(objects, "ortserve-scheduler", "scheduler", "10.9.9.9").items():
        monkeypatch.setenv(key, value)
    config = parse_config(container(objects, "ortserve-scheduler", "scheduler").get("args", []))
    assert (config.host, config.port, config.lease_ttl_s, config.log_json) == ("0.0.0.0", 50051, 10.0, True)
    client = find(objects, "Service", "ortserve-scheduler")["spec"]
    assert not client.get("publishNotReadyAddresses")
    assert [p["port"] for p in client["ports"]] == [config.port]
    # Clients never reach the worker-facing port; the workers' Service reaches only it.
    ports = {p["name"]: p["containerPort"]
             for p in container(objects, "ortserve-scheduler", "scheduler")["ports"]}
    assert ports == {"grpc": config.port, "internal": config.internal_port,
                     "metrics": config.metrics_port}
    workers = find(objects, "Service", "ortserve-scheduler-workers")["spec"]
    assert [p["targetPort"] for p in workers["ports"]] == ["internal"]
    assert [p["targetPort"] for p in client["ports"]] == ["grpc"]


def test_every_env_name_is_one_the_services_read(overlay):
    _, objects = overlay
    scheduler_src = (ROOT / "scheduler_service" / "__main__.py").read_text()
    worker_src = (ROOT / "worker_service" / "__main__.py").read_text()
    read = {"ORTSERVE_SCHEDULER_" + n.upper() for n in re.findall(r'_env\(p, f?"(\w+)"', scheduler_src)}
    read |= {"ORTSERVE_SCHEDULER_" + n for n in re.findall(r'_ENV \+ "(\w+)"', scheduler_src)}
    read |= set(re.findall(r'from_env\(p, "(ORTSERVE_\w+)"', worker_src))
    gateway_src = (ROOT / "gateway" / "__main__.py").read_text()
    read |= {"ORTSERVE_GATEWAY_" + n.upper() for n in re.findall(r'_env\(p, f?"(\w+)"', gateway_src)}
    read |= {"ORTSERVE_GATEWAY_" + n for n in re.findall(r'_ENV \+ "(\w+)"', gateway_src)}
    assert "ORTSERVE_WORKER_ADVERTISE_ADDRESS" in read and "ORTSERVE_SCHEDULER_LOG_JSON" in read
    assert {"ORTSERVE_GATEWAY_SCHEDULER", "ORTSERVE_GATEWAY_LOG_JSON"} <= read
    names = {k for o in objects if o["kind"] == "ConfigMap" for k in o["data"]}
    names |= {e["name"] for o in objects if o["kind"] == "Deployment"
              for c in o["spec"]["template"]["spec"]["containers"] for e in c.get("env", [])}
    names = {n for n in names if n.startswith("ORTSERVE_")}
    assert names - read - PENDING_ENV == set()
