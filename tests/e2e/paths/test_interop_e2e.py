"""The README's grpcurl commands, verbatim, and the Node.js client, against the running system."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess

import pytest

from tests.e2e.conftest import ROOT, grpcurl, reserved_bytes

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

README_ADDRESS = "localhost:50051"


def readme_grpcurl_commands() -> list[str]:
    """The commands in the README's grpcurl block (between the grpcurl-examples markers)."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- grpcurl-examples -->\s*```(?:bash|sh)?\n(.*?)```", text, re.S)
    assert block, "README.md lost its grpcurl-examples block"
    return [line for line in block.group(1).splitlines() if line.startswith("grpcurl ")]


def run_readme_command(command: str, address: str) -> subprocess.CompletedProcess:
    argv = shlex.split(command.replace(README_ADDRESS, address))
    argv[0] = grpcurl()
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_the_readme_grpcurl_commands_work_through_reflection(roomy):
    commands = readme_grpcurl_commands()
    assert len(commands) == 4
    listed, described, admitted, generated = (run_readme_command(c, roomy.address) for c in commands)
    for result in (listed, described, admitted, generated):
        assert result.returncode == 0, result.stderr
    assert {"ortserve.v1.Scheduler", "grpc.health.v1.Health"} <= set(listed.stdout.split())
    assert "admitted_max_new_tokens" in described.stdout
    admission = json.loads(admitted.stdout)
    assert admission["decision"] == "ADMITTED"
    assert admission.get("dryRun", admission.get("dry_run")) is True
    events = [json.loads(doc) for doc in re.split(r"(?<=})\n(?={)", generated.stdout.strip())]
    assert "admission" in events[0]
    assert "finished" in events[-1]
    text = "".join(e["chunk"].get("text", "") for e in events if "chunk" in e)
    assert "Paris" in text
    assert reserved_bytes(roomy.address) == 0


def test_the_node_client_streams_a_generation(roomy):
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node/npm not installed on this machine: the Node.js client cannot be tested")
    client_dir = ROOT / "clients" / "node"
    if not (client_dir / "node_modules" / "@grpc" / "grpc-js").exists():
        subprocess.run([npm, "install", "--no-audit", "--no-fund"], cwd=client_dir, check=True,
                       capture_output=True, timeout=300)
    result = subprocess.run(
        [node, str(client_dir / "generate.js"), "--address", roomy.address, "--chat",
         "--max-new-tokens", "24", "What is the capital of France? Answer in one sentence."],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout
    assert "finish_reason=" in result.stderr and "finish_reason" not in result.stdout
    # The flag reached the request: the Finished event reports the ceiling it asked for,
    # nothing was capped, and the ledger is back at zero once the stream has ended.
    stats = re.search(r"finish_reason=(\w+) generated_tokens=(\d+) max_new_tokens=(\d+)(.*)",
                      result.stderr)
    assert stats, result.stderr
    finish_reason, generated, ceiling, rest = stats.groups()
    assert int(ceiling) == 24 and "capped_from" not in rest
    assert 0 < int(generated) <= 24
    assert finish_reason in ("EOS", "LENGTH")
    assert reserved_bytes(roomy.address) == 0
