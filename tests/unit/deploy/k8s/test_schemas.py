"""deploy/k8s, offline: every overlay renders (devtools.kustomize) and every object
validates against the strict Kubernetes schemas (kubernetes-validate: an unknown or
misspelled field is an error)."""

from __future__ import annotations

import re
import shutil

import kubernetes_validate
import pytest

from tests.unit.deploy.k8s.manifests import AUTOSCALING, K8S, K8S_VERSIONS, render, validate_all


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
