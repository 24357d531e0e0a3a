"""The sweep's ratios are ortserve's goodput over each peer's at and past saturation only, a
skipped peer says why, and the section merges into an existing results file."""

from __future__ import annotations

import json

from bench.served.load_sweep import closed_ratios, merge_into, ratios


def row(fraction, ours, llama=None):
    systems = {"ortserve": {"goodput_per_s": ours}}
    if llama is not None:
        systems["llama_server"] = {"goodput_per_s": llama}
    return {"rate_per_s": fraction * 2.0, "fraction_of_saturation": fraction, "systems": systems}


def test_ratios_are_taken_at_and_past_saturation_keyed_by_the_multiple():
    by_rate = [row(0.5, 1.0, 1.0), row(1.0, 1.5, 1.0), row(2.0, 3.0, 2.0), row(4.0, 0.5, 0.0)]
    assert ratios(by_rate, "llama_server", 2.0, {}) == {"1x": 1.5, "2x": 1.5, "4x": None}


def test_a_skipped_peer_gives_its_reason_instead_of_ratios():
    got = ratios([row(1.0, 1.0)], "genai_engine", 2.0, {"genai_engine": "no .venv-tools"})
    assert got == {"skipped": "no .venv-tools"}


def test_closed_loop_ratios_are_tokens_per_second_keyed_by_users():
    def closed(users, ours, llama):
        return {"users": users, "systems": {"ortserve": {"throughput_tokens_per_s": ours},
                                            "llama_server": {"throughput_tokens_per_s": llama}}}
    got = closed_ratios([closed(1, 30.0, 40.0), closed(8, 90.0, 0.0)], "llama_server", {})
    assert got == {"1u": 0.75, "8u": None}
    assert closed_ratios([], "genai_engine", {"genai_engine": "no .venv-tools"}) == {
        "skipped": "no .venv-tools"}


def test_the_load_section_merges_into_the_results_keeping_the_rest(tmp_path):
    out = tmp_path / "results.json"
    out.write_text(json.dumps({"ratios": {"x": 1}, "load": {"old": True}}))
    merge_into(out, {"by_rate": []})
    assert json.loads(out.read_text()) == {"ratios": {"x": 1}, "load": {"by_rate": []}}


def test_a_llama_server_that_does_not_start_is_skipped_with_why_and_the_sweep_goes_on(
        tmp_path, monkeypatch):
    from bench.peers import llama_peer
    from bench.served.load_sweep import Systems

    monkeypatch.setattr(llama_peer, "binaries", lambda: {"llama-server": tmp_path / "s",
                                                         "llama-quantize": tmp_path / "q"})
    monkeypatch.setattr(llama_peer, "default_gguf", lambda: tmp_path / "x.gguf")
    monkeypatch.setattr(llama_peer, "q4_0_gguf", lambda quantize, source: tmp_path / "q4.gguf")

    def crash(*args, **kwargs):
        raise RuntimeError("llama-server exited -11 at start; see server.log")

    monkeypatch.setattr(llama_peer, "serve", crash)
    systems = Systems(tmp_path, threads=2, quick=False, log_dir=tmp_path)
    systems._llama()
    assert systems.skipped == {"llama_server": "llama-server did not start: llama-server exited -11 "
                                               "at start; see server.log"}
    assert "llama_server" not in systems.targets
