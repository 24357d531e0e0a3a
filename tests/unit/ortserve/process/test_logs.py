"""JSON logs: every stderr line is one JSON object, structlog's and the standard library's."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
from pathlib import Path

from ortserve.process import banner
from ortserve.process.native_stderr import as_record, grouped

BIN = Path(sys.executable).parent

PROGRAM = """
import logging, warnings, structlog
from ortserve.process.logs import configure_logging
configure_logging("info", json=True)
structlog.get_logger("svc").bind(request_id="r1", lease_id="l1", worker_id="w1").info("hello", n=3)
logging.getLogger("grpc._cython.cygrpc").warning("a warning from the standard library: %s", "x")
warnings.warn("a warnings.warn line")
try:
    1 / 0
except ZeroDivisionError:
    logging.getLogger("asyncio").exception("with a traceback")
print("result on stdout")
"""


def _json_lines(text: str) -> list[dict]:
    lines = [line for line in text.splitlines() if line.strip()]
    return [json.loads(line) for line in lines]  # raises on any non-JSON line


def test_every_stderr_line_is_json_including_the_standard_librarys():
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "result on stdout\n"
    records = _json_lines(out.stderr)
    by_event = {r["event"].split(":")[0]: r for r in records}
    hello = by_event["hello"]
    assert (hello["request_id"], hello["lease_id"], hello["worker_id"], hello["n"]) == (
        "r1", "l1", "w1", 3)
    stdlib = by_event["a warning from the standard library"]
    assert stdlib["level"] == "warning" and stdlib["logger"] == "grpc._cython.cygrpc"
    assert any("a warnings.warn line" in r["event"] for r in records)
    assert "ZeroDivisionError" in by_event["with a traceback"]["exception"]


def test_a_scheduler_process_with_json_logs_writes_only_json_to_stderr():
    process = subprocess.Popen([str(BIN / "ortserve-scheduler"), "--port", "0",
                                "--internal-port", "0", "--log-json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # With JSON logs the banner on stdout is JSON too (one collector reads both streams); ortserve.process.banner reads it.
    line = process.stdout.readline()
    assert json.loads(line)["event"] == "listening"
    assert banner.parse(line).address.startswith("127.0.0.1:")
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=30)
    records = _json_lines(stderr)
    assert any(r["event"] == "scheduler serving" for r in records)


NATIVE = """
import os, sys
from ortserve.process.logs import configure_logging
configure_logging("info", json=True, capture_native=True)
# What gRPC's C core (absl), onnxruntime's C++ logger and plain prints write to fd 2.
os.write(2, b"I1203 20:59:39.612219   26395 ssl_transport_security.cc:2563] Handshake failed\\n")
os.write(2, b"E1203 20:59:39.7   26395 chttp2_transport.cc:10] an error\\npartial line, ")
os.write(2, b"then its end\\n")
os.write(2, b"2025-01-01 10:00:00.1 [W:onnxruntime:ort, graph.cc:12 Fn] an ORT warning\\n")
os.write(2, b'{"event": "already json", "level": "info"}\\n')
print("plain text on sys.stderr", file=sys.stderr)
raise RuntimeError("uncaught, with a traceback")
"""


def test_with_json_logs_native_writes_to_fd_2_and_uncaught_errors_are_json_too():
    out = subprocess.run([sys.executable, "-c", NATIVE], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1 and out.stdout == ""
    records = _json_lines(out.stderr)
    by_event = {r["event"]: r for r in records}
    handshake = by_event["Handshake failed"]
    assert (handshake["logger"], handshake["level"], handshake["source"]) == (
        "grpc-core", "info", "ssl_transport_security.cc:2563")
    assert by_event["an error"]["level"] == "error"
    assert by_event["partial line, then its end"]["logger"] == "stderr"
    assert by_event["an ORT warning"]["logger"] == "onnxruntime"
    assert by_event["already json"] == {"event": "already json", "level": "info"}
    assert by_event["plain text on sys.stderr"]["level"] == "warning"
    uncaught = by_event["uncaught exception"]
    assert uncaught["level"] == "critical" and "RuntimeError: uncaught" in uncaught["exception"]


def test_captured_native_lines_obey_the_log_level():
    program = NATIVE.replace('configure_logging("info"', 'configure_logging("warning"')
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                         timeout=60)
    events = [r["event"] for r in _json_lines(out.stderr)]
    assert "Handshake failed" not in events and "an error" in events


def test_absl_and_onnxruntime_prefixes_name_their_logger_and_level():
    assert as_record("W0102 03:04:05.000006 7 tcp_posix.cc:1] slow") == (
        "grpc-core", logging.WARNING, "slow", {"source": "tcp_posix.cc:1", "thread_id": "7"})
    assert as_record("whatever") == ("stderr", logging.WARNING, "whatever", {})


def test_the_banner_reads_back_in_both_forms():
    both = banner.Banner("127.0.0.1:5", "127.0.0.1:6")
    for as_json in (False, True):
        assert banner.parse(banner.line(both, "scheduler", as_json)) == both
    assert banner.parse("listening 0.0.0.0:8000") == banner.Banner("0.0.0.0:8000")
    assert banner.parse(banner.line(banner.Banner("h:1"), "gateway", True)) == banner.Banner("h:1")
    assert banner.parse('{"event": "scheduler serving"}') is None
    assert banner.parse("Traceback (most recent call last):") is None


def _traced_scheduler(level: str) -> list[dict]:
    """A scheduler with gRPC core's TCP tracing on, three short calls to it, its records."""
    import os

    import grpc

    from ortserve.v1 import scheduler_pb2, scheduler_pb2_grpc

    env = {**os.environ, "GRPC_VERBOSITY": "debug", "GRPC_TRACE": "tcp"}
    process = subprocess.Popen([str(BIN / "ortserve-scheduler"), "--port", "0",
                                "--internal-port", "0", "--log-json", "--log-level", level],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    address = banner.parse(process.stdout.readline()).address
    for _ in range(3):  # each closed connection: a multi-line "READ error" message
        with grpc.insecure_channel(address) as channel:
            scheduler_pb2_grpc.SchedulerStub(channel).GetBudget(
                scheduler_pb2.GetBudgetRequest(), timeout=10)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=30)
    return _json_lines(stderr)


def test_a_multi_line_core_message_takes_its_first_lines_level():
    # At warning, gRPC core's info messages are hidden whole: no line of theirs leaks as
    # an unknown "stderr" warning (the source-location lines after the first did).
    hidden = _traced_scheduler("warning")
    assert not [r for r in hidden if r["logger"] == "stderr"], hidden
    assert not [r for r in hidden if "Source Location" in r["event"]]
    # At info, each is one record at its first line's level, the lines after it included.
    shown = _traced_scheduler("info")
    traced = [r for r in shown if "=== Source Location Trace: ===" in r["event"]]
    assert traced and all(r["logger"] == "grpc-core" and r["level"] == "info" for r in traced)
    assert not [r for r in shown if r["logger"] == "stderr"]


def test_continuation_lines_join_their_header_in_one_record():
    header = "I1204 18:56:17.746774   26168 endpoint.cc:121] TCP: READ error=UNAVAILABLE"
    records = grouped([header, "=== Source Location Trace: ===", "src/x.cc:372", "",
                       '{"event": "child"}', "plain"])
    assert records == [
        ["grpc-core", logging.INFO,
         "TCP: READ error=UNAVAILABLE\n=== Source Location Trace: ===\nsrc/x.cc:372",
         {"source": "endpoint.cc:121", "thread_id": "26168"}],
        '{"event": "child"}',  # a JSON line as it is, ending the message
        ["stderr", logging.WARNING, "plain", {}]]
