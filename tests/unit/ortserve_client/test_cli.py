"""The CLI as a user runs it, before any server is reached: usage errors and --version."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

ORTSERVE = Path(sys.executable).with_name("ortserve")
# NOTE: nothing listens here; a test that gets past argument parsing fails fast and visibly.
NO_SERVER = "127.0.0.1:9"


def run_cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(ORTSERVE), "--address", NO_SERVER, "--timeout", "5", *args],
                          capture_output=True, text=True, timeout=60, **kw)


@pytest.mark.parametrize(("flag", "value", "range_text"), [
    ("--max-new-tokens", "-5", "from 1 to 4,294,967,295"),
    ("--max-new-tokens", "0", "from 1 to 4,294,967,295"),
    ("--max-new-tokens", "99999999999", "from 1 to 4,294,967,295"),
    ("--min-new-tokens", "-2", "from 0 to 4,294,967,295"),
    ("--top-k", "-3", "from 0 to 4,294,967,295"),
    ("--seed", "-1", "from 0 to 18,446,744,073,709,551,615"),
    ("--seed", "18446744073709551616", "from 0 to 18,446,744,073,709,551,615"),
    ("--temperature", "-0.5", ">= 0"),
    ("--temperature", "nan", ">= 0"),
    ("--temperature", "1e39", ">= 0"),  # beyond float32: inf on the wire
    ("--top-p", "0", "in (0, 1]"),
    ("--top-p", "1.5", "in (0, 1]"),
    ("--repetition-penalty", "0", "> 0"),
    ("--repetition-penalty", "inf", "> 0"),
    ("--max-new-tokens", "ten", "from 1 to 4,294,967,295"),
])
def test_an_out_of_range_number_is_bad_usage_naming_the_flag_and_range(flag, value, range_text):
    result = run_cli("generate", "hi", flag, value)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert f"argument {flag}: " in result.stderr
    assert range_text in result.stderr
    assert result.stdout == ""


def test_admit_checks_its_numbers_too():
    result = run_cli("admit", "hi", "--max-new-tokens", "-5")
    assert result.returncode == 2 and "argument --max-new-tokens: " in result.stderr


def test_a_non_positive_timeout_is_bad_usage():
    result = run_cli("--timeout", "0", "budget")
    assert result.returncode == 2 and "argument --timeout: " in result.stderr


@pytest.mark.parametrize(("flag", "value"), [
    ("--max-new-tokens", "4294967295"), ("--seed", "18446744073709551615"), ("--top-k", "0"),
    ("--top-p", "1"), ("--temperature", "0"),
])
def test_a_number_at_the_edge_of_its_range_passes_parsing(flag, value):
    # Past parsing, the call meets no server: UNAVAILABLE, exit 1, not usage (2).
    result = run_cli("generate", "hi", flag, value)
    assert result.returncode == 1, result.stderr
    assert "error [UNAVAILABLE]" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(("flag", "value", "range_text"), [
    ("--logprobs", "-1", "from 0 to 4,294,967,295"),
    ("--presence-penalty", "nan", "a finite number"),
    ("--frequency-penalty", "1e39", "a finite number"),  # beyond float32: inf on the wire
    ("--min-p", "inf", "a finite number"),
])
def test_the_newer_sampling_flags_check_their_proto_types_range(flag, value, range_text):
    result = run_cli("generate", "hi", flag, value)
    assert result.returncode == 2 and f"argument {flag}: " in result.stderr
    assert range_text in result.stderr and result.stdout == ""


def test_two_constraint_flags_are_bad_usage():
    result = run_cli("generate", "hi", "--json-object", "--regex", "a+")
    assert result.returncode == 2 and "not allowed with argument" in result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr


@pytest.mark.parametrize("flag", ["--json-schema", "--grammar"])
def test_a_constraint_file_that_cannot_be_read_is_bad_usage_naming_it(flag, tmp_path):
    missing = tmp_path / "missing.json"
    result = run_cli("generate", "hi", flag, str(missing))
    assert result.returncode == 2, result.stderr
    assert f"argument {flag}: cannot read {str(missing)!r}" in result.stderr


@pytest.mark.parametrize("args", [
    ("--json-schema", '{"type": "object"}'), ("--json-object",), ("--regex", "a+"),
    ("--logprobs", "2", "--presence-penalty", "-2", "--frequency-penalty", "2", "--min-p", "0"),
])
def test_the_constraint_and_logprobs_flags_pass_parsing(args):
    # Past parsing, the call meets no server: UNAVAILABLE, exit 1, not usage (2).
    result = run_cli("generate", "hi", *args)
    assert result.returncode == 1 and "error [UNAVAILABLE]" in result.stderr, result.stderr


def test_admit_takes_a_constraint_from_a_file(tmp_path):
    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "object"}', encoding="utf-8")
    result = run_cli("admit", "hi", "--json-schema", str(schema))
    assert result.returncode == 1 and "error [UNAVAILABLE]" in result.stderr, result.stderr


def test_version_prints_the_installed_package_version_on_stdout():
    result = subprocess.run([str(ORTSERVE), "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"ortserve {metadata.version('ortserve')}\n"



@pytest.mark.parametrize("entry_point", ["ortserve-scheduler", "ortserve-worker",
                                         "ortserve-gateway", "ortserve-probe"])
def test_every_entry_point_has_version(entry_point):
    out = subprocess.run([str(Path(sys.executable).with_name(entry_point)), "--version"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"{entry_point} {metadata.version('ortserve')}"


@pytest.mark.parametrize("command", [["load-adapter", "a", "/x.onnx_adapter"], ["unload-adapter", "a"]])
@pytest.mark.parametrize("form", [["--worker", "w-2"], ["--worker=w-2"]])
def test_the_adapter_commands_take_worker_beside_the_worker_tls_flags(command, form):
    # docs/features/lora.md's line: --worker was "ambiguous" with --worker-ca/-cert/-key
    # (argparse matched the subcommand's flag as a prefix of the top parser's), exit 2.
    from ortserve_client.cli import build_parser

    a = build_parser().parse_args([*command, *form])
    assert a.worker == "w-2"
    a = build_parser().parse_args(["--worker-ca", "ca.pem", *command, *form])
    assert (a.worker, a.worker_ca) == ("w-2", "ca.pem")


@pytest.mark.parametrize("command", [("generate", "hi"), ("admit", "hi"), ("chat",)])
@pytest.mark.parametrize("flag", ["--max-itl-ms", "--max-ttft-ms"])
def test_every_command_that_generates_takes_the_goal_flags_checked(command, flag):
    # `ortserve chat` sends them with each turn (a session turn is admitted by time too).
    result = run_cli(*command, flag, "-1", input="")
    assert result.returncode == 2, result.stderr
    assert f"argument {flag}: " in result.stderr and "uint32" in result.stderr
