"""A load generator for any OpenAI-compatible server: streaming /v1/completions under a
seeded workload, arriving Poisson at a set rate or from a closed loop of N users.

  .venv/bin/python -m bench.served.load --url http://127.0.0.1:8000 [--mix chat|long|agentic]
      (--rate R --duration-s S | --users N --duration-s S) [--seed 1] [--model NAME]
      [--timeout-s 60] [--goal-ttft-ms 2000] [--goal-itl-p99-ms 200] [--scale 1.0]

It starts no server: point it at ortserve's gateway, llama-server, or the
onnxruntime-genai Engine harness (bench/peers/genai_engine_http.py). Every request
is the same body for every server: the prompt as token ids (bench/served/workload.py),
`max_tokens` the output it wants, `ignore_eos: true` (vLLM's and llama-server's key;
ortserve's gateway honours it) so every answer is as long as asked, temperature 0,
`stream_options.include_usage`. Per request it records the send, each text chunk's
arrival, the tokens (the final usage) and the outcome (bench/served/load_stats.py:
done, capped by how much from ortserve's `X-Ortserve-Decision` / `X-Ortserve-Budget-Cap`
headers, refused with its status, code, message and Retry-After, timed out, error).
stdout: one JSON object (the summary; `--records` adds every request); notices on stderr.
The HTTP client is httpx2, the openai client's own (in the dev dependencies).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from dataclasses import asdict, dataclass, field

import httpx2

from bench.served.load_stats import Goal, RequestRecord, summarize
from bench.served.workload import MIXES, WorkItem, describe, make_workload, poisson_arrivals

CAP_HEADER = "x-ortserve-budget-cap"
DECISION_HEADER = "x-ortserve-decision"
_ADMITTED = re.compile(r"admitted_max_tokens=(\d+)")


@dataclass(frozen=True)
class LoadTarget:
    """A server to load: its base URL, the model name to send (None: none), and keys to add
    to every body (e.g. llama-server's `cache_prompt`)."""

    name: str
    base_url: str
    model: str | None = None
    extra: dict = field(default_factory=dict)


def request_body(target: LoadTarget, item: WorkItem) -> dict:
    body = {"prompt": list(item.prompt_ids), "max_tokens": item.output_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
            **target.extra}
    if target.model:
        body["model"] = target.model
    return body


def _refusal(status: int, text: str) -> str:
    try:
        err = json.loads(text).get("error", {})
    except (ValueError, AttributeError):
        return f"{status}: {text[:300]}"
    if isinstance(err, str):
        return err[:300]
    return f"{err.get('code') or err.get('type') or status}: {str(err.get('message', ''))[:300]}"


def _retry_after_s(headers) -> float:
    if "retry-after-ms" in headers:
        return float(headers["retry-after-ms"]) / 1e3
    try:
        return float(headers.get("retry-after", 0))
    except ValueError:
        return 0.0


async def _stream(client: httpx2.AsyncClient, target: LoadTarget, item: WorkItem,
                  rec: RequestRecord) -> None:
    async with client.stream("POST", target.base_url + "/v1/completions",
                             json=request_body(target, item)) as resp:
        rec.status = resp.status_code
        if resp.status_code != 200:
            rec.reason = _refusal(resp.status_code, (await resp.aread()).decode(errors="replace"))
            rec.retry_after_s = _retry_after_s(resp.headers)
            rec.outcome = "refused"
            return
        capped = resp.headers.get(DECISION_HEADER, "").upper() == "CAPPED"
        if capped and (m := _ADMITTED.search(resp.headers.get(CAP_HEADER, ""))):
            rec.admitted_tokens = int(m.group(1))
        chunks, finish = 0, None
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            doc = json.loads(line[6:])
            if "error" in doc:  # a failure after the stream started: OpenAI's error event
                err = doc["error"]
                rec.reason = (f"mid-stream {err.get('code')}: {err.get('message', '')}"[:300]
                              if isinstance(err, dict) else str(err)[:300])
                rec.outcome = "error"
                return
            if doc.get("usage"):
                rec.tokens = doc["usage"].get("completion_tokens", 0)
            if doc.get("choices"):
                finish = doc["choices"][0].get("finish_reason") or finish
                if doc["choices"][0].get("text"):
                    now = time.perf_counter()
                    rec.t_first = rec.t_first or now
                    rec.chunk_times.append(now)
                    chunks += 1
        # Without a usage chunk: "length" with ignore_eos is every token asked for (a chunk
        # may carry several tokens, or none: half a character); else the chunks counted.
        rec.tokens = rec.tokens or (item.output_tokens if finish == "length" and not capped
                                    else chunks)
    if capped:
        rec.outcome = "capped"
    elif rec.tokens >= item.output_tokens:
        rec.outcome = "done"
    else:
        rec.outcome = "error"
        rec.reason = f"short: {rec.tokens} of {item.output_tokens} tokens and no cap said"


async def one_request(client: httpx2.AsyncClient, target: LoadTarget, item: WorkItem,
                      timeout_s: float) -> RequestRecord:
    rec = RequestRecord(item.index, item.prompt_tokens, item.output_tokens, time.perf_counter(),
                        agent=item.agent)
    try:
        await asyncio.wait_for(_stream(client, target, item, rec), timeout_s)
    except (TimeoutError, httpx2.TimeoutException):
        rec.outcome, rec.reason = "timed_out", f"no end within {timeout_s:g} s"
    except (httpx2.HTTPError, OSError, ValueError) as exc:
        rec.outcome, rec.reason = "error", f"{type(exc).__name__}: {exc}"[:300]
    rec.t_end = time.perf_counter()
    return rec


def _client(timeout_s: float) -> httpx2.AsyncClient:
    # NOTE: no pool limit: an open loop must not queue in the client, or its waits would
    # be counted as the server's.
    return httpx2.AsyncClient(timeout=httpx2.Timeout(timeout_s),
                              limits=httpx2.Limits(max_connections=None,
                                                   max_keepalive_connections=64))


async def run_open(target: LoadTarget, items: list[WorkItem], arrivals_s: list[float],
                   timeout_s: float) -> tuple[list[RequestRecord], float]:
    """items[i] sent at arrivals_s[i] after the start (Poisson: open loop, whatever the
    server's pace); (records, first send -> last end in s)."""
    async with _client(timeout_s) as client:
        start = time.perf_counter()

        async def at(item: WorkItem, t: float) -> RequestRecord:
            await asyncio.sleep(max(0.0, start + t - time.perf_counter()))
            return await one_request(client, target, item, timeout_s)

        records = await asyncio.gather(*(at(it, t) for it, t in zip(items, arrivals_s, strict=False)))
    return list(records), _span(records)


async def run_closed(target: LoadTarget, items: list[WorkItem], users: int, duration_s: float,
                     timeout_s: float) -> tuple[list[RequestRecord], float]:
    """`users` users, each sending the next item as soon as its last one ended, until
    `duration_s` has passed or the items run out; (records, first send -> last end)."""
    queue = iter(items)
    records: list[RequestRecord] = []
    async with _client(timeout_s) as client:
        stop_at = time.perf_counter() + duration_s

        async def user() -> None:
            while time.perf_counter() < stop_at and (item := next(queue, None)) is not None:
                records.append(await one_request(client, target, item, timeout_s))

        await asyncio.gather(*(user() for _ in range(users)))
    return records, _span(records)


def _span(records: list[RequestRecord]) -> float:
    return (max(r.t_end for r in records) - min(r.t_send for r in records)) if records else 0.0


def load_run(target: LoadTarget, mix: str, seed: int, duration_s: float, goal: Goal,
             rate_per_s: float | None = None, users: int | None = None, timeout_s: float = 60.0,
             scale: float = 1.0, records: bool = False) -> dict:
    """One run at an offered rate (open loop) or with N users (closed loop): the summary
    (bench/served/load_stats.summarize), the workload's description and the goal."""
    if (rate_per_s is None) == (users is None):
        raise ValueError("give exactly one of rate_per_s (open loop) and users (closed loop)")
    if rate_per_s is not None:
        arrivals = poisson_arrivals(rate_per_s, duration_s, seed)
        items = make_workload(mix, len(arrivals), seed, scale)
        recs, span = asyncio.run(run_open(target, items, arrivals, timeout_s))
    else:
        # Enough items for users that never wait: a closed loop ends at duration_s.
        items = make_workload(mix, max(4 * users, 400), seed, scale)
        recs, span = asyncio.run(run_closed(target, items, users, duration_s, timeout_s))
    # NOTE: over the arrival window, or to the last end when later: one slow request alone
    # must not read as a goodput above the offered rate.
    doc = {"system": target.name, "loop": "open" if rate_per_s is not None else "closed",
           "users": users, "duration_s_asked": duration_s, "seed": seed,
           "first_send_to_last_end_s": span,
           **summarize(recs, goal, rate_per_s, max(duration_s, span)),
           "workload": describe([items[r.index] for r in recs] or items[:1])}
    if records:
        doc["records"] = [{**asdict(r), "ttft_ms": r.ttft_ms, "gaps_ms": r.gaps_ms} for r in recs]
    return doc


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.served.load", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--name", default="server", help="what to call it in the JSON")
    p.add_argument("--model", default=None, help="the body's `model` (default: none sent)")
    p.add_argument("--mix", choices=MIXES, default="chat")
    loop = p.add_mutually_exclusive_group(required=True)
    loop.add_argument("--rate", type=float, help="open loop: Poisson arrivals per second")
    loop.add_argument("--users", type=int, help="closed loop: this many users")
    p.add_argument("--duration-s", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--scale", type=float, default=1.0, help="every length times this (0 < x <= 1)")
    p.add_argument("--timeout-s", type=float, default=60.0, help="per request, send to end")
    p.add_argument("--goal-ttft-ms", type=float, default=Goal.ttft_ms)
    p.add_argument("--goal-itl-p99-ms", type=float, default=Goal.itl_p99_ms)
    p.add_argument("--extra", default="{}", help="JSON object merged into every body")
    p.add_argument("--records", action="store_true", help="every request in the JSON too")
    a = p.parse_args(argv)
    try:
        extra = json.loads(a.extra)
        if not isinstance(extra, dict):
            raise ValueError("not an object")
    except ValueError as exc:
        p.error(f"--extra must be a JSON object ({exc})")
    goal = Goal(a.goal_ttft_ms, a.goal_itl_p99_ms)
    target = LoadTarget(a.name, a.url.rstrip("/"), a.model, extra)
    print(f"load: {a.mix} mix at {f'{a.rate:g} req/s' if a.rate else f'{a.users} users'} for "
          f"{a.duration_s:g} s against {target.base_url}", file=sys.stderr, flush=True)
    doc = load_run(target, a.mix, a.seed, a.duration_s, goal, a.rate, a.users, a.timeout_s,
                   a.scale, a.records)
    doc["goal"] = goal.describe()
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
