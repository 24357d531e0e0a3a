"""deploy/k8s agrees with the code it runs: probe services and ports, drain timeout vs
grace period, scrape annotations, the model volume, images and devices, the non-root
user, replicas, disruption budgets and resources."""

from __future__ import annotations

import re

import yaml

from tests.unit.deploy.k8s.manifests import ROOT, config_map, container, find, pod_spec, render


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
