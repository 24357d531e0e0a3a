"""A fault run under load: clients over gRPC and the gateway while the cluster is broken.

  python -m devtools.chaos --duration-s 600 --clients 64 --report chaos.json   (make chaos)

A scheduler, workers and a gateway as real processes (devtools.cluster); `--clients`
threads send generations over gRPC (Scheduler.Generate, with deadlines; some cancel
mid-stream, some close their channel and vanish) and through the gateway (chat, whole or
streamed; some streamed readers vanish). Meanwhile the faults: the scheduler killed and
restarted on its ports (twice, by default), workers killed and restarted at random, a
worker SIGSTOPped past the lease TTL and resumed.

Checked every second: reserved <= capacity, reserved = the sum of the live leases (one
GetBudget), and, per lease, a worker never holds more KV than the ledger charges it (the
worker's Info.held_leases read between two GetBudgets: a charge comes before the KV, a
release after it, so a lease the worker holds is in one of the two snapshots unless it
was charged and released within that window; one the ledger had shown before and shows
in neither is held after its release: a violation). At the end:
every request ended with tokens or a clean status (no INTERNAL or UNKNOWN, no HTTP 500,
none past its deadline), and once the load stops the ledger and every worker hold 0.
The JSON report: counts by outcome, the invariant violations, the faults and how long
the cluster took to serve again after each (the longest recovery). Exit 1 when a check
failed. The short form runs in CI (tests/e2e/operations/test_chaos_e2e.py).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import random
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc

from devtools.chaos_checks import HeldLeaseCheck, budget_violations
from devtools.chaos_clients import Tally, grpc_request, http_request
from devtools.chaos_sessions import ParkedGate, SessionClient, SessionTally
from devtools.cluster import (
    LocalCluster,
    Service,
    _bin,
    model_cache,
    start_service,
    stop_service,
    wait_serving,
)
from ortserve.v1 import scheduler_pb2, scheduler_pb2_grpc, types_pb2, worker_pb2, worker_pb2_grpc

LEASE_TTL_S = 3.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Chaos:
    def __init__(self, model_dir: Path, log_dir: Path, workers: int, clients: int,
                 duration_s: float, scheduler_restarts: int, seed: int,
                 worker_args: list[str] | None = None, gateway_processes: int = 1,
                 sessions: int = 0) -> None:
        self.rng = random.Random(seed)
        self.clients, self.duration_s = clients, duration_s
        self.scheduler_restarts = scheduler_restarts
        self.tally = Tally()
        self.stop = threading.Event()
        self.port, self.internal_port = free_port(), free_port()
        self.cluster = LocalCluster(
            model_dir=model_dir, workers=workers, threads=1, log_dir=log_dir,
            scheduler_port=self.port, kv_capacities=["2MiB"] * workers,
            worker_args=[*(worker_args or []),
                         *(["--session-disk-after-s", "0"] if sessions else [])],
            session_root=log_dir / "sessions" if sessions else None,
            scheduler_args=["--internal-port", str(self.internal_port),
                            "--heartbeat-interval-s", "0.5", "--lease-ttl-s", str(LEASE_TTL_S),
                            "--worker-keepalive-s", "1", "--max-queue-wait-s", "2"])
        self.gateway: Service | None = None
        self.gateway_processes = gateway_processes
        self.model = ""  # the served model's name, as the gateway lists it
        self.log_dir = log_dir
        self.faulting = threading.Lock()  # one fault at a time; the checker skips during one
        self.held_check = HeldLeaseCheck()  # rule 8 per lease, across the checks
        # Sessions on the workers' disk tiers across the faults (chaos_sessions.py).
        self.sessions = sessions
        self.gate = ParkedGate()
        self.session_tally = SessionTally()

    # -- the cluster ----------------------------------------------------------------------

    def start(self) -> None:
        self.cluster.start()
        self.gateway = start_service("gateway", [
            _bin("ortserve-gateway"), "--port", "0", "--scheduler", self.cluster.address,
            "--request-timeout-s", "20", "--processes", str(self.gateway_processes)],
            self.log_dir)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://{self.gateway.address}/v1/models",
                                            timeout=2) as reply:
                    self.model = json.load(reply)["data"][0]["id"]
                return
            except (urllib.error.URLError, OSError, IndexError, KeyError):
                time.sleep(0.2)
        raise RuntimeError(f"the gateway never listed a model; see {self.gateway.log_path}")

    def close(self) -> None:
        if self.gateway is not None:
            stop_service(self.gateway)
        for service in self.cluster.services:  # a stopped one would never see SIGTERM
            if service.process.poll() is None:
                service.process.send_signal(signal.SIGCONT)
        self.cluster.stop()

    def budget(self, timeout_s: float = 5.0) -> scheduler_pb2.GetBudgetResponse:
        with grpc.insecure_channel(self.cluster.address) as channel:
            return scheduler_pb2_grpc.SchedulerStub(channel).GetBudget(
                scheduler_pb2.GetBudgetRequest(include_leases=True), timeout=timeout_s)

    @staticmethod
    def worker_info(address: str) -> worker_pb2.WorkerInfo:
        with grpc.insecure_channel(address) as channel:
            return worker_pb2_grpc.WorkerStub(channel).Info(worker_pb2.InfoRequest(), timeout=2)

    def held_bytes(self, address: str) -> int:
        return self.worker_info(address).held_bytes

    # -- the clients ---------------------------------------------------------------------

    def grpc_request(self, rng: random.Random) -> None:
        grpc_request(self.cluster.address, rng, self.tally)

    def http_request(self, rng: random.Random) -> None:
        assert self.gateway is not None
        http_request(self.gateway.address, self.model, rng, self.tally)

    def client(self, index: int) -> None:
        rng = random.Random(index)
        while not self.stop.is_set():
            if rng.random() < 0.6:
                self.grpc_request(rng)
            else:
                self.http_request(rng)

    # -- the checks ------------------------------------------------------------------------

    def check_once(self) -> None:
        try:
            before = self.budget(2.0)
            helds: dict[str, dict[str, int]] = {}  # worker id -> lease id -> bytes it holds
            for worker in before.workers:
                with contextlib.suppress(grpc.RpcError):  # stopped or gone: nothing to read
                    info = self.worker_info(worker.address)
                    helds[worker.worker_id] = {h.lease_id: h.held_bytes for h in info.held_leases}
            after = self.budget(2.0)
        except grpc.RpcError:
            return  # the scheduler is down (a fault): nothing to check
        found = budget_violations(before, after) + self.held_check.check(helds, before, after)
        with self.tally.lock:
            self.tally.checks += 1
            self.tally.unverified_leases = self.held_check.unverified
            for violation in found:
                violation["at_s"] = round(time.monotonic() - self.t0, 1)
                self.tally.violations.append(violation)

    def checker(self) -> None:
        while not self.stop.is_set():
            self.check_once()
            self.stop.wait(1.0)

    # -- the faults ----------------------------------------------------------------------

    def recovered_in(self, since: float, limit_s: float = 90.0) -> float | None:
        """Seconds from `since` until a canary generation over gRPC gets its tokens."""
        while time.monotonic() - since < limit_s:
            try:
                with grpc.insecure_channel(self.cluster.address) as channel:
                    events = list(scheduler_pb2_grpc.SchedulerStub(channel).Generate(
                        types_pb2.GenerateRequest(text="Hi", max_new_tokens=4), timeout=10))
                if events and events[-1].WhichOneof("event") == "finished":
                    return time.monotonic() - since
            except grpc.RpcError:
                pass
            time.sleep(0.2)
        return None

    def fault(self, kind: str, act) -> None:
        with self.faulting:
            t = time.monotonic()
            what = act()
            ended = time.monotonic()
            recovery = self.recovered_in(ended)
        # recovered_in_s: from the fault's end (the process back, or resumed) to a served
        # request; the fault itself (a restart's start-up included) lasted fault_s.
        entry = {"fault": kind, "at_s": round(t - self.t0, 1), **what,
                 "fault_s": round(ended - t, 2),
                 "recovered_in_s": None if recovery is None else round(recovery, 2)}
        with self.tally.lock:
            self.tally.faults.append(entry)
        print(f"chaos: {entry}", file=sys.stderr, flush=True)

    def restart_scheduler(self) -> dict:
        old = self.cluster.services[0]
        old.process.kill()
        old.process.wait(10)
        self.cluster.services[0] = start_service("scheduler", [
            _bin("ortserve-scheduler"), "--host", "127.0.0.1", "--port", str(self.port),
            *self.cluster.scheduler_args], self.log_dir)
        wait_serving(self.cluster.services[0])
        return {}

    def worker_at(self, index: int) -> Service:
        return next(s for s in self.cluster.worker_services if s.name == f"worker-{index}")

    def kill_worker(self) -> dict:
        index = self.rng.randrange(len(self.cluster.worker_services))
        service = self.worker_at(index)
        # Every session on disk at the kill (none mid-turn): each must continue after it.
        parked = self.gate.close(60.0) if self.sessions else True
        try:
            service.process.kill()
            service.process.wait(10)
            time.sleep(self.rng.uniform(0.5, 3.0))
            self.cluster.services.remove(service)
            port = service.address.rsplit(":", 1)[1]
            wait_serving(self.cluster.start_worker(index, ["--port", port]), "ortserve.v1.Worker")
        finally:
            self.gate.open()
        return {"worker": service.name, **({} if parked else {"sessions_not_parked": True})}

    def stop_worker(self) -> dict:
        service = self.worker_at(self.rng.randrange(len(self.cluster.worker_services)))
        service.process.send_signal(signal.SIGSTOP)
        time.sleep(LEASE_TTL_S + 2.0)  # past the lease TTL: its leases expire
        service.process.send_signal(signal.SIGCONT)
        return {"worker": service.name, "stopped_s": LEASE_TTL_S + 2.0}

    def faults(self) -> None:
        """Scheduler restarts spread over the run; between them, worker kills and stops."""
        plan = itertools.cycle(["kill_worker", "stop_worker", "kill_worker"])
        restarts_at = [self.duration_s * (i + 1) / (self.scheduler_restarts + 1)
                       for i in range(self.scheduler_restarts)]
        while not self.stop.is_set():
            elapsed = time.monotonic() - self.t0
            if restarts_at and elapsed >= restarts_at[0]:
                restarts_at.pop(0)
                self.fault("scheduler_restart", self.restart_scheduler)
            else:
                kind = next(plan)
                self.fault(kind, getattr(self, kind))
            self.stop.wait(self.rng.uniform(3.0, 8.0))

    # -- the run ---------------------------------------------------------------------------

    def run(self) -> dict:
        self.t0 = time.monotonic()
        threads = [threading.Thread(target=self.client, args=(i,), daemon=True)
                   for i in range(self.clients)]
        threads += [threading.Thread(target=SessionClient(self.cluster.address, i, self.gate,
                                                          self.session_tally, self.stop).run,
                                     daemon=True) for i in range(self.sessions)]
        threads += [threading.Thread(target=self.checker, daemon=True),
                    threading.Thread(target=self.faults, daemon=True)]
        for t in threads:
            t.start()
        self.stop.wait(self.duration_s)
        self.stop.set()
        with self.faulting:  # the last fault has recovered
            pass
        for t in threads:
            t.join(60)
        hung_threads = sum(t.is_alive() for t in threads)
        # After the load: every lease released, every worker's KV freed.
        deadline = time.monotonic() + LEASE_TTL_S + 30
        reserved, held = None, None
        while time.monotonic() < deadline:
            try:
                budget = self.budget()
                reserved = budget.total_reserved_bytes
                held = sum(self.held_bytes(w.address) for w in budget.workers)
                if reserved == 0 and held == 0:
                    break
            except grpc.RpcError:
                pass
            time.sleep(0.5)
        self.check_once()
        recoveries = [f["recovered_in_s"] for f in self.tally.faults]
        report = {
            "duration_s": self.duration_s, "clients": self.clients,
            "requests": sum(self.tally.outcomes.values()),
            "outcomes": dict(sorted(self.tally.outcomes.items())),
            "bad_requests": self.tally.bad_total,
            "bad_request_samples": self.tally.bad,
            "outcome_samples": self.tally.samples,
            "invariant_checks": self.tally.checks,
            "unverified_held_leases": self.tally.unverified_leases,
            "invariant_violations": self.tally.violations,
            "faults": self.tally.faults,
            "longest_recovery_s": max((r for r in recoveries if r is not None), default=None),
            "unrecovered_faults": sum(r is None for r in recoveries),
            "after_load": {"reserved_bytes": reserved, "held_bytes": held},
            "threads_still_running": hung_threads,
            "sessions": self.session_tally.report(),
        }
        report["ok"] = (report["bad_requests"] == 0 and not report["invariant_violations"]
                        and report["unrecovered_faults"] == 0 and reserved == 0 and held == 0
                        and hung_threads == 0 and report["sessions"]["lost"] == 0
                        and report["sessions"]["changed"] == 0)
        return report


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m devtools.chaos", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration-s", type=float, default=600.0, help="how long the load runs")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--scheduler-restarts", type=int, default=2)
    p.add_argument("--model-dir", type=Path, default=model_cache() / "models" / "tiny-llama")
    p.add_argument("--log-dir", type=Path, default=Path("logs/chaos"))
    p.add_argument("--report", type=Path, help="write the JSON report here too")
    p.add_argument("--seed", type=int, default=40)
    p.add_argument("--gateway-processes", type=int, default=2,
                   help="the gateway's --processes: two by default, so a request's calls may "
                        "land on different processes, as behind any load balancer")
    p.add_argument("--sessions", type=int, default=4,
                   help="session clients (chaos_sessions.py): token-id sessions on the "
                        "workers' disk tiers across the faults, none lost or changed; 0: none")
    p.add_argument("--worker-arg", action="append", default=[], metavar="ARG",
                   help="given to every worker (repeatable), e.g. --worker-arg=--speculative "
                        "--worker-arg=ngram")
    a = p.parse_args(argv)
    chaos = Chaos(a.model_dir, a.log_dir, a.workers, a.clients, a.duration_s,
                  a.scheduler_restarts, a.seed, worker_args=a.worker_arg,
                  gateway_processes=a.gateway_processes, sessions=a.sessions)
    try:
        chaos.start()
        report = chaos.run()
    finally:
        chaos.close()
    text = json.dumps(report, indent=2)
    if a.report:
        a.report.write_text(text + "\n")
    print(text)  # the result: stdout
    sys.exit(0 if report["ok"] else 1)


if __name__ == "__main__":
    main()
