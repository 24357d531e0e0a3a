"""ortserve-probe's HTTP mode (the gateway's compose health check), against a real local server."""

from __future__ import annotations

import http.server
import socket
import threading

import pytest

from ortserve.rpc import probe


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the stdlib's name
        status = 200 if self.path == "/health" else 503
        body = b'{"status": "ok"}' if status == 200 else b'{"status": "no_worker"}'
        self.send_response(status)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args):
        pass


@pytest.fixture
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_2xx_is_serving_and_exits_zero(server):
    assert probe.check_http(f"{server}/health") == "SERVING"
    probe.main([f"{server}/health"])  # no SystemExit


def test_a_503_names_the_status_and_body_and_exits_one(server, capsys):
    assert probe.check_http(f"{server}/other") == 'HTTP 503 {"status": "no_worker"}'
    with pytest.raises(SystemExit) as exit_:
        probe.main([f"{server}/other"])
    assert exit_.value.code == 1
    assert "HTTP 503" in capsys.readouterr().err


def test_nothing_listening_is_unreachable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert probe.check_http(f"http://127.0.0.1:{port}/health", timeout_s=1).startswith("unreachable")
