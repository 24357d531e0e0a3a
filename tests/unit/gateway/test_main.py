"""ortserve-gateway's flags for the token path: --direct-to-workers, worker TLS, the stream interval."""

from __future__ import annotations

import pytest

from gateway.__main__ import parse_config


def test_the_direct_path_is_the_default_where_reachable_and_named_by_flag_or_environment(
        monkeypatch):
    plain = parse_config([])
    # None: the two-step path to the workers the gateway reaches, relayed to the others.
    assert plain.direct_to_workers is None and plain.stream_interval_ms == 20
    on = parse_config(["--direct-to-workers", "--stream-interval-ms", "50"])
    assert on.direct_to_workers and on.stream_interval_ms == 50
    monkeypatch.setenv("ORTSERVE_GATEWAY_DIRECT_TO_WORKERS", "1")
    monkeypatch.setenv("ORTSERVE_GATEWAY_STREAM_INTERVAL_MS", "20")
    env = parse_config([])
    assert env.direct_to_workers and env.stream_interval_ms == 20
    assert not parse_config(["--no-direct-to-workers"]).direct_to_workers


def test_worker_tls_needs_all_three_files_and_the_interval_its_bound(tmp_path, capsys):
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    with pytest.raises(SystemExit):
        parse_config(["--direct-to-workers", "--worker-tls-ca", str(ca)])
    assert "--worker-tls-cert" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_config(["--stream-interval-ms", "10001"])
    assert "10,000" in capsys.readouterr().err


def test_tls_to_the_scheduler_without_worker_certificates_keeps_the_relay(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    assert parse_config(["--cacert", str(ca)]).direct_to_workers is False
    with_certs = [f"--worker-tls-{n}={ca}" for n in ("ca", "cert", "key")]
    assert parse_config(["--cacert", str(ca), *with_certs]).direct_to_workers is None
    assert parse_config(["--cacert", str(ca), "--direct-to-workers"]).direct_to_workers is True


def test_processes_share_one_port_within_a_bound(capsys):
    assert parse_config([]).processes == 1
    assert parse_config(["--processes", "4"]).processes == 4
    with pytest.raises(SystemExit):
        parse_config(["--processes", "0"])
    assert "argument --processes: 0 is outside 1 to 64" in capsys.readouterr().err
