"""devtools.kustomize, the offline renderer of deploy/k8s: strategic merge, a refusal
for what it does not implement, and the same objects as kustomize (when one is on
PATH)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import yaml

from devtools.kustomize import KustomizeError, build, merge
from tests.unit.deploy.k8s.manifests import INFERENCE_GATEWAY, K8S, OVERLAYS, render


def test_strategic_merge_merges_named_lists_and_replaces_others():
    base = {"containers": [{"name": "a", "image": "x", "args": ["1", "2"],
                            "env": [{"name": "E", "value": "1"}]}, {"name": "b", "image": "y"}],
            "tolerations": [{"key": "k"}]}
    patch = {"containers": [{"name": "a", "args": ["3"], "env": [{"name": "F", "value": "2"}]}],
             "tolerations": [{"key": "z"}]}
    out = merge(base, patch)
    # kustomize's order: the patch's items first (in its order), then the base's others.
    assert out["containers"][0] == {"name": "a", "image": "x", "args": ["3"],
                                    "env": [{"name": "F", "value": "2"}, {"name": "E", "value": "1"}]}
    assert out["containers"][1] == {"name": "b", "image": "y"}
    added = merge(base, {"containers": [{"name": "c", "image": "z"}]})
    assert [c["name"] for c in added["containers"]] == ["c", "a", "b"]
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


@pytest.mark.parametrize("name", (*OVERLAYS, INFERENCE_GATEWAY))
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
