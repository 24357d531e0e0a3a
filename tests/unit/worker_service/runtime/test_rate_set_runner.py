"""The bench-only rate-set runner: the engine's own step loop, KV charges and events
around a runner that runs no model, refused outside the bench."""

from __future__ import annotations

import os

import pytest

from worker_service.__main__ import parse_config
from worker_service.core.sequence import SequenceRequest
from worker_service.engine.config import EngineConfig
from worker_service.engine.engine import Engine
from worker_service.runtime.rate_set_runner import BENCH_ENV, RateSetRunner


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for key in [k for k in os.environ if k.startswith("ORTSERVE_")]:
        monkeypatch.delenv(key)


def test_the_flag_is_refused_outside_the_bench(capsys):
    with pytest.raises(SystemExit) as exited:
        parse_config(["--model-dir", "m", "--bench-rate-set-tokens-per-s", "200"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "for benchmarks only" in err and BENCH_ENV in err


def test_the_flag_is_taken_in_the_bench(monkeypatch, capsys):
    monkeypatch.setenv(BENCH_ENV, "1")
    assert parse_config(["--model-dir", "m", "--bench-rate-set-tokens-per-s", "200"]
                        ).bench_rate_set_tokens_per_s == 200.0
    with pytest.raises(SystemExit):
        parse_config(["--model-dir", "m", "--bench-rate-set-tokens-per-s", "-1"])
    assert "--bench-rate-set-tokens-per-s -1" in capsys.readouterr().err


def test_a_rate_set_engine_streams_the_prompt_cycled_and_frees_its_kv(tiny_dir):
    config = EngineConfig(model_dir=tiny_dir, intra_op_threads=1, max_batch_rows=4,
                          bench_rate_set_tokens_per_s=1000.0)
    with Engine(config) as engine:
        assert isinstance(engine.runner, RateSetRunner)
        assert engine.provider == "BenchRateSet"  # Info says no execution provider ran
        prompt = tuple(engine.tokenizer.encode("the quick brown fox"))
        done = [engine.generate(SequenceRequest(f"r{i}", prompt, 10, min_new_tokens=10))
                for i in range(3)]
        assert engine.runner.ort_cpu_s == 0.0
        assert engine.held_bytes() == 0
    for d in done:
        assert d.generated_tokens == 10
        assert d.token_ids == (prompt * 4)[:10]
