"""devtools/gpu/install.py on a bundle made the way `make gpu-bundle` makes it (a fake
onnxruntime wheel, packed, split across the two calls' folders, with its manifest)."""

from __future__ import annotations

import json
import shutil

import pytest

from devtools.gpu import install, manifest, pack_ort, parts

from .fake_ort import fake_wheel

pytestmark = pytest.mark.skipif(shutil.which("zstd") is None, reason="needs zstd")


def make_bundle(tmp_path):
    packed = tmp_path / "ort.tar.zst"
    pack_ort.pack(fake_wheel(tmp_path, [90, 80]), packed, {90})
    stage, run = tmp_path / ".gpu-a", tmp_path / ".gpu-b"
    sizes = parts.split_sizes(packed.stat().st_size, packed.stat().st_size // 2 + 1, 10**9)
    dests = [stage / "ort.part_00", run / "ort.part_01"]
    parts.write_parts(packed, dests, sizes)
    entries = [manifest.part_entry(dests[0], "stage"), manifest.part_entry(dests[1], "run")]
    manifest.write(run, manifest.build(built_utc="now", project={"commit": "abc"},
                                       runtime={"requirement": "onnxruntime-gpu==1.31.1"},
                                       parts=entries, wheels=[], tokenizer=[], calls=[]))
    return stage, run


def test_the_staged_and_carried_parts_unpack_into_the_site(tmp_path):
    stage, run = make_bundle(tmp_path)
    site = tmp_path / "site"
    code, out = install.install(run, [tmp_path / "tmp-stage", stage], site)
    assert code == 0, out
    assert (site / pack_ort.PROVIDER).exists()
    assert (site / "onnxruntime" / "__init__.py").read_text() == "__version__ = 'fake'\n"
    assert out["project"] == {"commit": "abc"} and out["wheels"] == 0


def test_a_missing_stage_exits_3_and_names_the_part_and_the_next_step(tmp_path):
    stage, run = make_bundle(tmp_path)
    shutil.rmtree(stage)
    result = tmp_path / "install.json"
    code = install.main(["--bundle", str(run), "--stage", str(stage), "--site",
                         str(tmp_path / "site"), "--result", str(result)])
    assert code == install.STAGE_MISSING
    out = json.loads(result.read_text())
    assert out["ok"] is False
    assert "ort.part_00 (stage) is in none of" in out["stage_missing"][0]
    assert not (tmp_path / "site").exists()
