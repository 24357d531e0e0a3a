"""The llama.cpp peer is skipped with a reason where it cannot be built; its serving figures
merge into an existing results file."""

from __future__ import annotations

import json

from bench.peers import llama_peer, serving_peers


def test_without_a_compiler_the_build_is_skipped_naming_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTSERVE_MODEL_CACHE", str(tmp_path))
    monkeypatch.setattr(llama_peer.shutil, "which", lambda tool: None)
    found, why = llama_peer.build()
    assert found is None
    assert "cmake" in why and "apt-get install" in why
    assert not (tmp_path / "peers").exists()  # nothing downloaded


def test_the_serving_section_merges_into_the_results_keeping_the_rest(tmp_path):
    out = tmp_path / "results.json"
    out.write_text(json.dumps({"ratios": {"engine_vs_genai_1stream": {"fp32": 0.9}}, "x": 1}))
    serving_peers.merge_into(out, {"by_clients": {"8clients": {"ratio": 1.2}}})
    doc = json.loads(out.read_text())
    assert doc["x"] == 1 and doc["ratios"]["engine_vs_genai_1stream"] == {"fp32": 0.9}
    assert doc["ratios"]["serving_vs_llama_8clients"] == {"int4": 1.2}
    assert doc["serving_vs_llama"]["by_clients"]["8clients"]["ratio"] == 1.2


def test_prompts_are_distinct():
    ps = serving_peers.prompts(16, 3)
    assert len(set(ps)) == 16
