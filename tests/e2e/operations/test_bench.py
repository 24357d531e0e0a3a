"""make bench's quick mode runs and writes JSON of the documented shape (not its speed);
the decode window both sides are measured by counts what it says."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.common.measure import window_rate
from tests.e2e.conftest import ROOT


def test_window_rate_counts_tokens_after_every_stream_started():
    # Stream a starts at 0 and emits each second; b starts at 2. The window opens at
    # 2 s (b's first token) and closes at 4 s: a's tokens at 3 and 4, b's at 3 and 4.
    assert window_rate([[0, 1, 2, 3, 4], [2, 3, 4]]) == pytest.approx(4 / 2)
    # Client chunks can carry several tokens: they count by token, the first chunk not at all.
    assert window_rate([[1.0, 2.0, 3.0]], [[5, 2, 3]]) == pytest.approx(5 / 2)


@pytest.mark.slow
@pytest.mark.e2e
def test_bench_quick_writes_results_json_with_the_schema(tmp_path):
    out = tmp_path / "results.json"
    run = subprocess.run([sys.executable, "-m", "bench.run", "--quick", "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["schema_version"] == 2 and doc["quick"] is True
    assert {"cores", "cpu_model", "load_average_start"} <= set(doc["machine"])
    assert {"onnxruntime", "onnxruntime_genai", "python"} <= set(doc["versions"])
    assert doc["settings"]["intra_op_threads"] >= 1 and "bench.run" in doc["command"]
    for key in ("engine_vs_genai_1stream", "engine_vs_genai_4stream", "e2e_vs_inprocess_1stream"):
        assert doc["ratios"][key]["tiny"] > 0
        paired = doc["paired_ratios"][key]["tiny"]
        assert paired["pairs"] == doc["settings"]["repeats"] and paired["min"] <= paired["max"]
        assert len(paired["foreign_load_cores"]) == paired["pairs"] >= paired["quiet_pairs"]
        assert min(paired["foreign_load_cores"]) >= 0
    for figure in doc["figures"].values():
        assert figure["min"] <= figure["median"] <= figure["max"] and figure["unit"]
        assert figure["n"] == len(figure["values"]) >= 1
    # Both sides of e2e_vs_inprocess are client-observed decode rates, measured alike.
    assert {"tiny_e2e_1stream_client_decode", "tiny_inprocess_1stream_client_decode"} <= set(doc["figures"])
    e2e = doc["e2e"]
    assert e2e["admit_latency_ms"]["p50"] <= e2e["admit_latency_ms"]["p99"]
    assert e2e["admissions_per_s"] > 0
    assert "skipped" in e2e["admission_burst"] or "p50" in json.dumps(e2e["admission_burst"])
    assert doc["ratios"]["structured_vs_free_8stream"]["tiny"] > 0
    assert set(doc["structured"]["decode_tokens_per_s"]) == {"free", "constrained_overlap",
                                                            "constrained_after_run"}
    roof = doc["roofline"]["tiny"]
    assert roof["weight_bytes_per_token"] > 0 and roof["read_bandwidth_bytes_per_s"] > 0
    assert roof["probe_threads"] == doc["settings"]["intra_op_threads"]
    assert roof["fraction_of_bandwidth_limit"] > 0 and doc["dram_read_bandwidth"]["bytes_per_s"] > 0
    assert doc["serving"]["capacity_per_s"] > 0 and doc["serving"]["capacity_run"]["errors"] == 0
    serving = doc["serving"]["by_rate"]
    assert len(serving) == 2 and serving[0]["rate_per_s"] < serving[1]["rate_per_s"]
    for r in serving:
        assert r["completed"] == r["requests"] == doc["serving"]["requests_per_rate"], r["first_errors"]
        assert r["output_lengths_pinned"] and r["throughput_tokens_per_s"] > 0
        assert r["ttft_ms"]["p50"] <= r["ttft_ms"]["p99"] and r["tpot_ms"]["p50"] <= r["tpot_ms"]["p99"]
    # The token path's CPU per delivered token, per process, the worker's split at ORT.
    for dp in (doc["dataplane"]["tiny_32streams"], doc["dataplane"]["int4_gateway_16streams"]):
        figures = dp["figures"]
        assert figures["scheduler_cpu_us_per_token"]["median"] >= 0
        assert figures["worker_ort_cpu_us_per_token"]["median"] > 0
        assert 0 < figures["messages_per_token"]["median"] <= 1
        assert figures["delivered_tokens_per_s"]["median"] > 0
    assert "gateway_cpu_us_per_token" in doc["dataplane"]["int4_gateway_16streams"]["figures"]
    # The served path without the model (the rate-set worker): every path, the defaults
    # reading from the worker (the scheduler relays nothing on them).
    for path in ("gateway_default", "gateway_relay", "gateway_direct", "client_default",
                 "client_relay", "client_direct"):
        figures = doc["dataplane"][f"rate_set_32streams_{path}"]["figures"]
        assert figures["delivered_tokens_per_s"]["median"] > 0
        assert figures["inter_chunk_p50_ms"]["median"] <= figures["inter_chunk_p99_ms"]["median"]
        relayed = figures["scheduler_relayed_messages_per_token"]["median"]
        assert (relayed > 0) == path.endswith("relay"), path
    # The load sweep: ortserve and genai's Engine harness under the same Poisson chat mix
    # (llama-server has no GGUF of the tiny model), at half and twice ortserve's saturation.
    load = doc["load"]
    assert load["goal"]["ttft_ms"] == 2_000 and load["goal"]["itl_p99_ms"] == 200
    assert load["saturation"]["rate_per_s"] > 0 and "closed-loop" in load["saturation"]["how"]
    assert [r["fraction_of_saturation"] for r in load["by_rate"]] == [0.5, 2.0]
    assert "llama_server" in load["skipped"] and "skipped" in load["goodput_vs_llama_server"]
    systems = {"ortserve", "genai_engine"} - set(load["skipped"])
    assert "ortserve" in systems and "not a server" in json.dumps(load["systems"])
    for row in load["by_rate"]:
        assert set(row["systems"]) == systems
        for system in row["systems"].values():
            assert sum(system["outcomes"].values()) == system["requests"] > 0
            assert 0 <= system["goodput_per_s"] <= system["completed_per_s"]
            assert system["throughput_tokens_per_s"] > 0
            for key in ("ttft_ms", "itl_ms", "e2e_ms"):
                assert system[key]["p50"] <= system[key]["p99"], (key, system[key])
    assert ("genai_engine" in load["skipped"]) == ("skipped" in load["goodput_vs_genai_engine"])
    if "genai_engine" in systems:
        assert set(load["goodput_vs_genai_engine"]) == {"2x"}
    png = load["png"]
    assert ("path" in png and Path(png["path"]).stat().st_size > 0) or "matplotlib" in png["skipped"]
    assert "engine_vs_genai_1stream" in run.stdout and "serving @" in run.stdout  # the table
    assert "bench:" not in run.stdout and "engine_ready" not in run.stdout  # notices stay on stderr
