"""deploy/k8s/overlays/inference-gateway, offline: the InferencePool validates against the
upstream CRD's schema (kept as data: data/inferencepool-crd-v1.5.0.yaml), every built-in
object against the strict Kubernetes schemas, and the pieces agree with each other and
with the code: the pool selects the worker pods and reaches their gateway's port, the
gateway there publishes that pod's worker's gauges, and the picker's engine
configuration names exactly the gauges ortserve exports."""

from __future__ import annotations

import copy
import os
import re
import shutil
from pathlib import Path

import jsonschema
import pytest
import yaml

from ortserve.process import model_server_gauges
from tests.unit.deploy.k8s.manifests import (
    INFERENCE_GATEWAY,
    K8S,
    K8S_VERSIONS,
    container,
    env_of,
    find,
    pod_spec,
    render,
    validate_all,
)

CRD = Path(__file__).parent / "data" / "inferencepool-crd-v1.5.0.yaml"
# The custom kinds of the overlay, checked here against their own schemas.
CUSTOM = {("inference.networking.k8s.io/v1", "InferencePool")}
# EndpointPickerConfig's fields and an engine configuration's, as EPP v1.5.0 reads them
# (apix/config/v1alpha1/endpointpickerconfig_types.go; the core-metrics-extractor's
# engineConfigParams): a misspelled key would be ignored there, so it fails here.
PICKER_CONFIG_KEYS = {"apiVersion", "kind", "featureGates", "plugins", "schedulingProfiles",
                      "saturationDetector", "dataLayer", "flowControl", "parser"}
ENGINE_CONFIG_KEYS = {"name", "queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec",
                      "loraSpec", "cacheInfoSpec", "cacheBlockSizeLabelName",
                      "cacheNumBlocksLabelName", "cacheBlockSizeSpec", "cacheNumBlocksSpec"}


def crd_schema() -> dict:
    """The CRD's v1 openAPIV3Schema, strict: an object with listed properties takes no
    others (the API server's strict field validation, which kubectl asks for)."""
    crd = yaml.safe_load(CRD.read_text())
    assert crd["metadata"]["annotations"]["inference.networking.k8s.io/bundle-version"] == "v1.5.0"
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = copy.deepcopy(v1["schema"]["openAPIV3Schema"])

    def strict(node):
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node:
                node["additionalProperties"] = False
            for value in node.values():
                strict(value)
        elif isinstance(node, list):
            for value in node:
                strict(value)

    strict(schema)
    return schema


def pool(objects: list[dict]) -> dict:
    return find(objects, "InferencePool", "ortserve")


@pytest.fixture(scope="module")
def objects() -> list[dict]:
    return render(INFERENCE_GATEWAY)


def test_the_inference_pool_validates_against_the_upstream_crd_schema(objects):
    jsonschema.validate(pool(objects), crd_schema())


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_builtin_object_validates_against_strict_schemas(objects, version):
    builtin = [o for o in objects if (o["apiVersion"], o["kind"]) not in CUSTOM]
    assert len(builtin) == len(objects) - 1
    validate_all(builtin, version)


@pytest.mark.parametrize(("good", "bad", "message"), [
    ("targetPorts:", "targetPort:", "'targetPort' was unexpected"),
    ("failureMode: FailOpen", "failureMode: Open", "'Open' is not one of"),
    ("- number: 8000", "- number: 80000", "80000 is greater than the maximum"),
    ("    port: {number: 9002}\n", "", "port is required"),
])
def test_a_broken_pool_fails_the_crd_schema(tmp_path, good, bad, message):
    k8s = tmp_path / "k8s"
    shutil.copytree(K8S, k8s)
    path = k8s / "overlays" / INFERENCE_GATEWAY / "inferencepool.yaml"
    text = path.read_text()
    assert good in text, f"inferencepool.yaml no longer has {good!r}: update this test"
    path.write_text(text.replace(good, bad, 1))
    broken = pool(render(INFERENCE_GATEWAY, k8s))
    if message == "port is required":
        # A CEL rule (x-kubernetes-validations), which jsonschema does not run: check it as
        # the API server would (a Service reference needs its port).
        ref = broken["spec"]["endpointPickerRef"]
        assert ref.get("kind", "Service") == "Service" and "port" not in ref
        return
    schema = crd_schema()
    jsonschema.validate(pool(render(INFERENCE_GATEWAY)), schema)  # the original is fine
    errors = [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(broken)]
    assert any(re.search(message, e) for e in errors), errors


def test_the_pool_selects_the_worker_pods_on_their_gateways_port(objects):
    spec = pool(objects)["spec"]
    workers = find(objects, "Deployment", "ortserve-worker")["spec"]["template"]
    labels = workers["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    # No other Deployment's pods are in the pool (the standalone gateway's, the scheduler's).
    for d in (o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] != "ortserve-worker"):
        assert not spec["selector"]["matchLabels"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
    gateway = container(objects, "ortserve-worker", "gateway")
    (port,) = [p["number"] for p in spec["targetPorts"]]
    assert port in [p["containerPort"] for p in gateway["ports"]]
    worker = container(objects, "ortserve-worker", "worker")
    assert port not in [p["containerPort"] for p in worker["ports"]]
    # The picker's Service on the port endpointPickerRef names, routed to its ext-proc port.
    ref = spec["endpointPickerRef"]
    service = find(objects, "Service", ref["name"])
    (sp,) = [p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"]]
    epp = container(objects, "ortserve-epp", "epp")
    assert sp["targetPort"] in [p["name"] for p in epp["ports"]]
    assert service["spec"]["selector"].items() <= find(
        objects, "Deployment", "ortserve-epp")["spec"]["template"]["metadata"]["labels"].items()


def test_the_pods_gateway_publishes_its_own_workers_gauges(objects, monkeypatch):
    from gateway.__main__ import parse_config

    for key in [k for k in os.environ if k.startswith("ORTSERVE_")]:
        monkeypatch.delenv(key)
    worker_env = env_of(objects, "ortserve-worker", "worker", "10.9.9.7")
    for key, value in env_of(objects, "ortserve-worker", "gateway", "10.9.9.7").items():
        monkeypatch.setenv(key, value)
    config = parse_config(container(objects, "ortserve-worker", "gateway").get("args", []))
    assert config.model_server_worker_id == worker_env["ORTSERVE_WORKER_ID"] != ""
    assert (config.host, config.port) == ("0.0.0.0", pool(objects)["spec"]["targetPorts"][0]["number"])
    assert config.scheduler_address == "ortserve-scheduler:50051"


def picker_config(objects) -> dict:
    data = find(objects, "ConfigMap", "ortserve-epp")["data"]
    (flag,) = [a for a in container(objects, "ortserve-epp", "epp")["args"]
               if a.startswith("--config-file=")]
    mount = container(objects, "ortserve-epp", "epp")["volumeMounts"][0]
    path = Path(flag.split("=", 1)[1])
    assert path.parent == Path(mount["mountPath"])
    assert pod_spec(objects, "ortserve-epp")["volumes"][0]["configMap"]["name"] == "ortserve-epp"
    return yaml.safe_load(data[path.name])


def test_the_pickers_engine_configuration_names_the_gauges_ortserve_exports(objects):
    config = picker_config(objects)
    assert set(config) <= PICKER_CONFIG_KEYS
    assert (config["apiVersion"], config["kind"]) == ("inference.networking.x-k8s.io/v1alpha1",
                                                      "EndpointPickerConfig")
    plugins = {p["type"]: p.get("parameters", {}) for p in config["plugins"]}
    extractor = plugins["core-metrics-extractor"]
    (engine,) = extractor["engineConfigs"]
    assert set(engine) <= ENGINE_CONFIG_KEYS
    assert engine == {"name": "ortserve",
                      "queuedRequestsSpec": model_server_gauges.WAITING,
                      "runningRequestsSpec": model_server_gauges.RUNNING,
                      "kvUsageSpec": model_server_gauges.KV_UTILIZATION,
                      "loraSpec": model_server_gauges.LORA_INFO,
                      "cacheInfoSpec": model_server_gauges.CACHE_INFO}
    # The cache info gauge's labels are the extractor's defaults (no label-name override).
    assert (model_server_gauges.BLOCK_SIZE_LABEL, model_server_gauges.NUM_BLOCKS_LABEL) == (
        "block_size", "num_gpu_blocks")
    # The worker pods carry the label that picks this engine; it is also the default.
    labels = find(objects, "Deployment", "ortserve-worker")["spec"]["template"]["metadata"]["labels"]
    assert labels[extractor.get("engineLabelKey", "inference.networking.k8s.io/engine-type")] == "ortserve"
    assert extractor["defaultEngine"] == "ortserve"
    # The data layer reads that extractor from that source; every profile's plugin exists.
    (source,) = config["dataLayer"]["sources"]
    assert source == {"pluginRef": "metrics-data-source",
                      "extractors": [{"pluginRef": "core-metrics-extractor"}]}
    assert plugins["metrics-data-source"]["path"] == "/metrics"
    for profile in config["schedulingProfiles"]:
        assert {p["pluginRef"] for p in profile["plugins"]} <= set(plugins)
