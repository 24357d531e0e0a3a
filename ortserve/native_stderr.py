"""With JSON logs, what native code writes straight to file descriptor 2 becomes JSON too.

gRPC's C core logs through absl to fd 2, past Python's logging
(`I1203 21:00:55.972554   28289 ssl_transport_security.cc:2563] Handshake failed ...`,
one line per client that fails the TLS handshake); so do onnxruntime's C++
logger and any plain `print(..., file=sys.stderr)`. A collector reading one
JSON object a line broke exactly when something went wrong (issue 30 #8).

So fd 2 becomes a pipe, and a reader thread turns each line that is not
already JSON into a standard-library log record (logger "grpc-core",
"onnxruntime" or "stderr"), which the one JSON handler writes to the real
stderr (a dup of the original fd 2). The records pass --log-level like every
other: grpc's handshake failures are its INFO lines.

NOTE: setting GRPC_VERBOSITY from a flag does not work: grpc reads it once,
when `import grpc` runs, before any flag is parsed (measured with grpcio
1.85: set after the import, it changed nothing). Filtering the captured lines
by our level does what that would have, and GRPC_VERBOSITY / GRPC_TRACE set in
the environment still work (their lines arrive here and are wrapped).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import re
import sys
import threading
from typing import TextIO

# absl's prefix: severity letter, MMDD hh:mm:ss.micros, thread id, file:line]
_ABSL = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d\d\.\d+\s+(\d+) ([^\s\]]+:\d+)\] ?(.*)$")
# onnxruntime's default logger: "2025-01-01 10:00:00.1 [W:onnxruntime:tag, file.cc:12 Fn] text"
_ORT = re.compile(r"\[([VIWEF]):onnxruntime:[^,\]]*,\s*([^\]]*)\] ?(.*)$")
_LEVEL_OF = {"V": logging.DEBUG, "I": logging.INFO, "W": logging.WARNING,
             "E": logging.ERROR, "F": logging.CRITICAL}
_DRAIN_AT_EXIT_S = 2.0


def as_record(line: str) -> tuple[str, int, str, dict[str, str]]:
    """One foreign stderr line -> (logger name, level, message, extra fields)."""
    if m := _ABSL.match(line):
        return "grpc-core", _LEVEL_OF[m[1]], m[4], {"source": m[3], "thread_id": m[2]}
    if m := _ORT.search(line):
        return "onnxruntime", _LEVEL_OF[m[1]], m[3], {"source": m[2]}
    # Unknown text on stderr (a library's warning, a Python traceback line): worth
    # seeing at the default level, not claimed to be an error.
    return "stderr", logging.WARNING, line, {}


def _is_json_object(line: str) -> bool:
    if not (line.startswith("{") and line.endswith("}")):
        return False
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


class NativeStderr:
    """fd 2 -> pipe -> reader thread -> log records; `stream` is the real stderr."""

    def __init__(self) -> None:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        self._real_fd = os.dup(2)
        read_fd, write_fd = os.pipe()  # not inheritable: children inherit fd 2 only
        os.dup2(write_fd, 2)
        os.close(write_fd)
        self._read_fd = read_fd
        # Line-buffered: each log line leaves in one write, whole.
        self.stream: TextIO = os.fdopen(os.dup(self._real_fd), "w", buffering=1,
                                        encoding="utf-8", errors="backslashreplace")
        self._handler: logging.Handler | None = None
        self._thread = threading.Thread(target=self._pump, name="native-stderr", daemon=True)

    def start(self, handler: logging.Handler) -> None:
        """Begin forwarding; `handler` writes `stream` (its lock orders our raw JSON lines)."""
        self._handler = handler
        self._thread.start()
        atexit.register(self.stop)

    def stop(self) -> None:
        """Put the real stderr back on fd 2 and forward what is still in the pipe."""
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        # Closes the pipe's last write end (unless a child process still holds one):
        # the reader sees EOF after the lines already written.
        os.dup2(self._real_fd, 2)
        self._thread.join(_DRAIN_AT_EXIT_S)

    def _pump(self) -> None:
        pending = b""
        with os.fdopen(self._read_fd, "rb", buffering=0) as pipe:
            while chunk := pipe.read(65_536):
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    self._forward(line)
        if pending:
            self._forward(pending)

    def _forward(self, raw: bytes) -> None:
        line = raw.decode("utf-8", "backslashreplace").rstrip("\r")
        if not line.strip():
            return
        if _is_json_object(line):  # already one JSON object (a child's JSON log): as is
            assert self._handler is not None
            with self._handler.lock, contextlib.suppress(OSError):
                self.stream.write(line + "\n")
            return
        name, level, message, extra = as_record(line)
        logging.getLogger(name).log(level, message, extra=extra)
