"""The scheduler's command line: what a bad --tenants-file says."""

from __future__ import annotations

import pytest

from scheduler_service.__main__ import parse_config


@pytest.mark.parametrize("by_variable", [False, True])
def test_a_missing_tenants_file_names_the_flag_its_variable_and_the_path(
        monkeypatch, capsys, tmp_path, by_variable):
    # Issue 52 item 11: it exited 2 with "[Errno 2] No such file or directory: '...'" alone.
    missing = str(tmp_path / "tenants.toml")
    if by_variable:
        monkeypatch.setenv("ORTSERVE_SCHEDULER_TENANTS_FILE", missing)
    with pytest.raises(SystemExit) as exit_:
        parse_config([] if by_variable else ["--tenants-file", missing])
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_.value.code == 2
    assert "--tenants-file" in message and "ORTSERVE_SCHEDULER_TENANTS_FILE" in message
    assert repr(missing) in message and "No such file or directory" in message
    assert "[Errno" not in message


def test_a_refused_tenants_file_names_the_flag_and_the_line(capsys, tmp_path):
    path = tmp_path / "tenants.toml"
    path.write_text("[tenants.a]\nquota = 'lots'\n")
    with pytest.raises(SystemExit) as exit_:
        parse_config(["--tenants-file", str(path)])
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_.value.code == 2 and message.startswith("ortserve-scheduler: error: --tenants-file: ")
    assert f"{path} line" in message
