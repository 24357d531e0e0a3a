"""devtools/gpu/install.py on a bundle made the way `make gpu-bundle` makes it (a fake
onnxruntime wheel, packed, split across the two calls' folders, with its manifest)."""

from __future__ import annotations

import json
import shutil

import pytest

from devtools.gpu import install, pack_ort

from .fake_ort import fake_bundle

pytestmark = pytest.mark.skipif(shutil.which("zstd") is None, reason="needs zstd")


def test_the_staged_and_carried_parts_unpack_into_the_site(tmp_path):
    stage, run = fake_bundle(tmp_path)
    site = tmp_path / "site"
    code, out = install.install(run, [tmp_path / "tmp-stage", stage], site)
    assert code == 0, out
    assert (site / pack_ort.PROVIDER).exists()
    assert (site / "onnxruntime" / "__init__.py").read_text() == "__version__ = 'fake'\n"
    assert out["project"] == {"commit": "abc"} and out["wheels"] == 0


def test_a_missing_stage_exits_3_and_names_the_part_and_the_next_step(tmp_path):
    stage, run = fake_bundle(tmp_path)
    shutil.rmtree(stage)
    result = tmp_path / "install.json"
    code = install.main(["--bundle", str(run), "--stage", str(stage), "--site",
                         str(tmp_path / "site"), "--result", str(result)])
    assert code == install.STAGE_MISSING
    out = json.loads(result.read_text())
    assert out["ok"] is False
    assert "ort.part_00 (stage) is in none of" in out["stage_missing"][0]
    assert not (tmp_path / "site").exists()
