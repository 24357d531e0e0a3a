"""The worker's retry line names a likely cause for the transport errors measured against a
real scheduler (grpcio 1.85). The strings are grpc's own, copied from runs."""

from __future__ import annotations

import pytest

from worker_service.scheduler_link import likely_cause

A = "127.0.0.1:50061"
LAST = "failed to connect to all addresses; last error: "
MEASURED = {
    "plaintext to a TLS port": (False, LAST + f"UNAVAILABLE: ipv4:{A}: Socket closed",
                                "requires TLS"),
    "TLS to a plaintext port": (True, LAST + f"UNKNOWN: ipv4:{A}: Tls handshake failed "
                                "(TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:100000f7:SSL "
                                "routines:OPENSSL_internal:WRONG_VERSION_NUMBER: Invalid "
                                "certificate verification context: OK", "does not speak TLS"),
    "a certificate the scheduler refuses": (True, LAST + f"UNAVAILABLE: ipv4:{A}: Socket closed",
                                            "refused this worker's certificate"),
    "a CA that did not sign the scheduler": (True, LAST + f"UNKNOWN: ipv4:{A}: Tls handshake "
                                             "failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: "
                                             "error:1000007d:SSL routines:OPENSSL_internal:"
                                             "CERTIFICATE_VERIFY_FAILED: unable to get local "
                                             "issuer certificate: OK", "--tls-ca"),
    "a certificate for another name": (True, LAST + f"UNKNOWN: ipv4:{A}: Custom verification "
                                       "check failed with error: UNAUTHENTICATED: Hostname "
                                       "Verification Check failed.", "does not name the host"),
    "nothing listening": (False, LAST + f"UNKNOWN: ipv4:{A}: Failed to connect to remote "
                          "host: Connection refused", "nothing listens"),
}


@pytest.mark.parametrize("case", sorted(MEASURED))
def test_each_measured_failure_gets_its_cause_and_next_step(case):
    tls, details, words = MEASURED[case]
    assert words in likely_cause(details, tls, A)


def test_an_unrecognised_failure_claims_no_cause():
    assert likely_cause("Deadline Exceeded", False, A) == ""
