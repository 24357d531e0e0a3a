"""One stream through the real processes (client -> scheduler -> worker) beside the engine in process.

The same metric on both sides (tokens after the first / first -> last token),
interleaved per repeat; the Admit latency and burst are measured on the same
cluster.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench.common.measure import ForeignLoad, progress, window_rate
from bench.peers.engine_peers import InProcessEngine
from bench.served.admission import admission_burst, admission_latency
from devtools.cluster import LocalCluster


def client_decode(client, prompt, new_tokens: int) -> dict:
    """One stream as the client sees it: decode tokens/s after the first chunk, and TTFT."""
    start = time.perf_counter()
    times, counts = [], []
    for chunk in client.stream(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens):
        times.append(time.perf_counter())
        counts.append(len(chunk.token_ids))
    if sum(counts) != new_tokens:
        raise RuntimeError(f"e2e bench: {sum(counts)} tokens, asked for exactly {new_tokens}")
    return {"decode": window_rate([times], [counts]), "ttft_ms": (times[0] - start) * 1e3}


def e2e_vs_inprocess(path: Path, threads: int, new_tokens: int, repeats: int, log_dir: Path,
                     admissions: int) -> dict:
    """1 stream, the same metric both sides (tokens after the first / first -> last token),
    interleaved: the engine in this process, then a client through scheduler and worker."""
    from ortserve_client import Client

    ours = InProcessEngine(path, threads)
    try:
        with LocalCluster(model_dir=path, workers=1, log_dir=log_dir, threads=threads,
                          kv_capacities=["1GiB"]) as cluster, \
                Client(cluster.address, timeout_s=600) as client:
            ours.decode(1, 8)
            client_decode(client, list(ours.ids), 8)  # warm-ups
            e2e, inproc, e2e_ttft, inproc_ttft, loads_in, loads_e2e = [], [], [], [], [], []
            for r in range(repeats):
                progress(f"e2e: repeat {r + 1}/{repeats}")
                with ForeignLoad() as la:
                    a = ours.decode(1, new_tokens)
                with ForeignLoad(tuple(svc.process.pid for svc in cluster.services)) as lb:
                    b = client_decode(client, list(ours.ids), new_tokens)
                loads_in.append(la.cores)
                loads_e2e.append(lb.cores)
                inproc.append(a["decode"])
                inproc_ttft.append(a["ttft_ms"])
                e2e.append(b["decode"])
                e2e_ttft.append(b["ttft_ms"])
            progress(f"e2e: Admit latency, {admissions} Admit + Release pairs")
            admission = admission_latency(client, admissions)
            burst = admission_burst(client)
    finally:
        ours.close()
    return {"e2e": e2e, "inprocess": inproc, "loads_e2e": loads_e2e, "loads_in": loads_in, "e2e_ttft": e2e_ttft, "inprocess_ttft": inproc_ttft,
            "admission": admission, "burst": burst}
