"""The server's default ceiling for a request that sets no max_new_tokens: parsed from the
flag, resolved per model, reserved by the ledger instead of the window, and said."""

from __future__ import annotations

import pytest

from ortserve.v1 import types_pb2
from scheduler_service import convert, default_tokens
from scheduler_service.__main__ import parse_config
from scheduler_service.ledger.ledger import (
    AdmissionRequest,
    Decision,
    Ledger,
    NewTokensSource,
    WorkerGeometry,
)

BPT = 46_080
CTX = 8_192


def ledger(capacity_tokens: int = CTX, context_length: int = CTX) -> Ledger:
    ledger = Ledger()
    ledger.register(WorkerGeometry(worker_id="w1", address="w1:1", model="m",
                                   context_length=context_length, bytes_per_token=BPT,
                                   capacity_bytes=capacity_tokens * BPT, block_tokens=1))
    return ledger


def test_an_unset_request_reserves_the_default_not_the_window():
    adm = ledger().admit(AdmissionRequest("r", prompt_tokens=37, default_max_new_tokens=512))
    assert adm.decision is Decision.ADMITTED
    assert adm.max_new_tokens == 512 and adm.reserved_bytes == (37 + 512) * BPT
    assert adm.max_new_tokens_source is NewTokensSource.SERVER_DEFAULT


def test_a_request_that_sets_its_own_is_unchanged_by_the_default():
    adm = ledger().admit(AdmissionRequest("r", prompt_tokens=37, max_new_tokens=3_000,
                                          default_max_new_tokens=512))
    assert adm.max_new_tokens == 3_000 and adm.max_new_tokens_source is NewTokensSource.REQUEST


def test_without_a_default_or_beyond_the_window_the_window_applies_and_says_so():
    none = ledger().admit(AdmissionRequest("r", prompt_tokens=37))
    assert none.max_new_tokens == CTX - 37
    assert none.max_new_tokens_source is NewTokensSource.CONTEXT_WINDOW
    beyond = ledger().admit(AdmissionRequest("r", prompt_tokens=8_000, default_max_new_tokens=512))
    assert beyond.max_new_tokens == CTX - 8_000
    assert beyond.max_new_tokens_source is NewTokensSource.CONTEXT_WINDOW


def test_the_default_rises_to_min_new_tokens():
    adm = ledger().admit(AdmissionRequest("r", prompt_tokens=37, min_new_tokens=700,
                                          default_max_new_tokens=512))
    assert adm.max_new_tokens == 700


def test_a_capped_default_says_the_default_was_asked():
    adm = ledger(capacity_tokens=37 + 100).admit(
        AdmissionRequest("r", prompt_tokens=37, default_max_new_tokens=512))
    assert adm.decision is Decision.CAPPED and adm.max_new_tokens == 100
    cap = adm.budget_cap
    assert cap.requested_max_new_tokens == 512 and cap.requested_was_unset
    assert cap.requested_source is NewTokensSource.SERVER_DEFAULT
    assert "server default" in cap.reason
    pb = convert.admission_to_pb(adm)
    assert pb.max_new_tokens_source == types_pb2.MAX_NEW_TOKENS_FROM_SERVER_DEFAULT
    assert pb.budget_cap.requested_source == types_pb2.MAX_NEW_TOKENS_FROM_SERVER_DEFAULT
    assert convert.budget_cap_from_pb(pb.budget_cap) == cap


def test_parse_every_model_and_per_model():
    parsed = default_tokens.parse(["1024", "smol=256, big=0"])
    assert parsed.for_model("other") == 1024
    assert parsed.for_model("smol") == 256
    assert parsed.for_model("big") is None  # 0: none, the remaining window
    assert default_tokens.parse([]).for_model("m") == default_tokens.DEFAULT_TOKENS
    assert default_tokens.parse(["0"]).for_model("m") is None


@pytest.mark.parametrize("bad", ["-1", "lots", "=5", "m=", "m=2.5", str(2**32)])
def test_parse_refuses_what_is_not_a_number_of_tokens(bad):
    with pytest.raises(ValueError, match="MODEL=N"):
        default_tokens.parse([bad])


def test_flag_and_variable(monkeypatch, capsys):
    monkeypatch.setenv("ORTSERVE_SCHEDULER_DEFAULT_MAX_NEW_TOKENS", "2048,smol=128")
    config = parse_config(["--default-max-new-tokens", "tiny=64"])
    assert config.default_max_new_tokens.for_model("x") == 2048
    assert config.default_max_new_tokens.for_model("smol") == 128
    assert config.default_max_new_tokens.for_model("tiny") == 64
    assert parse_config(["--default-max-new-tokens", "0"]).default_max_new_tokens.for_model("x") is None
    with pytest.raises(SystemExit):
        parse_config(["--default-max-new-tokens", "many"])
    assert "--default-max-new-tokens" in capsys.readouterr().err
