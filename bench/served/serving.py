"""A serving run through the real processes: Poisson arrivals, mixed lengths, latency percentiles.

Requests arrive at a fixed mean rate (exponential gaps, seeded) at a scheduler
and worker started as processes (devtools.cluster.LocalCluster). Each request
is a token-id prompt of a drawn length with min_new_tokens = max_new_tokens,
so its output length is pinned too (the model often emits EOS at once on
plain text). Per rate: output tokens/s over the run, TTFT (send -> first
chunk) and time per output token ((last chunk - first chunk) / (tokens - 1),
per request) p50/p99, as the client sees them. The rates are fractions of a
capacity measured first on the same processes: a burst of requests of the same
mix sent at once, completed requests per second.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass

import numpy as np

FILLER = ("The history of the river valley is a long one. Farmers came first, then traders, "
          "then the railway, and each left its mark on the towns along the water. ")


@dataclass
class Outcome:
    prompt_tokens: int
    new_tokens: int
    t_send: float
    t_first: float = 0.0
    t_last: float = 0.0
    tokens: int = 0
    error: str = ""


def make_requests(tokenizer_json, n: int, prompt_lengths, output_lengths, seed: int) -> list[tuple]:
    """n (prompt ids, new tokens) pairs, lengths drawn from the given choices."""
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(tokenizer_json)).encode(FILLER * 40).ids
    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = rng.choice(prompt_lengths)
        start = rng.randrange(0, len(ids) - length)
        out.append((ids[start:start + length], rng.choice(output_lengths), i))
    return out


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def one_request(client, prompt_ids, new_tokens, outcome: Outcome) -> None:
    try:
        stream = client.stream(list(prompt_ids), max_new_tokens=new_tokens, min_new_tokens=new_tokens)
        for chunk in stream:
            now = time.perf_counter()
            if not outcome.t_first:
                outcome.t_first = now
            outcome.t_last = now
            outcome.tokens += len(chunk.token_ids)
    except Exception as exc:  # a rejection or failure is a result of the run, counted
        outcome.error = f"{type(exc).__name__}: {exc}"[:200]


def run_rate(client, requests: list[tuple], rate_per_s: float, seed: int, timeout_s: float) -> dict:
    """Send `requests` at Poisson arrivals of mean `rate_per_s`; wait for all; summarise."""
    rng = random.Random(seed)
    outcomes: list[Outcome] = []
    threads = []
    start = time.perf_counter()
    due = start
    for prompt_ids, new_tokens, _ in requests:
        due += rng.expovariate(rate_per_s)
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        outcome = Outcome(len(prompt_ids), new_tokens, time.perf_counter())
        outcomes.append(outcome)
        t = threading.Thread(target=one_request, args=(client, prompt_ids, new_tokens, outcome),
                             daemon=True)
        t.start()
        threads.append(t)
    arrivals_s = time.perf_counter() - start
    deadline = time.perf_counter() + timeout_s
    for t in threads:
        t.join(max(0.0, deadline - time.perf_counter()))
    ok = [o for o in outcomes if not o.error and o.tokens]
    errors = [o.error for o in outcomes if o.error or not o.tokens]
    end = max((o.t_last for o in ok), default=start)
    ttft = [(o.t_first - o.t_send) * 1e3 for o in ok]
    tpot = [(o.t_last - o.t_first) * 1e3 / (o.tokens - 1) for o in ok if o.tokens > 1]
    tokens = sum(o.tokens for o in ok)
    pinned = all(o.tokens == o.new_tokens for o in ok)
    return {
        "rate_per_s": rate_per_s, "requests": len(outcomes), "completed": len(ok),
        "errors": len(errors), "first_errors": errors[:3],
        "offered_rate_per_s": len(outcomes) / arrivals_s if arrivals_s else float("nan"),
        "output_tokens": tokens, "output_lengths_pinned": pinned,
        "wall_s": end - start, "throughput_tokens_per_s": tokens / (end - start) if end > start else 0.0,
        "completed_per_s": len(ok) / (end - start) if end > start else 0.0,
        "ttft_ms": {"p50": percentile(ttft, 50), "p99": percentile(ttft, 99), "unit": "ms"},
        "tpot_ms": {"p50": percentile(tpot, 50), "p99": percentile(tpot, 99), "unit": "ms"},
    }


def serving_run(model_dir, threads: int, fractions: list[float], n_requests: int, prompt_lengths,
                output_lengths, log_dir, kv_capacity: str = "2GiB", timeout_s: float = 600,
                burst: int = 12) -> dict:
    """Rates are `fractions` of the capacity measured first, on the same processes: `burst`
    requests of the mix sent at once (closed loop), completed requests per second."""
    from ortserve_client import Client

    from devtools.cluster import LocalCluster

    requests = make_requests(model_dir / "tokenizer.json", n_requests, prompt_lengths,
                             output_lengths, seed=13)
    results = []
    with LocalCluster(model_dir=model_dir, workers=1, log_dir=log_dir, threads=threads,
                      kv_capacities=[kv_capacity]) as cluster, Client(cluster.address,
                                                                 timeout_s=timeout_s) as client:
        client.generate(list(requests[0][0]), max_new_tokens=4, min_new_tokens=4)  # warm-up
        saturated = run_rate(client, requests[:burst], 1e6, seed=99, timeout_s=timeout_s)
        capacity = saturated["completed_per_s"]
        rates = [round(f * capacity, 3) for f in fractions]
        for i, rate in enumerate(rates):
            results.append(run_rate(client, requests, rate, seed=100 + i, timeout_s=timeout_s))
    return {"model": str(model_dir), "kv_capacity": kv_capacity, "requests_per_rate": n_requests,
            "capacity_per_s": capacity, "capacity_run": saturated,
            "rate_fractions_of_capacity": list(fractions),
            "prompt_lengths": list(prompt_lengths), "output_lengths": list(output_lengths),
            "mean_output_tokens": sum(r[1] for r in requests) / len(requests),
            "mean_prompt_tokens": sum(len(r[0]) for r in requests) / len(requests),
            "by_rate": results}
