"""The load generator reads each answer's fate as a server says it: done (by usage, or by
finish_reason "length" without one), capped (ortserve's headers), refused (status, code,
Retry-After), timed out, an error mid-stream, or short.
A fake OpenAI server on a loopback port answers by max_tokens."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench.served.load import LoadTarget, run_closed, run_open
from bench.served.workload import WorkItem

BODIES: list[dict] = []
RELEASE = threading.Event()


class FakeServer(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _sse(self, doc):
        self.wfile.write(b"data: " + json.dumps(doc).encode() + b"\n\n")
        self.wfile.flush()

    def _chunks(self, n, usage=None):
        for _ in range(n):
            self._sse({"choices": [{"index": 0, "text": "x", "finish_reason": None}]})
        self._sse({"choices": [], "usage": {"completion_tokens": usage if usage is not None else n}})
        self.wfile.write(b"data: [DONE]\n\n")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        BODIES.append(body)
        wanted = body["max_tokens"]
        if wanted == 9:  # refused before the stream, as the gateway's 429
            data = json.dumps({"error": {"code": "queue_full", "message": "the queue holds 8 requests"}})
            self.send_response(429)
            self.send_header("retry-after-ms", "1500")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data.encode())
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        if wanted == 7:
            self.send_header("X-Ortserve-Decision", "CAPPED")
            self.send_header("X-Ortserve-Budget-Cap", "requested_max_tokens=7, admitted_max_tokens=4, "
                                                      "requested_bytes=1, admitted_bytes=1")
        self.end_headers()
        if wanted == 3:
            self._chunks(3)
        elif wanted == 7:
            self._chunks(4)
        elif wanted == 11:  # never ends until the test is over: a timeout is certain
            RELEASE.wait(30)
        elif wanted == 13:
            self._sse({"choices": [{"index": 0, "text": "x"}]})
            self._sse({"error": {"code": "worker_failed", "message": "the worker died"}})
        elif wanted == 15:
            self._chunks(2)
        elif wanted == 17:  # no usage chunk (a server without include_usage): "length" says it
            for _ in range(3):
                self._sse({"choices": [{"index": 0, "text": "xy", "finish_reason": None}]})
            self._sse({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
            self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeServer)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield LoadTarget("fake", f"http://127.0.0.1:{httpd.server_address[1]}", "m1", {"cache_prompt": False})
    RELEASE.set()
    httpd.shutdown()


def item(i, wanted):
    return WorkItem(i, (1_000 + i, 2_000, 3_000), wanted, "chat")


def test_each_outcome_is_read_from_what_the_server_said(server):
    items = [item(0, 3), item(1, 7), item(2, 9), item(4, 13), item(5, 15), item(6, 17)]
    records, _ = asyncio.run(run_open(server, items, [0.0] * 6, timeout_s=60.0))
    by = {r.index: r for r in records}
    assert by[0].outcome == "done" and by[0].tokens == 3 and len(by[0].chunk_times) == 3
    assert by[0].ttft_ms > 0 and len(by[0].gaps_ms) == 2
    assert by[1].outcome == "capped" and by[1].admitted_tokens == 4 and by[1].tokens == 4
    assert by[2].outcome == "refused" and by[2].status == 429
    assert by[2].reason == "queue_full: the queue holds 8 requests" and by[2].retry_after_s == 1.5
    assert by[4].outcome == "error" and by[4].reason == "mid-stream worker_failed: the worker died"
    assert by[5].outcome == "error" and by[5].reason == "short: 2 of 15 tokens and no cap said"
    assert by[6].outcome == "done" and by[6].tokens == 17 and len(by[6].chunk_times) == 3


def test_a_request_without_an_end_within_the_timeout_is_timed_out(server):
    records, _ = asyncio.run(run_open(server, [item(3, 11)], [0.0], timeout_s=0.5))
    assert records[0].outcome == "timed_out" and records[0].reason == "no end within 0.5 s"


def test_every_body_asks_for_the_same_thing_whatever_the_server(server):
    BODIES.clear()
    asyncio.run(run_open(server, [item(0, 3)], [0.0], timeout_s=5.0))
    assert BODIES == [{"prompt": [1_000, 2_000, 3_000], "max_tokens": 3, "temperature": 0,
                       "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
                       "cache_prompt": False, "model": "m1"}]


def test_a_closed_loop_sends_each_user_s_next_request_when_its_last_ended(server):
    records, _ = asyncio.run(run_closed(server, [item(i, 3) for i in range(9)], users=3,
                                        duration_s=30, timeout_s=5.0))
    assert sorted(r.index for r in records) == list(range(9))  # the items ran out first
    assert all(r.outcome == "done" for r in records)
