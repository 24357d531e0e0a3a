"""devtools/gpu/bundle.py's edges (the build itself needs the registries: make gpu-bundle)."""

from __future__ import annotations

import pytest

from devtools.gpu import bundle, parts


def test_a_refused_bundle_leaves_no_half_folder_to_carry(tmp_path, monkeypatch, capsys):
    for folder in (bundle.STAGE_FOLDER, bundle.RUN_FOLDER):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "ort.part_00").write_bytes(b"stale")
    monkeypatch.setattr(bundle, "ROOT", tmp_path)
    monkeypatch.setattr(bundle, "find_tokenizer", lambda explicit: tmp_path)

    def too_large(tokenizer_dir, keep_sm):
        raise parts.BundleTooLarge("run call (.gpu-b): 70.0 MiB ... too many")

    monkeypatch.setattr(bundle, "build", too_large)
    assert bundle.main([]) == 2
    assert not (tmp_path / bundle.STAGE_FOLDER).exists()
    assert not (tmp_path / bundle.RUN_FOLDER).exists()
    err = capsys.readouterr().err
    assert "gpu-bundle: REFUSED: run call (.gpu-b): 70.0 MiB ... too many" in err
    assert ".gpu-a and .gpu-b removed" in err


def test_a_missing_tokenizer_names_the_folders_and_make_model(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTSERVE_MODEL_CACHE", str(tmp_path))
    with pytest.raises(SystemExit, match="run `make model` first"):
        bundle.find_tokenizer(None)
    (tmp_path / "tok").mkdir()
    for name in bundle.REQUIRED_TOKENIZER_FILES:
        (tmp_path / "tok" / name).write_text("{}")
    assert bundle.find_tokenizer(tmp_path / "tok") == tmp_path / "tok"
