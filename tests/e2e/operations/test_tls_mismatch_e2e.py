"""A worker and a scheduler that disagree about TLS: the worker's retry line names the
likely cause and the next step, instead of "unreachable" alone.
Real processes, real certificates, the real default model."""

from __future__ import annotations

import json
import time

import pytest

from devtools.cluster import start_service, stop_service
from tests.certs import make_certs
from tests.e2e.conftest import BIN, require_model

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def scheduler_args(tls_dir=None) -> list[str]:
    args = [str(BIN / "ortserve-scheduler"), "--host", "127.0.0.1", "--port", "0",
            "--internal-port", "0", "--log-json"]
    if tls_dir is not None:
        args += ["--tls-cert", str(tls_dir / "scheduler.pem"), "--tls-key",
                 str(tls_dir / "scheduler-key.pem"), "--tls-ca", str(tls_dir / "ca.pem")]
    return args


def worker_args(internal_address: str, tls_dir=None) -> list[str]:
    args = [str(BIN / "ortserve-worker"), "--model-dir", str(require_model()),
            "--scheduler", internal_address, "--host", "127.0.0.1", "--port", "0",
            "--kv-capacity", "64MiB", "--threads", "1", "--log-json"]
    if tls_dir is not None:
        args += ["--tls-cert", str(tls_dir / "worker.pem"), "--tls-key",
                 str(tls_dir / "worker-key.pem"), "--tls-ca", str(tls_dir / "ca.pem")]
    return args


def first_retry(worker, timeout_s: float = 90.0) -> dict:
    """The worker's first 'scheduler unreachable' record (every line must be JSON)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        records = [json.loads(line) for line in worker.log_path.read_text().splitlines()
                   if line.strip()]
        for record in records:
            if record["event"] == "scheduler unreachable; retrying":
                return record
        assert worker.process.poll() is None, worker.log_tail()
        time.sleep(0.2)
    pytest.fail(f"no retry line in {timeout_s:g} s:\n{worker.log_tail()}")


@pytest.mark.parametrize(("scheduler_tls", "words"), [
    (True, ["requires TLS", "--tls-cert", "--tls-ca"]),  # a plaintext worker, a TLS port
    (False, ["does not speak TLS", "--tls-cert"]),  # a TLS worker, a plaintext port
], ids=["plaintext-worker-to-tls-scheduler", "tls-worker-to-plaintext-scheduler"])
def test_a_tls_mismatch_is_named_in_the_workers_retry_line(tmp_path, scheduler_tls, words):
    certs = make_certs(tmp_path / "certs")
    scheduler = start_service("scheduler", scheduler_args(certs.dir if scheduler_tls else None),
                              tmp_path / "logs")
    worker = None
    try:
        internal = scheduler.banner.split()[-1]
        worker = start_service("worker", worker_args(internal, None if scheduler_tls else certs.dir),
                               tmp_path / "logs", timeout_s=120)
        retry = first_retry(worker)
        assert retry["code"] == "UNAVAILABLE" and retry["scheduler"] == internal
        for word in words:
            assert word in retry["likely_cause"], retry
    finally:
        if worker is not None:
            stop_service(worker)
        stop_service(scheduler)
