"""Human-readable notices about a generation: the budget cap, an unmet constraint and the
stats, for stderr.

Public so that tools besides the CLI (the local-cluster runner's demo, scripts,
benchmarks) print them the same way; stdout stays free for the generated text.
"""

from __future__ import annotations

import json
import sys
from typing import TextIO

from ortserve.status.units import human_bytes

from .types import BudgetCap, ConstraintResult, GenerateResult, Queued, TokenLogprob

PREFIX = "ortserve: "


def notice(text: str, file: TextIO | None = None) -> None:
    """Print one notice line, prefixed, on `file` (default: stderr), flushed at once."""
    print(f"{PREFIX}{text}", file=file or sys.stderr, flush=True)


def cap_notice(cap: BudgetCap) -> str:
    """One line saying that and why the KV budget reduced max_new_tokens, with the numbers."""
    if cap.limit == "deadline":
        return (f"CAPPED by the deadline: max_new_tokens {cap.requested_max_new_tokens:,}"
                f"{_unset(cap) if cap.requested_was_unset else ''}"
                f" -> {cap.admitted_max_new_tokens:,} at a predicted decode step of "
                f"{cap.predicted_step_ms:.1f} ms with {cap.deadline_ms / 1e3:.2f} s left on "
                f"worker {cap.worker_id}. {cap.reason}")
    if cap.limit == "tenant_quota":
        return (f"CAPPED by tenant {cap.tenant}'s KV quota: max_new_tokens "
                f"{cap.requested_max_new_tokens:,}"
                f"{' (unset: the remaining context window)' if cap.requested_was_unset else ''}"
                f" -> {cap.admitted_max_new_tokens:,}; needs {human_bytes(cap.requested_bytes)} at "
                f"{cap.bytes_per_token:,} B/token, reserved {human_bytes(cap.admitted_bytes)}; the "
                f"tenant held {human_bytes(cap.tenant_reserved_bytes)} of its "
                f"{human_bytes(cap.tenant_quota_bytes)} quota. {cap.reason}")
    return (f"CAPPED by the KV budget: max_new_tokens {cap.requested_max_new_tokens:,}"
            f"{_unset(cap) if cap.requested_was_unset else ''}"
            f" -> {cap.admitted_max_new_tokens:,}; needs {human_bytes(cap.requested_bytes)} at "
            f"{cap.bytes_per_token:,} B/token, reserved {human_bytes(cap.admitted_bytes)}, "
            f"{human_bytes(cap.available_bytes)} was free of {human_bytes(cap.capacity_bytes)} "
            f"on worker {cap.worker_id}. {cap.reason}")


def _unset(cap: BudgetCap) -> str:
    if cap.requested_source == "server_default":
        return " (unset: the server's default)"
    return " (unset: the remaining context window)"


def queued_notice(q: Queued) -> str:
    """One line saying that the request waits for KV budget, and where it stands."""
    return (f"QUEUED for KV budget: position {q.position:,} of {q.queue_length:,}, "
            f"{q.requests_ahead:,} ahead waiting for {human_bytes(q.bytes_ahead)}; this request "
            f"needs {human_bytes(q.needed_bytes)}; waited {q.waited_ms / 1e3:.1f} s of at most "
            f"{q.max_wait_ms / 1e3:.1f} s")


def constraint_notice(c: ConstraintResult) -> str:
    """One line saying that the output does not complete its constraint, and why (the
    server's reason names what ended it and what to change)."""
    return f"CONSTRAINT NOT SATISFIED: {c.reason}"


def logprob_line(index: int, lp: TokenLogprob) -> str:
    """One generated token's log-probability and its alternatives (texts quoted as JSON)."""
    top = ", ".join(f"{t.token_id} {json.dumps(t.token)} {t.logprob:.4f}" for t in lp.top_logprobs)
    return (f"stats: logprob[{index}] token_id={lp.token_id} token={json.dumps(lp.token)} "
            f"logprob={lp.logprob:.4f}" + (f" top=[{top}]" if lp.top_logprobs else ""))


def stats_lines(result: GenerateResult) -> list[str]:
    """The usage, timings, placement and cap of a finished generation, as key=value lines;
    then the constraint's result and each token's log-probability, when they were asked."""
    u, t, cap = result.usage, result.timings, result.budget_cap
    ceiling = (f"{u.max_new_tokens:,} (capped from {cap.requested_max_new_tokens:,} by the KV budget)"
               if cap else f"{u.max_new_tokens:,}")
    lines = [
        f"stats: finish_reason={result.finish_reason} prompt_tokens={u.prompt_tokens:,} "
        f"generated_tokens={u.generated_tokens:,} max_new_tokens={ceiling}",
        f"stats: ttft_ms={t.ttft_ms:.1f} prefill_ms={t.prefill_ms:.1f} queue_ms={t.queue_ms:.1f} "
        f"decode_ms={t.decode_ms:.1f} decode_tokens_per_s={t.decode_tokens_per_s:.1f} "
        f"total_ms={t.total_ms:.1f} queue_wait_ms={result.queue_wait_ms:.1f}",
        f"stats: worker={result.worker_id} model={result.model or '?'} "
        f"provider={result.execution_provider} "
        f"sampling={json.dumps(result.sampling) if result.sampling else 'greedy'}",
    ]
    if cap:
        lines.append(f"stats: budget_cap requested={cap.requested_max_new_tokens:,} "
                     f"admitted={cap.admitted_max_new_tokens:,} requested_bytes={cap.requested_bytes:,} "
                     f"admitted_bytes={cap.admitted_bytes:,} available_bytes={cap.available_bytes:,} "
                     f"capacity_bytes={cap.capacity_bytes:,} bytes_per_token={cap.bytes_per_token:,}"
                     + (f" limit=tenant_quota tenant={cap.tenant} "
                        f"tenant_quota_bytes={cap.tenant_quota_bytes:,} "
                        f"tenant_reserved_bytes={cap.tenant_reserved_bytes:,}"
                        if cap.limit == "tenant_quota" else "")
                     + (f" limit=deadline predicted_step_ms={cap.predicted_step_ms:.1f} "
                        f"deadline_ms={cap.deadline_ms:.0f}" if cap.limit == "deadline" else ""))
    if result.constraint is not None:
        c = result.constraint
        lines.append(f"stats: constraint satisfied={str(c.satisfied).lower()}"
                     + (f" reason={c.reason}" if c.reason else ""))
    lines.extend(logprob_line(i, lp) for i, lp in enumerate(result.logprobs))
    return lines


def print_stats(result: GenerateResult, file: TextIO | None = None) -> None:
    """Print stats_lines(result) as notices on `file` (default: stderr)."""
    for line in stats_lines(result):
        notice(line, file)
