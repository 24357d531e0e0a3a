"""The worker as a process: settings that cannot work are refused at start, naming the flag."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.models import prepared_model_dir


@pytest.mark.parametrize("budget", ["0", "100"])
def test_a_kv_budget_that_cannot_hold_one_request_is_refused_at_start(budget):
    tiny = prepared_model_dir("tiny-llama")
    # No scheduler listens on port 9: the worker must refuse before it would register.
    out = subprocess.run(
        [sys.executable, "-m", "worker_service", "--model-dir", str(tiny), "--port", "0",
         "--scheduler", "127.0.0.1:9", "--device", "cpu", "--kv-budget", budget, "--threads", "1"],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "--kv-budget" in out.stderr and "raise --kv-budget to at least" in out.stderr
