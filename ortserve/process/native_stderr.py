"""With JSON logs, what native code writes straight to file descriptor 2 becomes JSON too.

gRPC's C core logs through absl to fd 2, past Python's logging
(`I1203 21:00:55.972554   28289 ssl_transport_security.cc:2563] Handshake failed ...`,
one line per client that fails the TLS handshake); so do onnxruntime's C++
logger and any plain `print(..., file=sys.stderr)`. A collector reading one
JSON object a line breaks exactly when something goes wrong.

So fd 2 becomes a socket (one message per write), and a reader thread turns each line that is not
already JSON into a standard-library log record (logger "grpc-core",
"onnxruntime" or "stderr"), which the one JSON handler writes to the real
stderr (a dup of the original fd 2). The records pass --log-level like every
other: grpc's handshake failures are its INFO lines. A message of several lines is
one record at its first line's level (see `grouped`).

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
import select
import socket
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
# The largest one write to fd 2 may be: the socket's send buffer (the kernel caps what
# it grants at net.core.wmem_max, 208 KiB by default; a larger write fails EMSGSIZE).
_MAX_WRITE_BYTES = 4 << 20


def as_record(line: str) -> tuple[str, int, str, dict[str, str]]:
    """One foreign stderr line -> (logger name, level, message, extra fields)."""
    if m := _ABSL.match(line):
        return "grpc-core", _LEVEL_OF[m[1]], m[4], {"source": m[3], "thread_id": m[2]}
    if m := _ORT.search(line):
        return "onnxruntime", _LEVEL_OF[m[1]], m[3], {"source": m[2]}
    # Unknown text on stderr (a library's warning, a Python traceback line): worth
    # seeing at the default level, not claimed to be an error.
    return "stderr", logging.WARNING, line, {}


def _is_header(line: str) -> bool:
    return bool(_ABSL.match(line) or _ORT.search(line))


def grouped(lines: list[str]) -> list[list | str]:
    """One write's whole lines -> what to write, in order: a record to log ([logger, level,
    message, extra]) or a line that is already one JSON object (a child's JSON log, written
    as it is).

    A native message of several lines (gRPC core's `READ error=UNAVAILABLE: Socket closed`,
    then `=== Source Location Trace: ===` and a source line) is one write: a header line
    (absl's or onnxruntime's prefix) takes every following line of the write that has
    none, and the whole message is one record at the header's level (else each
    continuation line would be an unknown "stderr" warning, shown under --log-level
    warning while its first line is hidden). A JSON line ends the message before it.
    """
    records: list[list | str] = []
    current: list | None = None
    for line in lines:
        if not line.strip():
            continue
        if _is_json_object(line):
            records.append(line)
            current = None
        elif _is_header(line):
            current = list(as_record(line))
            records.append(current)
        elif current is not None:
            current[2] += "\n" + line
        else:
            records.append(list(as_record(line)))
    return records


def _is_json_object(line: str) -> bool:
    if not (line.startswith("{") and line.endswith("}")):
        return False
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


class NativeStderr:
    """fd 2 -> socket -> reader thread -> log records; `stream` is the real stderr."""

    def __init__(self) -> None:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        self._real_fd = os.dup(2)
        # A socket that keeps each write() one message, where a pipe would run the writes
        # together: a native message is one write (absl's, onnxruntime's), so its lines
        # are told from the next message's by where the write ends, not by guessing.
        # Not inheritable: children inherit fd 2 only.
        reader, writer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with contextlib.suppress(OSError):  # room for one write of up to ~the kernel's cap
            writer.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _MAX_WRITE_BYTES)
        os.dup2(writer.fileno(), 2)
        writer.close()
        self._reader = reader
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
        """Put the real stderr back on fd 2 and forward what is still in the socket."""
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        # Closes the socket's last write end (unless a child process still holds one):
        # the reader sees EOF after the lines already written.
        os.dup2(self._real_fd, 2)
        self._thread.join(_DRAIN_AT_EXIT_S)

    def _pump(self) -> None:
        pending = b""
        with self._reader:
            while True:
                write = self._reader.recv(_MAX_WRITE_BYTES)
                if not write:
                    if self._closed():
                        break
                    continue  # a write of no bytes, not the end
                # A line one write leaves unfinished ends in a later write (print's
                # pieces): it is completed first, then grouped with that write's lines.
                *lines, pending = (pending + write).split(b"\n")
                self._forward(lines)
        if pending:
            self._forward([pending])

    def _closed(self) -> bool:
        """Whether every writer of fd 2 has closed it (recv's 0 means that or an empty write)."""
        ready = select.poll()
        ready.register(self._reader, select.POLLIN | select.POLLHUP | select.POLLRDHUP)
        return any(events & (select.POLLHUP | select.POLLRDHUP) for _, events in ready.poll(0))

    def _forward(self, raw_lines: list[bytes]) -> None:
        """Forward one write's whole lines."""
        lines = [raw.decode("utf-8", "backslashreplace").rstrip("\r") for raw in raw_lines]
        for record in grouped(lines):
            if isinstance(record, str):  # already one JSON object: as it is
                assert self._handler is not None
                with self._handler.lock, contextlib.suppress(OSError):
                    self.stream.write(record + "\n")
            else:
                name, level, message, extra = record
                logging.getLogger(name).log(level, message, extra=extra)
