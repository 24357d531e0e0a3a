"""The CLI and the local-cluster runner's demo against real processes: what reaches stdout."""

from __future__ import annotations

import io
import subprocess
import time

import pytest

from devtools.cluster import demo
from tests.e2e.conftest import BIN, reserved_bytes

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

# NOTE: min = max keeps the stream going long after the reader has left: EOS cannot end it.
LONG = ("generate", "Write a long story about a dragon.", "--min-new-tokens", "96",
        "--max-new-tokens", "96")


def cli_argv(address: str, *args: str) -> list[str]:
    return [str(BIN / "ortserve"), "--address", address, "--timeout", "120", *args]


def wait_ledger_empty(address: str, timeout_s: float = 30.0) -> int:
    deadline = time.monotonic() + timeout_s
    while (held := reserved_bytes(address)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return held


def test_generate_piped_into_head_exits_quietly_and_frees_its_lease(roomy):
    cli = subprocess.Popen(cli_argv(roomy.address, *LONG), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
    head = subprocess.run(["head", "-c", "10"], stdin=cli.stdout, capture_output=True, timeout=120)
    cli.stdout.close()  # head holds the only reader; once it exits the pipe is closed
    _, stderr = cli.communicate(timeout=120)
    assert len(head.stdout) == 10
    assert b"Traceback" not in stderr and b"Exception ignored" not in stderr, stderr.decode()
    assert cli.returncode == 141, stderr.decode()
    assert wait_ledger_empty(roomy.address) == 0


def test_json_into_a_closed_pipe_fails_at_the_final_flush_quietly(roomy):
    # Nothing is written before the end: the JSON object is buffered and only the
    # flush on the way out meets the closed pipe.
    cli = subprocess.Popen(cli_argv(roomy.address, *LONG, "--json"), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
    cli.stdout.close()
    _, stderr = cli.communicate(timeout=120)
    assert b"Traceback" not in stderr and b"Exception ignored" not in stderr, stderr.decode()
    assert cli.returncode == 141, stderr.decode()
    assert wait_ledger_empty(roomy.address) == 0


def test_the_demo_writes_the_answer_alone_on_its_stream_and_notices_on_stderr(roomy, capsys):
    out = io.StringIO()
    demo(roomy.address, out)
    answer = out.getvalue()
    assert "Paris" in answer
    assert answer.endswith("\n") and "ortserve:" not in answer and "stats:" not in answer
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "ortserve: demo: " in captured.err and "stats: finish_reason=" in captured.err
