"""The subset of kustomize that deploy/k8s uses, in Python, for rendering without kustomize.

  python -m devtools.kustomize deploy/k8s/overlays/cpu | kubectl apply -f -

Supported in a kustomization.yaml: `resources` (YAML files, or folders holding
a kustomization.yaml), `patches` with a `path` to a strategic-merge patch (its
target named by apiVersion, kind and metadata.name), and `images` (name ->
newName / newTag). Anything else is an error, never silently ignored, so this
renderer and `kubectl kustomize` cannot drift apart unnoticed (the tests compare
the two where kubectl is installed).

Strategic merge as the Kubernetes API defines it for the fields used here: maps
merge key by key (a null value deletes the key); lists of containers, init
containers, env, volumes and imagePullSecrets merge by `name`, volumeMounts by
`mountPath`, container ports by `containerPort`; every other list is replaced.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import yaml

KUSTOMIZATION = "kustomization.yaml"
ALLOWED_KEYS = {"apiVersion", "kind", "resources", "patches", "images"}
# Field name -> the merge key of its list items (patchMergeKey in the API's schemas).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "imagePullSecrets": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
}


class KustomizeError(ValueError):
    """A kustomization this subset does not support, or a patch without a target."""


def _load_all(path: Path) -> list[dict[str, Any]]:
    with path.open() as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def _identity(obj: dict[str, Any]) -> tuple[str, str, str]:
    return (obj.get("apiVersion", ""), obj.get("kind", ""), obj.get("metadata", {}).get("name", ""))


def merge(base: Any, patch: Any, field: str = "") -> Any:
    """Strategic merge of `patch` into `base` (returns a new value)."""
    if isinstance(patch, dict) and isinstance(base, dict):
        if any(key.startswith("$") for key in patch):
            raise KustomizeError(f"patch directives are not supported: {sorted(patch)}")
        out = copy.deepcopy(base)
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            elif key in out:
                out[key] = merge(out[key], value, key)
            else:
                out[key] = copy.deepcopy(value)
        return out
    key = MERGE_KEYS.get(field)
    if (key and isinstance(patch, list) and isinstance(base, list)
            and all(isinstance(item, dict) and key in item for item in [*base, *patch])):
        # kustomize's order (kyaml): the patch's items first, in the patch's order (each
        # merged into its base item), then the base's items the patch does not name.
        # kubectl kustomize 1.3x puts a container or env entry a patch adds before the base's.
        by_key = {item[key]: item for item in base}
        out = [merge(by_key[item[key]], item, "") if item[key] in by_key else copy.deepcopy(item)
               for item in patch]
        named = {item[key] for item in patch}
        return out + [copy.deepcopy(item) for item in base if item[key] not in named]
    return copy.deepcopy(patch)


def _set_images(obj: Any, images: list[dict[str, Any]]) -> None:
    if isinstance(obj, dict):
        for field in ("containers", "initContainers"):
            for container in obj.get(field, []) or []:
                image = container.get("image", "")
                name, _, tag = image.partition(":")
                for rule in images:
                    if rule["name"] == name:
                        name = rule.get("newName", name)
                        tag = rule.get("newTag", tag)
                        container["image"] = f"{name}:{tag}" if tag else name
        for value in obj.values():
            _set_images(value, images)
    elif isinstance(obj, list):
        for value in obj:
            _set_images(value, images)


def build(folder: Path) -> list[dict[str, Any]]:
    """The objects a kustomization folder renders to, in resource order."""
    folder = Path(folder)
    spec = yaml.safe_load((folder / KUSTOMIZATION).read_text()) or {}
    unknown = set(spec) - ALLOWED_KEYS
    if unknown:
        raise KustomizeError(f"{folder / KUSTOMIZATION}: unsupported fields {sorted(unknown)}")
    objects: list[dict[str, Any]] = []
    for entry in spec.get("resources", []):
        path = folder / entry
        objects += build(path) if path.is_dir() else _load_all(path)
    seen: set[tuple[str, str, str]] = set()
    for obj in objects:
        if _identity(obj) in seen:
            raise KustomizeError(f"{folder}: duplicate object {_identity(obj)}")
        seen.add(_identity(obj))
    for entry in spec.get("patches", []):
        if set(entry) != {"path"}:
            raise KustomizeError(f"{folder}: only `patches: - path: FILE` is supported: {entry}")
        for patch in _load_all(folder / entry["path"]):
            targets = [i for i, obj in enumerate(objects) if _identity(obj) == _identity(patch)]
            if not targets:
                raise KustomizeError(f"{folder / entry['path']}: no object {_identity(patch)}")
            objects[targets[0]] = merge(objects[targets[0]], patch)
    if spec.get("images"):
        for obj in objects:
            _set_images(obj, spec["images"])
    return objects


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m devtools.kustomize", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="a folder with a kustomization.yaml")
    args = parser.parse_args(argv)
    try:
        objects = build(args.folder)
    except (KustomizeError, OSError) as error:
        sys.exit(f"kustomize: {error}")
    yaml.safe_dump_all(objects, sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main()
