"""deploy/k8s rendered offline (devtools.kustomize) and looked up the way the tests
read it: one object by kind and name, a pod's spec, a container, a ConfigMap, the
environment the kubelet would give a container."""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate

from devtools.kustomize import build

ROOT = Path(__file__).resolve().parents[4]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ("cpu", "gpu")
# ortserve behind an inference gateway: the CPU overlay plus an InferencePool and the
# endpoint picker (custom kinds: tests/unit/deploy/k8s/test_inference_gateway.py).
INFERENCE_GATEWAY = "inference-gateway"
AUTOSCALING = "autoscaling"  # deploy/k8s/autoscaling: the workers' HPA, applied after an overlay
# The oldest Kubernetes we claim (native gRPC probes are GA since 1.27) and the newest schemas.
K8S_VERSIONS = ("1.30.0", "1.37.0")


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


def env_of(objects: list[dict], deployment: str, name: str, pod_ip: str) -> dict[str, str]:
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
