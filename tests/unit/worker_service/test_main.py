"""The worker's KV capacity flag: one word ("capacity"), the old "budget" names still
accepted with a notice naming the new one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from worker_service.__main__ import parse_config

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for key in [k for k in os.environ if k.startswith("ORTSERVE_")]:
        monkeypatch.delenv(key)


def parsed(*argv: str) -> tuple:
    notices: list[str] = []
    config = parse_config(["--model-dir", "m", *argv], notices)
    return config.kv_capacity_bytes, config.kv_capacity_fraction, notices


def test_kv_capacity_sets_the_workers_capacity_bytes_without_a_notice():
    assert parsed("--kv-capacity", "2GiB") == (2 * 2**30, 0.2, [])
    assert parsed("--kv-capacity-fraction", "0.5") == (None, 0.5, [])
    assert parsed() == (None, 0.2, [])


def test_the_environment_variables_follow_the_flags(monkeypatch):
    monkeypatch.setenv("ORTSERVE_WORKER_KV_CAPACITY", "64MiB")
    monkeypatch.setenv("ORTSERVE_WORKER_KV_CAPACITY_FRACTION", "0.25")
    assert parsed() == (64 * 2**20, 0.25, [])
    assert parsed("--kv-capacity", "1MiB") == (2**20, 0.25, [])  # a flag overrides its variable


def test_kv_budget_is_a_deprecated_alias_with_one_notice_naming_kv_capacity():
    assert parsed("--kv-budget", "2GiB") == (
        2 * 2**30, 0.2, ["--kv-budget is deprecated: use --kv-capacity (same meaning)"])
    assert parsed("--kv-budget-fraction", "0.5") == (
        None, 0.5, ["--kv-budget-fraction is deprecated: use --kv-capacity-fraction (same meaning)"])
    # Both given: the new name wins, the old one is still named.
    capacity, _, notices = parsed("--kv-capacity", "1GiB", "--kv-budget", "2GiB")
    assert capacity == 2**30 and len(notices) == 1


def test_the_old_environment_variable_is_a_deprecated_alias(monkeypatch):
    monkeypatch.setenv("ORTSERVE_WORKER_KV_BUDGET", "32MiB")
    assert parsed() == (32 * 2**20, 0.2, [
        "ORTSERVE_WORKER_KV_BUDGET is deprecated: use ORTSERVE_WORKER_KV_CAPACITY (same meaning)"])
    monkeypatch.setenv("ORTSERVE_WORKER_KV_CAPACITY", "16MiB")
    assert parsed()[0] == 16 * 2**20  # the new variable wins over the old one


def test_a_bad_capacity_names_the_flag(capsys):
    with pytest.raises(SystemExit) as exited:
        parsed("--kv-budget", "lots")
    assert exited.value.code == 2 and "--kv-capacity: " in capsys.readouterr().err


def test_help_shows_only_the_new_names(capsys):
    with pytest.raises(SystemExit):
        parse_config(["--help"])
    out = capsys.readouterr().out
    assert "--kv-capacity" in out and "--kv-capacity-fraction" in out and "budget" not in out


def test_shipped_deployments_use_the_new_names():
    for path in [ROOT / "compose.yaml", ROOT / "compose.tls.yaml", ROOT / "Dockerfile",
                 ROOT / "Makefile", *sorted((ROOT / "deploy").rglob("*.yaml"))]:
        text = path.read_text()
        assert "KV_BUDGET" not in text and "--kv-budget" not in text, path


def test_max_batch_rows_from_the_flag_or_its_variable_and_out_of_range_names_the_flag(
        monkeypatch, capsys):
    assert parse_config(["--model-dir", "m"]).max_batch_rows == 32
    assert parse_config(["--model-dir", "m", "--max-batch-rows", "64"]).max_batch_rows == 64
    monkeypatch.setenv("ORTSERVE_WORKER_MAX_BATCH_ROWS", "8")
    assert parse_config(["--model-dir", "m"]).max_batch_rows == 8
    with pytest.raises(SystemExit):
        parse_config(["--model-dir", "m", "--max-batch-rows", "0"])
    assert "argument --max-batch-rows: 0 is outside 1 to 1,024 (sequences running at once)" in capsys.readouterr().err


def test_max_context_tokens_from_the_flag_or_its_variable(monkeypatch, capsys):
    assert parse_config(["--model-dir", "m"]).max_context_tokens == 0
    assert parse_config(["--model-dir", "m", "--max-context-tokens", "2048"]).max_context_tokens == 2048
    monkeypatch.setenv("ORTSERVE_WORKER_MAX_CONTEXT_TOKENS", "4096")
    assert parse_config(["--model-dir", "m"]).max_context_tokens == 4096
    with pytest.raises(SystemExit):
        parse_config(["--model-dir", "m", "--max-context-tokens", "-1"])
    assert "-1 tokens is outside 0 to" in capsys.readouterr().err


def test_speculative_is_off_by_default_and_ngram_by_flag_or_variable(monkeypatch):
    assert parse_config(["--model-dir", "m"], []).speculative == "off"
    assert parse_config(["--model-dir", "m", "--speculative", "ngram"], []).speculative == "ngram"
    monkeypatch.setenv("ORTSERVE_WORKER_SPECULATIVE", "ngram")
    assert parse_config(["--model-dir", "m"], []).speculative == "ngram"
