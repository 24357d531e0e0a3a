"""Keepalive pings: the options a channel gets, the servers' allowance, the scheduler's and
the worker's flags."""

from __future__ import annotations

import os

import pytest

from ortserve.rpc import keepalive
from scheduler_service.__main__ import parse_config


def test_a_channel_pings_at_the_interval_and_gives_a_silent_peer_as_long():
    options = dict(keepalive.channel_options(2.5))
    assert options["grpc.keepalive_time_ms"] == 2500
    assert options["grpc.keepalive_timeout_ms"] == 2500
    assert options["grpc.http2.ping_timeout_ms"] == 2500  # a BDP ping in flight waits no longer
    assert options["grpc.http2.max_pings_without_data"] == 0  # a relay that only reads stays watched


def test_zero_is_off_and_outside_what_servers_accept_is_refused():
    assert keepalive.channel_options(0) == ()
    for bad in (0.5, -3, float("nan"), float("inf"), 86_401):
        with pytest.raises(ValueError, match="is outside 1-86400 s"):
            keepalive.channel_options(bad)


def test_servers_accept_pings_as_often_as_any_channel_may_send_them_and_ping_their_callers():
    options = dict(keepalive.SERVER_OPTIONS)
    assert options["grpc.http2.min_recv_ping_interval_without_data_ms"] <= \
        keepalive.MIN_INTERVAL_S * 1000
    pings = dict(keepalive.channel_options(keepalive.DEFAULT_INTERVAL_S))
    for name in ("grpc.keepalive_time_ms", "grpc.keepalive_timeout_ms",
                 "grpc.http2.ping_timeout_ms", "grpc.http2.max_pings_without_data"):
        assert options[name] == pings[name]


def test_the_schedulers_flag_and_its_variable(monkeypatch):
    assert parse_config([]).worker_keepalive_s == keepalive.DEFAULT_INTERVAL_S
    assert parse_config(["--worker-keepalive-s", "0"]).worker_keepalive_s == 0
    monkeypatch.setenv("ORTSERVE_SCHEDULER_WORKER_KEEPALIVE_S", "3")
    assert parse_config([]).worker_keepalive_s == 3
    assert parse_config(["--worker-keepalive-s", "4"]).worker_keepalive_s == 4


def test_a_bad_interval_names_the_flag(capsys):
    for bad in ("0.2", "inf", "nan"):
        with pytest.raises(SystemExit) as exit_:
            parse_config(["--worker-keepalive-s", bad])
        assert exit_.value.code == 2
        assert f"--worker-keepalive-s: a keepalive interval of {float(bad):g} s is outside" in \
            capsys.readouterr().err


def test_a_server_pings_its_callers_at_its_own_interval_or_not_at_all():
    three = dict(keepalive.server_options(3))
    assert three["grpc.keepalive_time_ms"] == three["grpc.keepalive_timeout_ms"] == 3000
    off = dict(keepalive.server_options(0))
    assert "grpc.keepalive_time_ms" not in off  # it still accepts its callers' pings:
    assert off["grpc.http2.min_recv_ping_interval_without_data_ms"] == keepalive.MIN_INTERVAL_S * 1000


def test_the_workers_caller_keepalive_flag_its_variable_and_a_bad_value(monkeypatch, capsys):
    from worker_service.__main__ import parse_config as worker_config

    for key in [k for k in os.environ if k.startswith("ORTSERVE_")]:
        monkeypatch.delenv(key)
    assert worker_config(["--model-dir", "m"]).caller_keepalive_s == keepalive.DEFAULT_INTERVAL_S
    assert worker_config(["--model-dir", "m", "--caller-keepalive-s", "0"]).caller_keepalive_s == 0
    monkeypatch.setenv("ORTSERVE_WORKER_CALLER_KEEPALIVE_S", "3")
    assert worker_config(["--model-dir", "m"]).caller_keepalive_s == 3
    assert worker_config(["--model-dir", "m", "--caller-keepalive-s", "4"]).caller_keepalive_s == 4
    with pytest.raises(SystemExit) as exit_:
        worker_config(["--model-dir", "m", "--caller-keepalive-s", "0.2"])
    assert exit_.value.code == 2
    assert "--caller-keepalive-s: a keepalive interval of 0.2 s is outside" in \
        capsys.readouterr().err
