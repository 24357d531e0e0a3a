"""buf lint and buf breaking on the protos, with the repository's buf.yaml.

buf comes from npm (`make buf-setup`, run by `make proto-lint` and CI).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BUF = ROOT / ".tools" / "node_modules" / ".bin" / "buf"

pytestmark = pytest.mark.skipif(not BUF.exists(), reason=f"{BUF} is missing: run `make buf-setup`")


def buf(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([str(BUF), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, check=False)


def workspace_copy(dest: Path) -> Path:
    """buf.yaml and protos/ as they are in the checkout."""
    dest.mkdir()
    shutil.copy2(ROOT / "buf.yaml", dest / "buf.yaml")
    shutil.copytree(ROOT / "protos", dest / "protos")
    return dest


def test_buf_lint_passes_with_the_recorded_exceptions():
    result = buf("lint")
    assert result.returncode == 0, result.stdout + result.stderr


def test_buf_breaking_fails_on_a_field_type_change(tmp_path):
    old, new = workspace_copy(tmp_path / "old"), workspace_copy(tmp_path / "new")
    unchanged = buf("breaking", str(new), "--against", str(old))
    assert unchanged.returncode == 0, unchanged.stdout + unchanged.stderr
    types = new / "protos" / "ortserve" / "v1" / "types.proto"
    text = types.read_text()
    assert "repeated uint32 ids = 1;" in text
    types.write_text(text.replace("repeated uint32 ids = 1;", "repeated string ids = 1;"))
    changed = buf("breaking", str(new), "--against", str(old))
    assert changed.returncode != 0
    assert ('Field "1" with name "ids" on message "TokenIds" changed type from "uint32" to '
            '"string"') in changed.stdout, changed.stdout
