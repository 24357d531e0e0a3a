"""Admission figures through a running scheduler: Admit latency, and a burst through the
admission queue. Both take an ortserve_client.Client connected to it."""

from __future__ import annotations

import time

import numpy as np


def admission_latency(client, n: int) -> dict:
    """Admit + Release pairs, sequential, a token-id prompt (no Worker.Tokenize hop)."""
    from ortserve_client.client import build_request

    from ortserve.v1 import scheduler_pb2

    stub = client._stub
    request = scheduler_pb2.AdmitRequest(request=build_request(list(range(1, 33)), max_new_tokens=64))
    latencies = []
    start = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter()
        adm = stub.Admit(request, timeout=10)
        latencies.append((time.perf_counter() - t0) * 1e3)
        stub.Release(scheduler_pb2.ReleaseRequest(lease_id=adm.lease_id,
                                                  lease_secret=adm.lease_secret), timeout=10)
    wall = time.perf_counter() - start
    lat = np.array(latencies)
    return {"admit_latency_ms": {"p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99)),
                                 "n": n, "unit": "ms"},
            "admissions_per_s": n / wall,
            "admission_note": "Admit + Release pairs, sequential, loopback, a 32-token token-id prompt"}


def admission_burst(client, n_clients: int = 64, hold_s: float = 0.05) -> dict:
    """A burst through the admission queue: n_clients Admit at once, each for about half of
    the worker's free bytes (two fit at once), waiting in the queue; each holds its lease
    hold_s, then releases. How many were served, the queue waits, the total time."""
    from concurrent.futures import ThreadPoolExecutor

    from ortserve_client.client import build_request

    from ortserve.v1 import scheduler_pb2, types_pb2

    stub = client._stub
    budget = stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=10)
    worker = max(budget.workers, key=lambda w: w.available_bytes)
    prompt = list(range(1, 33))
    tokens = max(int(worker.available_bytes // worker.bytes_per_token // 2) - 64, len(prompt) + 1)
    new_tokens = min(tokens - len(prompt), worker.context_length - len(prompt))
    request = scheduler_pb2.AdmitRequest(
        request=build_request(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens),
        max_queue_wait_ms=120_000)

    def one(_: int) -> tuple[str, float]:
        adm = stub.Admit(request, timeout=180)
        if adm.lease_id:
            time.sleep(hold_s)
            stub.Release(scheduler_pb2.ReleaseRequest(lease_id=adm.lease_id,
                                                      lease_secret=adm.lease_secret), timeout=10)
        return types_pb2.Decision.Name(adm.decision), adm.queue_wait_ms

    start = time.perf_counter()
    with ThreadPoolExecutor(n_clients) as pool:
        results = list(pool.map(one, range(n_clients)))
    wall_s = time.perf_counter() - start
    waits = np.array([wait for _, wait in results])
    return {"clients": n_clients, "served": sum(d in ("ADMITTED", "CAPPED") for d, _ in results),
            "wall_s": wall_s,
            "queue_wait_ms": {"p50": float(np.percentile(waits, 50)), "max": float(waits.max()),
                              "unit": "ms"},
            "fit_at_once": int(worker.available_bytes
                               // ((new_tokens + len(prompt)) * worker.bytes_per_token)),
            "note": f"{n_clients} concurrent Admits of {new_tokens + len(prompt):,} tokens each "
                    f"(fit_at_once of them fit the worker's free bytes; capped by the context "
                    f"window), each holding its lease {hold_s * 1e3:g} ms"}
