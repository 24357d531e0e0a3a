"""The worker's link to the scheduler: its retry line names a likely cause for the
transport errors measured against a real scheduler (grpcio 1.85; the strings are grpc's
own, copied from runs), and a registration's refused leases stop their sequences."""

from __future__ import annotations

import asyncio

import pytest

from ortserve.v1 import internal_pb2, scheduler_pb2, types_pb2
from worker_service.scheduler_link import SchedulerLink, likely_cause

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


def test_a_lease_the_scheduler_refused_to_restore_stops_its_sequence():
    """Rule 8 at a re-registration: a live lease the ledger would not take back (it would
    exceed the registered capacity) must not keep KV the ledger does not charge."""
    class Stub:
        async def RegisterWorker(self, request, timeout):
            return scheduler_pb2.RegisterWorkerResponse(refused_lease_ids=["lease-b"])

    stopped: list[list[str]] = []

    async def stop_unrestored(lease_ids):
        stopped.append(lease_ids)

    async def run():
        live = [types_pb2.Lease(lease_id=i, reserved_bytes=1024) for i in ("lease-a", "lease-b")]
        link = SchedulerLink(A, scheduler_pb2.RegisterWorkerRequest(worker_id="worker-0"),
                             lambda: live)
        link._stub = Stub()
        link.stop_unrestored = stop_unrestored
        await link.register()
        await link._channel.close()

    asyncio.run(run())
    assert stopped == [["lease-b"]]


def test_a_clean_stop_deregisters_once_and_registers_no_more():
    """The goodbye names the address it registered from, and after it the heartbeat loop
    ends: a heartbeat answered known=false must not register this worker back."""
    calls: list[str] = []

    class Stub:
        async def RegisterWorker(self, request, timeout):
            calls.append("register")
            return scheduler_pb2.RegisterWorkerResponse(heartbeat_interval_s=0.01)

        async def Heartbeat(self, request, timeout):
            calls.append("heartbeat")
            return scheduler_pb2.HeartbeatResponse(known="deregister" not in calls)

        async def Deregister(self, request, timeout):
            calls.append("deregister")
            assert (request.worker_id, request.address) == ("worker-0", "10.0.0.1:50052")
            return internal_pb2.DeregisterResponse(known=True, released_leases=1)

    async def run():
        link = SchedulerLink(A, scheduler_pb2.RegisterWorkerRequest(
            worker_id="worker-0", address="10.0.0.1:50052"), lambda: [])
        link._stub = Stub()
        loop = asyncio.create_task(link.run())
        await link.registered.wait()
        assert await link.deregister()
        await asyncio.wait_for(loop, 5)  # ends by itself: nothing left to renew
        assert not await link.deregister()  # told once: not registered any more
        await link._channel.close()

    asyncio.run(run())
    assert calls.count("register") == 1 and calls.count("deregister") == 1
