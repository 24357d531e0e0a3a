"""A flag's environment variable is checked as the flag would be, and a bad one is named."""

from __future__ import annotations

import argparse

import pytest

from gateway.__main__ import parse_config as gateway_config
from scheduler_service.__main__ import parse_config as scheduler_config
from worker_service.__main__ import parse_config as worker_config

# Each service's parse_config with nothing on its command line but what it requires.
PARSE = {"ORTSERVE_SCHEDULER_": lambda: scheduler_config([]),
         "ORTSERVE_WORKER_": lambda: worker_config(["--model-dir", "m"]),
         "ORTSERVE_GATEWAY_": lambda: gateway_config([])}


@pytest.mark.parametrize("key, value, says", [
    ("ORTSERVE_SCHEDULER_LEASE_TTL_S", "abc", "is not a number"),
    ("ORTSERVE_SCHEDULER_PORT", "50051.5", "is not a whole number"),
    ("ORTSERVE_SCHEDULER_METRICS_PORT", "x", "is not a whole number"),
    ("ORTSERVE_SCHEDULER_DRAIN_TIMEOUT_S", "soon", "is not a number"),
    # argparse never checks a default against its choices: per-request would have been
    # taken silently for any word but "shared".
    ("ORTSERVE_SCHEDULER_RELAY_CALLS", "bogus", "is not one of shared, per-request"),
    ("ORTSERVE_SCHEDULER_LOG_JSON", "ture", "is not a yes or no"),
    ("ORTSERVE_WORKER_MAX_BATCH_ROWS", "abc", "is not a whole number"),
    ("ORTSERVE_WORKER_DEVICE", "gpu", "is not one of auto, cpu, cuda"),
    ("ORTSERVE_WORKER_SPIN_WAIT", "maybe", "is not one of on, off"),
    ("ORTSERVE_WORKER_CUDA_GRAPHS", "maybe", "is not one of on, off"),
    ("ORTSERVE_WORKER_DRAIN_TIMEOUT_S", "1m", "is not a number"),
    ("ORTSERVE_WORKER_LOG_JSON", "2", "is not a yes or no"),
    ("ORTSERVE_GATEWAY_STREAM_INTERVAL_MS", "fast", "is not a whole number"),
    ("ORTSERVE_GATEWAY_DIRECT_TO_WORKERS", "sure", "is not a yes or no"),
    # A level logging does not know was a traceback from configure_logging (exit 1).
    ("ORTSERVE_SCHEDULER_LOG_LEVEL", "loud", "is not one of debug, info, warning, error"),
    ("ORTSERVE_WORKER_LOG_LEVEL", "loud", "is not one of debug, info, warning, error"),
    ("ORTSERVE_GATEWAY_LOG_LEVEL", "loud", "is not one of debug, info, warning, error"),
])
def test_a_bad_variable_is_named_and_stops_the_service(monkeypatch, capsys, key, value, says):
    monkeypatch.setenv(key, value)
    [parse] = [parse for prefix, parse in PARSE.items() if key.startswith(prefix)]
    with pytest.raises(SystemExit) as exit_:
        parse()
    assert exit_.value.code == 2  # as a bad flag: the environment must change
    assert f"{key}={value!r} {says}" in capsys.readouterr().err


def test_good_variables_are_taken_and_flags_override_them(monkeypatch):
    monkeypatch.setenv("ORTSERVE_SCHEDULER_RELAY_CALLS", "per-request")
    monkeypatch.setenv("ORTSERVE_SCHEDULER_LOG_JSON", "Off")
    monkeypatch.setenv("ORTSERVE_SCHEDULER_METRICS_PORT", "9100")
    config = scheduler_config([])
    assert (config.relay_calls, config.log_json, config.metrics_port) == ("per-request", False, 9100)
    assert scheduler_config(["--relay-calls", "shared"]).relay_calls == "shared"
    monkeypatch.setenv("ORTSERVE_WORKER_DEVICE", "cpu")
    monkeypatch.setenv("ORTSERVE_WORKER_SPIN_WAIT", "off")
    worker = worker_config(["--model-dir", "m"])
    assert worker.device == "cpu" and worker.intra_op_spinning is False
    monkeypatch.setenv("ORTSERVE_GATEWAY_DIRECT_TO_WORKERS", "yes")
    assert gateway_config([]).direct_to_workers is True
    assert gateway_config(["--no-direct-to-workers"]).direct_to_workers is False


@pytest.mark.parametrize("prefix", list(PARSE))
def test_a_bad_log_level_flag_is_named_and_any_case_is_taken(monkeypatch, capsys, prefix):
    flags = {"ORTSERVE_WORKER_": ["--model-dir", "m"]}.get(prefix, [])
    parse = {"ORTSERVE_SCHEDULER_": scheduler_config, "ORTSERVE_WORKER_": worker_config,
             "ORTSERVE_GATEWAY_": gateway_config}[prefix]
    with pytest.raises(SystemExit) as exit_:
        parse([*flags, "--log-level", "loud"])
    assert exit_.value.code == 2
    assert "argument --log-level: invalid choice: 'loud'" in capsys.readouterr().err
    assert parse([*flags, "--log-level", "WARNING"]).log_level == "warning"
    monkeypatch.setenv(prefix + "LOG_LEVEL", "Debug")
    assert parse(flags).log_level == "debug"


@pytest.mark.parametrize("key, value, says", [
    ("ORTSERVE_WORKER_MAX_BATCH_ROWS", "2000", "2,000 is outside 1 to 1,024"),
    ("ORTSERVE_SCHEDULER_MAX_QUEUE_LENGTH", "-1", "-1 is below 0"),
    ("ORTSERVE_SCHEDULER_MAX_QUEUE_WAIT_S", "-0.5", "-0.5 is below 0"),
    ("ORTSERVE_SCHEDULER_WORKER_KEEPALIVE_S", "0.2", "a keepalive interval of 0.2 s is outside"),
    ("ORTSERVE_GATEWAY_PORT", "70000", "70,000 is outside 0 to 65,535"),
    ("ORTSERVE_GATEWAY_STREAM_INTERVAL_MS", "10001", "10,001 ms is outside 0 to 10,000 ms"),
    ("ORTSERVE_GATEWAY_REQUEST_TIMEOUT_S", "0", "0 s must be above 0"),
])
def test_an_out_of_range_variable_is_named_not_its_flag(monkeypatch, capsys, key, value, says):
    monkeypatch.setenv(key, value)
    [parse] = [parse for prefix, parse in PARSE.items() if key.startswith(prefix)]
    with pytest.raises(SystemExit) as exit_:
        parse()
    message = capsys.readouterr().err.strip().splitlines()[-1]  # after argparse's usage
    assert exit_.value.code == 2
    assert f"{key}: {says}" in message
    flag = "--" + key.split("_", 2)[2].lower().replace("_", "-")
    assert flag not in message  # the user typed no flag


def test_the_lora_variable_is_checked_as_the_flag_is(monkeypatch, capsys):
    # Issue 52 item 7: ORTSERVE_WORKER_LORA=broken started the worker (the variable was never
    # read) while --lora broken exited 2.
    monkeypatch.setenv("ORTSERVE_WORKER_LORA", "broken")
    with pytest.raises(SystemExit) as exit_:
        worker_config(["--model-dir", "m"])
    assert exit_.value.code == 2
    assert "ORTSERVE_WORKER_LORA: wants NAME=PATH, got 'broken'" in capsys.readouterr().err
    monkeypatch.setenv("ORTSERVE_WORKER_LORA", "a=/x.onnx_adapter, b=/y.onnx_adapter")
    assert worker_config(["--model-dir", "m"]).lora == (("a", "/x.onnx_adapter"),
                                                        ("b", "/y.onnx_adapter"))


class _Parsed(Exception):
    pass


def _flags_with_a_rule(prefix: str, monkeypatch) -> list[tuple[str, str]]:
    """(variable, flag) of every flag of a service whose value has a rule (a type other than
    text, choices, a yes/no), read off the service's own parser."""
    seen = []

    def grab(self, *args, **kwargs):
        seen.append(self)
        raise _Parsed

    with monkeypatch.context() as m:
        m.setattr(argparse.ArgumentParser, "parse_args", grab)
        with pytest.raises(_Parsed):
            PARSE[prefix]()
    found = []
    for action in seen[0]._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        typed = action.type not in (None, str) or action.choices or isinstance(
            action, argparse.BooleanOptionalAction)
        if typed:
            found.append((prefix + action.dest.upper(), action.option_strings[0]))
    return found


@pytest.mark.parametrize("prefix", list(PARSE))
def test_every_flag_with_a_rule_has_its_variable_checked(monkeypatch, capsys, prefix):
    # The generic net (env_defaults.every_flag_from_env): whatever flag a service adds, its
    # variable with a value the flag refuses stops the service naming the variable.
    flags = _flags_with_a_rule(prefix, monkeypatch)
    assert len(flags) >= 5
    ignored = []
    for key, flag in flags:
        if key == "ORTSERVE_WORKER_SCHEDULER":
            continue
        monkeypatch.setenv(key, "\u00bfnot a valid value?")
        try:
            PARSE[prefix]()
            ignored.append(flag)
        except SystemExit as exit_:
            err = capsys.readouterr().err
            if exit_.code != 2 or key not in err:
                ignored.append(f"{flag} ({err.strip().splitlines()[-1]})")
        monkeypatch.delenv(key)
    assert not ignored, f"variables taken unchecked or not named: {ignored}"
