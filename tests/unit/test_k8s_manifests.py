"""deploy/k8s, offline: every overlay renders (devtools.kustomize), every object
validates against the strict Kubernetes schemas (kubernetes-validate: an unknown
or misspelled field is an error), and the manifests agree with the code they
run: probe services, ports, env names, drain timeout vs grace period, images.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from devtools.kustomize import KustomizeError, build, merge

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ("cpu", "gpu")
AUTOSCALING = "autoscaling"  # deploy/k8s/autoscaling: the workers' HPA, applied after an overlay
# The oldest Kubernetes we claim (native gRPC probes are GA since 1.27) and the newest schemas.
K8S_VERSIONS = ("1.30.0", "1.37.0")
# Set here ahead of the code that reads it (the graceful drain).
PENDING_ENV: set[str] = set()  # names the manifests set ahead of the code (none now)


def render(overlay: str, root: Path = K8S) -> list[dict]:
    return build(root / AUTOSCALING if overlay == AUTOSCALING else root / "overlays" / overlay)


def find(objects: list[dict], kind: str, name: str) -> dict:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} objects"
    return matches[0]


def pod_spec(objects: list[dict], name: str) -> dict:
    return find(objects, "Deployment", name)["spec"]["template"]["spec"]


def container(objects: list[dict], deployment: str, name: str) -> dict:
    (c,) = [c for c in pod_spec(objects, deployment)["containers"] if c["name"] == name]
    return c


def config_map(objects: list[dict], name: str) -> dict[str, str]:
    return find(objects, "ConfigMap", name)["data"]


def validate_all(objects: list[dict], version: str) -> None:
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request) -> tuple[str, list[dict]]:
    return request.param, render(request.param)


# -- schemas -----------------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_object_validates_against_strict_schemas(overlay, version):
    name, objects = overlay
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == ["ConfigMap", "ConfigMap", "ConfigMap", "Deployment", "Deployment",
                     "Deployment", "PodDisruptionBudget", "PodDisruptionBudget", "Service",
                     "Service", "Service"], name
    validate_all(objects, version)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_autoscaler_validates_against_strict_schemas(version):
    objects = render(AUTOSCALING)
    assert [(o["apiVersion"], o["kind"]) for o in objects] == [
        ("autoscaling/v2", "HorizontalPodAutoscaler")]
    validate_all(objects, version)


@pytest.mark.parametrize(("overlay_name", "file", "good", "bad", "message"), [
    # A misspelled probe field in the base.
    ("cpu", "base/worker.yaml", "initialDelaySeconds:", "initialDelaySecnds:",
     "'initialDelaySecnds' was unexpected"),
    ("cpu", "base/scheduler.yaml", "periodSeconds:", "periodSecond:",
     "'periodSecond' was unexpected"),
    # A misspelled field in an overlay's patch.
    ("gpu", "overlays/gpu/worker-gpu.yaml", "limits:", "limts:", "'limts' was unexpected"),
    # A value of the wrong type.
    ("cpu", "base/worker.yaml", "failureThreshold: 60", "failureThreshold: sixty",
     "'sixty' is not of type"),
    # The gateway's probe, and the autoscaler's target.
    ("cpu", "base/gateway.yaml", "httpGet: {path: /health", "httpGet: {pth: /health",
     "'pth' was unexpected"),
    (AUTOSCALING, "autoscaling/worker-hpa.yaml", "averageValue:", "avrageValue:",
     "'avrageValue' was unexpected"),
    (AUTOSCALING, "autoscaling/worker-hpa.yaml", "maxReplicas: 8", "maxReplicas: eight",
     "'eight' is not of type"),
])
def test_a_broken_copy_fails_validation(tmp_path, overlay_name, file, good, bad, message):
    copy = tmp_path / "k8s"
    shutil.copytree(K8S, copy)
    text = (copy / file).read_text()
    assert good in text, f"{file} no longer has {good!r}: update this test"
    (copy / file).write_text(text.replace(good, bad, 1))
    validate_all(render(overlay_name), K8S_VERSIONS[-1])  # the original is fine
    with pytest.raises(kubernetes_validate.ValidationError, match=re.escape(message)):
        validate_all(render(overlay_name, copy), K8S_VERSIONS[-1])


# -- the manifests agree with the code ---------------------------------------------------


def test_probes_are_native_grpc_on_the_services_ports_and_names(overlay):
    from scheduler_service.server import SERVICE_NAME as SCHEDULER
    from worker_service.server import SERVICE_NAME as WORKER

    _, objects = overlay
    for deployment, name, service, env_port in [
        ("ortserve-scheduler", "scheduler", SCHEDULER,
         config_map(objects, "ortserve-scheduler")["ORTSERVE_SCHEDULER_PORT"]),
        ("ortserve-worker", "worker", WORKER,
         config_map(objects, "ortserve-worker")["ORTSERVE_WORKER_PORT"]),
    ]:
        c = container(objects, deployment, name)
        # The grpc port (the scheduler also has "internal", its worker-facing port).
        (port,) = [p["containerPort"] for p in c["ports"] if p["name"] == "grpc"]
        assert port == int(env_port)
        assert c["readinessProbe"]["grpc"] == {"port": port, "service": service}
        # Liveness: the server as a whole ("" in grpc.health.v1).
        assert c["livenessProbe"]["grpc"] == {"port": port, "service": ""}
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            if probe in c:
                assert set(c[probe]) & {"exec", "httpGet", "tcpSocket"} == set()


def test_grace_period_is_above_the_drain_timeout_and_liveness_cannot_cut_a_drain(overlay):
    _, objects = overlay
    drain_s = float(config_map(objects, "ortserve-worker")["ORTSERVE_WORKER_DRAIN_TIMEOUT_S"])
    spec = pod_spec(objects, "ortserve-worker")
    grace_s = spec["terminationGracePeriodSeconds"]
    assert grace_s >= drain_s + 10, (grace_s, drain_s)
    live = container(objects, "ortserve-worker", "worker")["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] > grace_s
    # The scheduler lets relayed streams finish too.
    assert pod_spec(objects, "ortserve-scheduler")["terminationGracePeriodSeconds"] >= grace_s


def _env_of(objects: list[dict], deployment: str, name: str, pod_ip: str) -> dict[str, str]:
    """The container's environment as the kubelet builds it (downward API faked)."""
    c = container(objects, deployment, name)
    env: dict[str, str] = {}
    for source in c.get("envFrom", []):
        env.update(config_map(objects, source["configMapRef"]["name"]))
    fields = {"status.podIP": pod_ip, "metadata.name": f"{deployment}-abc12-xyz34"}
    for item in c.get("env", []):
        if "value" in item:
            env[item["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], item["value"])
        elif "fieldRef" in item["valueFrom"]:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            ref = item["valueFrom"]["resourceFieldRef"]
            assert ref["containerName"] == name
            env[item["name"]] = str(c["resources"]["limits"][ref["resource"].split(".")[1]])
    return env


def test_the_worker_reads_its_environment_as_intended(overlay, monkeypatch):
    from worker_service.__main__ import parse_config

    name, objects = overlay
    env = _env_of(objects, "ortserve-worker", "worker", pod_ip="10.1.2.3")
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
    for key, value in _env_of(objects, "ortserve-scheduler", "scheduler", "10.9.9.9").items():
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
    for key, value in _env_of(objects, "ortserve-gateway", "gateway", "10.9.9.8").items():
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


def test_every_scrape_annotation_names_a_port_the_pod_serves_metrics_on(overlay):
    _, objects = overlay
    annotated = 0
    for o in objects:
        if o["kind"] != "Deployment":
            continue
        annotations = o["spec"]["template"]["metadata"].get("annotations", {})
        if annotations.get("prometheus.io/scrape") == "true":
            annotated += 1
            ports = {p["containerPort"] for c in o["spec"]["template"]["spec"]["containers"]
                     for p in c["ports"]}
            assert int(annotations["prometheus.io/port"]) in ports, o["metadata"]["name"]
            assert annotations["prometheus.io/path"] == "/metrics"
    assert annotated == 3


def _scheduler_metric_names() -> set[str]:
    from prometheus_client import CollectorRegistry

    from scheduler_service.ledger.ledger import Ledger
    from scheduler_service.ledger.queue import AdmissionQueue
    from scheduler_service.metrics import SchedulerMetrics

    registry = CollectorRegistry()
    ledger = Ledger()
    SchedulerMetrics(registry, ledger, AdmissionQueue(ledger))
    return {family.name for family in registry.collect()}


def test_the_autoscaler_scales_the_workers_on_scheduler_metrics_the_adapter_serves(overlay):
    _, objects = overlay
    (hpa,) = render(AUTOSCALING)
    target = hpa["spec"]["scaleTargetRef"]
    worker = find(objects, target["kind"], target["name"])
    assert (target["apiVersion"], target["name"]) == (worker["apiVersion"], "ortserve-worker")
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    wanted = {m["external"]["metric"]["name"] for m in hpa["spec"]["metrics"]}
    assert {m["type"] for m in hpa["spec"]["metrics"]} == {"External"}
    assert wanted == {"ortserve_scheduler_total_kv_reserved_ratio",
                      "ortserve_scheduler_queue_length"}
    assert wanted <= _scheduler_metric_names()
    values = yaml.safe_load((K8S / AUTOSCALING / "prometheus-adapter-values.yaml").read_text())
    served = {rule["name"]["as"] for rule in values["rules"]["external"]}
    queried = {re.match(r"(\w+)\{", rule["seriesQuery"]).group(1)
               for rule in values["rules"]["external"]}
    assert served == wanted == queried


def test_the_model_volume_is_prepared_where_the_worker_reads_it(overlay):
    from model_tools.prepare import TARGETS

    _, objects = overlay
    spec = pod_spec(objects, "ortserve-worker")
    (init,) = spec["initContainers"]
    assert init["image"] == "ortserve:tools"
    assert init["command"][:3] == ["python", "-m", "model_tools.prepare"]
    target = init["command"][init["command"].index("--only") + 1]
    cache = {e["name"]: e["value"] for e in init["env"]}["ORTSERVE_MODEL_CACHE"]
    model_dir = config_map(objects, "ortserve-worker")["ORTSERVE_WORKER_MODEL_DIR"]
    assert model_dir == f"{cache}/models/{TARGETS[target].name}"
    (init_mount,) = [m for m in init["volumeMounts"] if m["mountPath"] == cache]
    worker = container(objects, "ortserve-worker", "worker")
    (mount,) = [m for m in worker["volumeMounts"] if model_dir.startswith(m["mountPath"] + "/")]
    assert mount["name"] == init_mount["name"] and mount.get("readOnly") is True
    assert mount["name"] in {v["name"] for v in spec["volumes"]}


def test_images_are_dockerfile_targets_and_each_overlay_picks_its_device():
    targets = set(re.findall(r"^FROM \S+ AS (\w+)$", (ROOT / "Dockerfile").read_text(), re.M))
    cpu, gpu = render("cpu"), render("gpu")
    for objects in (cpu, gpu):
        for o in objects:
            if o["kind"] == "Deployment":
                spec = o["spec"]["template"]["spec"]
                for c in spec["containers"] + spec.get("initContainers", []):
                    repo, _, tag = c["image"].partition(":")
                    assert repo == "ortserve" and tag in targets, c["image"]
    assert container(cpu, "ortserve-worker", "worker")["image"] == "ortserve:cpu"
    assert "nvidia.com/gpu" not in yaml.safe_dump_all(cpu)
    worker = container(gpu, "ortserve-worker", "worker")
    assert worker["image"] == "ortserve:cuda"
    assert worker["args"] == ["--device", "cuda"]
    assert str(worker["resources"]["limits"]["nvidia.com/gpu"]) == "1"
    # The overlay changes the workers only.
    assert find(gpu, "Deployment", "ortserve-scheduler") == find(cpu, "Deployment", "ortserve-scheduler")


def test_every_pod_runs_as_the_images_non_root_user(overlay):
    uid = int(re.search(r"useradd .*--uid (\d+)", (ROOT / "Dockerfile").read_text()).group(1))
    _, objects = overlay
    for o in objects:
        if o["kind"] == "Deployment":
            spec = o["spec"]["template"]["spec"]
            assert spec["securityContext"]["runAsNonRoot"] is True
            assert spec["securityContext"]["runAsUser"] == uid == spec["securityContext"]["fsGroup"]
            for c in spec["containers"] + spec.get("initContainers", []):
                assert c["securityContext"] == {"allowPrivilegeEscalation": False,
                                                "capabilities": {"drop": ["ALL"]}}, c["name"]


def test_one_scheduler_a_disruption_budget_and_resources_everywhere(overlay):
    _, objects = overlay
    scheduler = find(objects, "Deployment", "ortserve-scheduler")["spec"]
    assert scheduler["replicas"] == 1 and scheduler["strategy"] == {"type": "Recreate"}
    worker = find(objects, "Deployment", "ortserve-worker")
    pdb = find(objects, "PodDisruptionBudget", "ortserve-worker")["spec"]
    assert pdb["selector"] == worker["spec"]["selector"]
    assert pdb["maxUnavailable"] == 1
    for o in objects:
        if o["kind"] == "Deployment":
            spec = o["spec"]["template"]["spec"]
            assert o["spec"]["selector"]["matchLabels"].items() <= o["spec"]["template"]["metadata"]["labels"].items()
            for c in spec["containers"] + spec.get("initContainers", []):
                for kind in ("requests", "limits"):
                    assert {"cpu", "memory"} <= set(c["resources"][kind]), (c["name"], kind)


# -- the renderer ------------------------------------------------------------------------


def test_strategic_merge_merges_named_lists_and_replaces_others():
    base = {"containers": [{"name": "a", "image": "x", "args": ["1", "2"],
                            "env": [{"name": "E", "value": "1"}]}, {"name": "b", "image": "y"}],
            "tolerations": [{"key": "k"}]}
    patch = {"containers": [{"name": "a", "args": ["3"], "env": [{"name": "F", "value": "2"}]}],
             "tolerations": [{"key": "z"}]}
    out = merge(base, patch)
    assert out["containers"][0] == {"name": "a", "image": "x", "args": ["3"],
                                    "env": [{"name": "E", "value": "1"}, {"name": "F", "value": "2"}]}
    assert out["containers"][1] == {"name": "b", "image": "y"}
    assert out["tolerations"] == [{"key": "z"}]
    assert merge({"a": 1, "b": 2}, {"a": None}) == {"b": 2}
    with pytest.raises(KustomizeError):
        merge({"a": {}}, {"a": {"$patch": "delete"}})


def test_the_renderer_refuses_what_it_does_not_implement(tmp_path):
    (tmp_path / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n")
    (tmp_path / "kustomization.yaml").write_text("resources: [cm.yaml]\nnamePrefix: x-\n")
    with pytest.raises(KustomizeError, match="namePrefix"):
        build(tmp_path)
    (tmp_path / "p.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: other}\n")
    (tmp_path / "kustomization.yaml").write_text("resources: [cm.yaml]\npatches: [{path: p.yaml}]\n")
    with pytest.raises(KustomizeError, match="no object"):
        build(tmp_path)


def _by_identity(objects) -> dict[tuple[str, str, str], dict]:
    return {(o["apiVersion"], o["kind"], o["metadata"]["name"]): o for o in objects if o}


def _kustomize_command() -> list[str] | None:
    if os.environ.get("ORTSERVE_KUBECTL"):
        return [os.environ["ORTSERVE_KUBECTL"], "kustomize"]
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    return None


@pytest.mark.parametrize("name", OVERLAYS)
def test_the_renderer_agrees_with_kustomize(name):
    command = _kustomize_command()
    if command is None:
        pytest.skip("no kustomize or kubectl on PATH (ORTSERVE_KUBECTL names one)")
    out = subprocess.run([*command, str(K8S / "overlays" / name)], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    assert _by_identity(render(name)) == _by_identity(yaml.safe_load_all(out))


def test_an_overlay_can_point_the_images_at_a_registry(tmp_path):
    copy = tmp_path / "k8s"
    shutil.copytree(K8S, copy)
    mine = copy / "overlays" / "mine"
    mine.mkdir()
    (mine / "kustomization.yaml").write_text(
        "resources: [../gpu]\nimages:\n  - {name: ortserve, newName: registry.example/ortserve}\n")
    objects = build(mine)
    images = {c["image"] for o in objects if o["kind"] == "Deployment"
              for c in o["spec"]["template"]["spec"]["containers"]
              + o["spec"]["template"]["spec"].get("initContainers", [])}
    assert images == {f"registry.example/ortserve:{t}" for t in ("scheduler", "cuda", "tools")}
    command = _kustomize_command()
    if command is not None:
        out = subprocess.run([*command, str(mine)], check=True, capture_output=True, text=True,
                             timeout=60).stdout
        assert _by_identity(yaml.safe_load_all(out)) == _by_identity(objects)


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
    env = _env_of(objects, "ortserve-gateway", "gateway", "10.9.9.8")
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
