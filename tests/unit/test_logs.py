"""JSON logs: every stderr line is one JSON object, structlog's and the standard library's."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent

PROGRAM = """
import logging, warnings, structlog
from ortserve.logs import configure_logging
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
    process = subprocess.Popen([str(BIN / "ortserve-scheduler"), "--port", "0", "--log-json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline().startswith("listening ")
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=30)
    records = _json_lines(stderr)
    assert any(r["event"] == "scheduler serving" for r in records)
