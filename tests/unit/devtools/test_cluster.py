"""The local-cluster runner as `make run` starts it, from the repository root: stdout stays clean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def run_runner(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "devtools.cluster", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_a_missing_model_is_reported_on_stderr_with_the_next_step(tmp_path):
    result = run_runner("--model-dir", str(tmp_path / "absent"))
    assert result.returncode == 1
    assert result.stdout == ""
    assert f"no model at {tmp_path / 'absent'}" in result.stderr and "make model" in result.stderr


def test_a_worker_count_below_one_is_bad_usage():
    result = run_runner("--workers", "0")
    assert result.returncode == 2 and result.stdout == ""
    assert "argument --workers: 0 is out of range" in result.stderr
