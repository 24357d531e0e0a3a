"""Keepalive pings: the options a channel gets, the servers' allowance, the scheduler's flag."""

from __future__ import annotations

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
