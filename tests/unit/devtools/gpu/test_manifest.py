"""devtools/gpu/manifest.py: the bundle's MANIFEST.json and the device's check of the parts."""

from __future__ import annotations

import pytest

from devtools.gpu import manifest


def bundle(tmp_path):
    stage, run = tmp_path / "stage", tmp_path / "run"
    stage.mkdir()
    run.mkdir()
    (stage / "ort.part_00").write_bytes(b"first part")
    (run / "ort.part_01").write_bytes(b"second")
    entries = [manifest.part_entry(stage / "ort.part_00", "stage"),
               manifest.part_entry(run / "ort.part_01", "run")]
    info = manifest.build(built_utc="2026-12-05T12:00:00Z", project={"commit": "abc"},
                          runtime={"requirement": "onnxruntime-gpu==1.31.1"}, parts=entries,
                          wheels=["b.whl", "a.whl"], tokenizer=["tokenizer.json"], calls=[])
    manifest.write(run, info)
    return stage, run


def test_the_manifest_round_trips_with_sizes_digests_and_sorted_wheels(tmp_path):
    _, run = bundle(tmp_path)
    info = manifest.read(run)
    assert [p["name"] for p in info["parts"]] == ["ort.part_00", "ort.part_01"]
    assert info["parts"][0]["bytes"] == len(b"first part")
    assert len(info["parts"][0]["sha256"]) == 64
    assert info["wheels"] == ["a.whl", "b.whl"]


def test_every_part_is_found_in_order_across_the_stage_and_the_bundle(tmp_path):
    stage, run = bundle(tmp_path)
    found, problems = manifest.locate_parts(manifest.read(run), [tmp_path / "nowhere", stage, run])
    assert problems == []
    assert found == [stage / "ort.part_00", run / "ort.part_01"]


def test_a_missing_staged_part_is_named_with_the_next_step(tmp_path):
    stage, run = bundle(tmp_path)
    (stage / "ort.part_00").unlink()
    found, problems = manifest.locate_parts(manifest.read(run), [stage, run])
    assert found == [run / "ort.part_01"]
    assert len(problems) == 1
    assert "ort.part_00 (stage) is in none of" in problems[0]
    assert "run the stage call, then this one at once" in problems[0]


def test_a_part_from_another_bundle_is_refused_by_size_and_digest(tmp_path):
    stage, run = bundle(tmp_path)
    (stage / "ort.part_00").write_bytes(b"first parT")  # same size, other bytes
    _, problems = manifest.locate_parts(manifest.read(run), [stage, run])
    assert len(problems) == 1 and "is not this bundle's" in problems[0]


def test_repeated_part_names_are_refused(tmp_path):
    (tmp_path / "p").write_bytes(b"x")
    entry = manifest.part_entry(tmp_path / "p", "stage")
    with pytest.raises(ValueError, match="repeat"):
        manifest.build(built_utc="", project={}, runtime={}, parts=[entry, entry], wheels=[],
                       tokenizer=[], calls=[])


def test_a_bundle_without_a_manifest_says_which_folder_to_carry(tmp_path):
    with pytest.raises(FileNotFoundError, match="carry the bundle's second folder"):
        manifest.read(tmp_path)
