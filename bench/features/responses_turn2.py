"""Turn 2 of a Responses API conversation: previous_response_id vs the whole conversation again.

  .venv/bin/python -m bench.features.responses_turn2 [--rounds 6] [--answer-tokens 300]

Real processes (a scheduler, one CPU worker, the gateway) and the openai
client. Each round has its own topic (so the worker's prefix cache holds
nothing of it): turn 1 writes an answer of --answer-tokens, then turn 2 asks a
one-token follow-up twice, in alternating order: with previous_response_id
(the session keeps turn 1's KV: only the new input is prefilled) and with
store: false and the whole conversation as input (all of it prefilled). The
figure is the ratio of the medians of the worker's ttft_ms (stateless /
session). JSON on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import openai

from devtools.cluster import LocalCluster, default_model_dir, start_service, stop_service

BIN = Path(sys.executable).parent
MODEL = "smollm2-135m-instruct-fp32"
TOPICS = ["the Roman Empire", "ancient Egypt", "the Ming dynasty", "classical Greece",
          "the Persian Empire", "feudal Japan", "the Inca Empire", "the Ottoman Empire"]
FOLLOW_UP = "Now summarise it in one sentence."


def _turn2(client: openai.OpenAI, first, essay: str, kind: str) -> dict:
    if kind == "session":
        answer = client.responses.create(model=MODEL, previous_response_id=first.id,
                                         input=FOLLOW_UP, max_output_tokens=1, temperature=0)
    else:
        whole = [{"role": "user", "content": essay}, *[o.model_dump() for o in first.output],
                 {"role": "user", "content": FOLLOW_UP}]
        answer = client.responses.create(model=MODEL, input=whole, store=False,
                                         max_output_tokens=1, temperature=0)
    timings = answer.model_extra["ortserve"]["finished"]["timings"]
    return {"input_tokens": answer.usage.input_tokens,
            "cached_tokens": answer.usage.input_tokens_details.cached_tokens,
            "prefill_ms": timings["prefill_ms"], "ttft_ms": timings["ttft_ms"]}


def measure(client: openai.OpenAI, rounds: int, answer_tokens: int) -> dict:
    rows = []
    for i in range(rounds):
        essay = f"Write a long, detailed essay about the history of {TOPICS[i % len(TOPICS)]}."
        first = client.responses.create(model=MODEL, input=essay, max_output_tokens=answer_tokens,
                                        temperature=0, extra_body={"min_tokens": answer_tokens})
        order = ("session", "stateless") if i % 2 == 0 else ("stateless", "session")
        row = {kind: _turn2(client, first, essay, kind) for kind in order}
        rows.append(row)
        print(f"round {i}: {row}", file=sys.stderr, flush=True)
    medians = {kind: statistics.median(r[kind]["ttft_ms"] for r in rows)
               for kind in ("session", "stateless")}
    return {"rounds": rows, "median_ttft_ms": medians,
            "ratio_stateless_over_session": medians["stateless"] / medians["session"]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--answer-tokens", type=int, default=300)
    a = p.parse_args(argv)
    logs = Path(tempfile.mkdtemp(prefix="bench-responses-"))
    cluster = LocalCluster(model_dir=default_model_dir(), log_dir=logs,
                           kv_capacities=["512MiB"]).start()
    gateway = start_service("gateway", [str(BIN / "ortserve-gateway"), "--port", "0",
                                        "--scheduler", cluster.address], logs)
    try:
        for _ in range(300):  # bound and announced; wait until uvicorn accepts
            try:
                with urllib.request.urlopen(f"http://{gateway.address}/health", timeout=2):
                    break
            except OSError:
                time.sleep(0.1)
        client = openai.OpenAI(base_url=f"http://{gateway.address}/v1", api_key="unused",
                               timeout=600)
        print(json.dumps(measure(client, a.rounds, a.answer_tokens), indent=2))
    finally:
        stop_service(gateway)
        cluster.stop()


if __name__ == "__main__":
    main()
