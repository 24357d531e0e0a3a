"""What became of each request under load, and the summary of a run (pure: no I/O).

A `RequestRecord` is filled by the load generator (bench/served/load.py) as the
stream arrives: the send time, each chunk's arrival and tokens, and the outcome:
- `done`: every token it asked for;
- `capped`: admitted with fewer tokens than asked (ortserve says so before the
  first token: `X-Ortserve-Decision: CAPPED`, `X-Ortserve-Budget-Cap`), by how many;
- `refused`: an HTTP error before the stream (status, code, message, Retry-After);
- `timed_out`: no end within the client's timeout (the request was cancelled);
- `error`: anything else (a broken stream, an error event mid-stream, fewer tokens
  than asked with no cap said).

`summarize` gives throughput, TTFT and inter-token latency percentiles, and goodput:
the requests per second that met the `Goal` (TTFT, the request's own p99 gap between
chunks, and, unless the goal allows less, every token asked for).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field

OUTCOMES = ("done", "capped", "refused", "timed_out", "error")


@dataclass(frozen=True)
class Goal:
    """The latency a request must meet to count toward goodput."""

    ttft_ms: float = 2_000.0
    itl_p99_ms: float = 200.0
    all_tokens: bool = True  # a capped or short answer misses the goal

    def describe(self) -> dict:
        return {**asdict(self), "itl": "the request's own 99th percentile gap between streamed "
                                       "chunks that carry text, send to first chunk for TTFT"}


@dataclass
class RequestRecord:
    """One request as the client saw it (times in seconds of time.perf_counter)."""

    index: int
    prompt_tokens: int
    wanted_tokens: int
    t_send: float
    t_first: float = 0.0
    t_end: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    tokens: int = 0  # generated, from the final usage (else the chunks counted)
    outcome: str = ""
    admitted_tokens: int = 0  # capped: what the server said it would give
    status: int = 0  # the HTTP status
    reason: str = ""  # refused / error: the error code or exception, and its message
    retry_after_s: float = 0.0
    agent: int = -1

    @property
    def ttft_ms(self) -> float:
        return (self.t_first - self.t_send) * 1e3 if self.t_first else math.nan

    @property
    def gaps_ms(self) -> list[float]:
        t = self.chunk_times
        return [(b - a) * 1e3 for a, b in zip(t, t[1:], strict=False)]

    @property
    def e2e_ms(self) -> float:
        return (self.t_end - self.t_send) * 1e3 if self.t_end else math.nan

    def itl_p99_ms(self) -> float:
        return percentile(self.gaps_ms, 99)

    def met(self, goal: Goal) -> bool:
        if self.outcome not in ("done", "capped") or not self.t_first:
            return False
        if goal.all_tokens and (self.outcome != "done" or self.tokens < self.wanted_tokens):
            return False
        itl = self.itl_p99_ms()
        return self.ttft_ms <= goal.ttft_ms and (math.isnan(itl) or itl <= goal.itl_p99_ms)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile by linear interpolation (numpy's default); NaN when empty."""
    if not values:
        return math.nan
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _quantiles(values: list[float]) -> dict:
    if not values:  # None, not NaN: the JSON stays standard
        return {"p50": None, "p90": None, "p99": None, "n": 0}
    return {"p50": percentile(values, 50), "p90": percentile(values, 90),
            "p99": percentile(values, 99), "n": len(values)}


def summarize(records: list[RequestRecord], goal: Goal, offered_rate_per_s: float | None,
              duration_s: float) -> dict:
    """A run's figures. `duration_s`: what throughput and goodput are counted over (the load
    generator: the arrival window, or first send to the last end when that is longer, as
    vLLM's benchmark duration); `offered_rate_per_s`: None for a closed loop. TTFT and ITL
    are over the requests that streamed (done or capped)."""
    counts = Counter(r.outcome for r in records)
    served = [r for r in records if r.outcome in ("done", "capped")]
    good = [r for r in records if r.met(goal)]
    tokens = sum(r.tokens for r in records if r.outcome in ("done", "capped", "error"))
    per_s = (lambda x: x / duration_s) if duration_s > 0 else (lambda x: 0.0)
    refused = [r for r in records if r.outcome == "refused"]
    capped = [r for r in records if r.outcome == "capped"]
    return {
        "offered_rate_per_s": offered_rate_per_s,
        "requests": len(records),
        "duration_s": duration_s,
        "outcomes": {k: counts.get(k, 0) for k in OUTCOMES},
        "throughput_tokens_per_s": per_s(tokens),
        "completed_per_s": per_s(len(served)),
        "goodput_per_s": per_s(len(good)),
        "good_requests": len(good),
        "ttft_ms": _quantiles([r.ttft_ms for r in served if r.t_first]),
        # Every gap of every streamed request, and each request's own p99 (the goal's unit).
        "itl_ms": _quantiles([g for r in served for g in r.gaps_ms]),
        "request_itl_p99_ms": _quantiles([x for r in served if not math.isnan(x := r.itl_p99_ms())]),
        "e2e_ms": _quantiles([r.e2e_ms for r in served]),
        # What became of the rest: why refused (and how fast), by how much capped.
        "refused": {"by_reason": dict(Counter(f"{r.status} {r.reason.split(':')[0]}" for r in refused)),
                    "time_to_refusal_ms": _quantiles([r.e2e_ms for r in refused]),
                    "with_retry_after": sum(1 for r in refused if r.retry_after_s > 0),
                    # Told when to come back or what to change (Retry-After, or a message that
                    # names a retry): refused with a remedy, against left to time out below.
                    "with_remedy": sum(1 for r in refused if r.retry_after_s > 0
                                       or "retry" in r.reason.lower()),
                    "first": refused[0].reason[:300] if refused else None},
        "capped": {"tokens_short": sum(r.wanted_tokens - r.admitted_tokens for r in capped),
                   "first": ({"wanted": capped[0].wanted_tokens, "admitted": capped[0].admitted_tokens}
                             if capped else None)},
        # The rest side by side: refused at once with a remedy, or left to wait and time out.
        "refused_with_remedy_vs_timed_out": [
            sum(1 for r in refused if r.retry_after_s > 0 or "retry" in r.reason.lower()),
            counts.get("timed_out", 0)],
        "errors_first": [r.reason[:300] for r in records if r.outcome == "error"][:3],
        "missed_goal": {"ttft": sum(1 for r in served if r.ttft_ms > goal.ttft_ms),
                        "itl": sum(1 for r in served if r.itl_p99_ms() > goal.itl_p99_ms),
                        "short": sum(1 for r in served if r.tokens < r.wanted_tokens)},
    }
