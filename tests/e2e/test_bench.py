"""make bench's quick mode runs and writes JSON of the documented shape (not its speed)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.e2e.conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def test_bench_quick_writes_results_json_with_the_schema(tmp_path):
    out = tmp_path / "results.json"
    run = subprocess.run([sys.executable, "-m", "bench.run", "--quick", "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["schema_version"] == 1 and doc["quick"] is True
    assert {"cores", "cpu_model"} <= set(doc["machine"])
    assert {"onnxruntime", "onnxruntime_genai", "python"} <= set(doc["versions"])
    assert doc["settings"]["intra_op_threads"] >= 1 and "bench.run" in doc["command"]
    for key in ("engine_vs_genai_1stream", "engine_vs_genai_4stream", "e2e_vs_inprocess_1stream"):
        assert doc["ratios"][key]["tiny"] > 0
    for figure in doc["figures"].values():
        assert figure["min"] <= figure["median"] <= figure["max"] and figure["unit"]
    assert doc["e2e"]["admit_latency_ms"]["p50"] <= doc["e2e"]["admit_latency_ms"]["p99"]
    assert doc["e2e"]["admissions_per_s"] > 0
    roof = doc["roofline"]["tiny"]
    assert roof["weight_bytes_per_token"] > 0 and roof["read_bandwidth_bytes_per_s"] > 0
    assert "engine_vs_genai_1stream" in run.stdout  # the table
    assert "bench:" not in run.stdout and "engine_ready" not in run.stdout  # notices stay on stderr
