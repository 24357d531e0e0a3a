"""The fault run's clients and its tally (devtools/chaos.py drives them): requests over
gRPC and through the gateway, each ended cleanly or counted bad."""

from __future__ import annotations

import collections
import json
import random
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

import grpc

from ortserve.v1 import scheduler_pb2_grpc, types_pb2

# A clean end of a request that did not get its tokens: the system said why.
CLEAN_CODES = {"unavailable", "resource_exhausted", "deadline_exceeded", "cancelled",
               "failed_precondition", "aborted", "not_found"}
HANG_GRACE_S = 10.0  # past its deadline by this much, a request counts as hung
LEASE_TTL_S = 3.0
PROMPTS = ["Write a long story about a lighthouse keeper.", "List the planets of the solar system.",
           "Explain how a bicycle works.", "What is the capital of France?"]


@dataclass
class Tally:
    """Outcomes and findings, shared by every thread."""

    outcomes: collections.Counter = field(default_factory=collections.Counter)
    bad: list[dict] = field(default_factory=list)  # requests that did not end cleanly
    violations: list[dict] = field(default_factory=list)
    faults: list[dict] = field(default_factory=list)
    checks: int = 0
    # Held leases a check could not compare: charged and released between its two looks.
    unverified_leases: int = 0
    bad_total: int = 0
    samples: dict = field(default_factory=dict)  # outcome -> its first details
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, outcome: str, bad: dict | None = None, detail: str = "") -> None:
        with self.lock:
            self.outcomes[outcome] += 1
            if detail and len(self.samples.setdefault(outcome, [])) < 3:
                self.samples[outcome].append(detail)
            if bad is not None:
                self.bad_total += 1
                if len(self.bad) < 50:  # the first ones, with their details
                    self.bad.append({"outcome": outcome, **bad})


def grpc_request(address: str, rng: random.Random, tally: Tally) -> None:
    """One Generate over gRPC with a deadline, read whole, cancelled after two chunks or
    abandoned (its channel closed) after two; its outcome counted in `tally`."""
    deadline_s = rng.uniform(2, 15)
    how = rng.choices(["whole", "cancel", "vanish"], [6, 2, 1])[0]
    request = types_pb2.GenerateRequest(text=rng.choice(PROMPTS),
                                        max_new_tokens=rng.randint(8, 160))
    started = time.monotonic()
    channel = grpc.insecure_channel(address)
    outcome, detail = "no_finished", ""
    try:
        call = scheduler_pb2_grpc.SchedulerStub(channel).Generate(request, timeout=deadline_s)
        chunks = 0
        for event in call:
            kind = event.WhichOneof("event")
            if kind == "chunk":
                chunks += 1
                if how == "cancel" and chunks == 2:
                    call.cancel()
                    outcome = "cancelled_by_client"
                    break
                if how == "vanish" and chunks == 2:
                    channel.close()  # gone without a word
                    outcome = "vanished"
                    break
            elif kind == "finished":
                outcome = "tokens"
    except grpc.RpcError as error:
        code = error.code().name.lower() if error.code() else "none"
        outcome, detail = f"grpc_{code}", (error.details() or "")[:300]
        if how == "vanish" and code == "cancelled":
            outcome = "vanished"
    except ValueError:  # the channel closed under a vanishing reader
        outcome = "vanished"
    finally:
        channel.close()
    elapsed = time.monotonic() - started
    bad = None
    if elapsed > deadline_s + HANG_GRACE_S:
        outcome = "hung"
    if outcome in ("hung", "no_finished") or (
            outcome.startswith("grpc_") and outcome[5:] not in CLEAN_CODES):
        bad = {"path": "grpc", "elapsed_s": round(elapsed, 1),
               "deadline_s": round(deadline_s, 1), "detail": detail}
    tally.count(outcome, bad, detail)


def http_request(gateway_address: str, model: str, rng: random.Random, tally: Tally) -> None:
    """One chat completion through the gateway, whole or streamed (a streamed reader may
    vanish after three lines); its outcome counted in `tally`."""
    stream = rng.random() < 0.5
    vanish = stream and rng.random() < 0.3
    body = {"model": model, "messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
            "max_tokens": rng.randint(8, 160), "stream": stream}
    started = time.monotonic()
    outcome, detail = "no_finished", ""
    try:
        request = urllib.request.Request(
            f"http://{gateway_address}/v1/chat/completions",
            data=json.dumps(body).encode(), headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=20 + HANG_GRACE_S) as reply:
            if not stream:
                json.load(reply)
                outcome = "tokens"
            else:
                for lines, line in enumerate(reply, 1):
                    if vanish and lines == 3:
                        outcome = "vanished"
                        break
                    if line.strip() == b"data: [DONE]":
                        outcome = "tokens"
                    elif b'"error"' in line:
                        outcome = "http_stream_error"
                        detail = line.decode(errors="replace")[:300]
    except urllib.error.HTTPError as error:
        text = error.read(2000).decode(errors="replace")
        try:
            code = json.loads(text)["error"]["code"]
        except (ValueError, KeyError, TypeError):
            code = "?"
        outcome, detail = f"http_{error.code}_{code}", text[:300]
    except TimeoutError:
        outcome = "hung"
    except urllib.error.URLError as error:
        outcome = "hung" if isinstance(error.reason, TimeoutError) else "http_unreachable"
        detail = repr(error)[:300]
    except (OSError, ValueError) as error:  # a connection cut mid-answer
        outcome, detail = "http_cut", repr(error)[:300]
    elapsed = time.monotonic() - started
    bad = None
    if outcome == "http_stream_error" and any(
            f'"code": "{c}"' in detail or f'"code":"{c}"' in detail
            for c in ("internal", "server_error")):
        bad = {"path": "http", "detail": detail}
    if outcome in ("hung", "no_finished") or outcome.startswith("http_500") \
            or outcome.startswith("http_502"):
        bad = {"path": "http", "elapsed_s": round(elapsed, 1), "detail": detail}
    tally.count(outcome, bad, detail)
