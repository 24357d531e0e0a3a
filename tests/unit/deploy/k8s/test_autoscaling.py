"""deploy/k8s/autoscaling: the workers' HPA scales on scheduler metrics that the
scheduler exports and the Prometheus adapter serves."""

from __future__ import annotations

import re

import yaml

from tests.unit.deploy.k8s.manifests import AUTOSCALING, K8S, find, render


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
