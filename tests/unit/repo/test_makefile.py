"""`make setup` checks the interpreter before anything and says what it does.

Stub interpreters stand in for Python 3.10 and 3.11 (no pip runs): each answers
the version probe the Makefile sends, and the 3.11 one makes a fake venv whose
pip only records its arguments. The venv goes to a temp dir (VENV=...), never
to the checkout's .venv.
"""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from devtools.cluster import model_cache

ROOT = Path(__file__).resolve().parents[3]

# $1 is "-c" for the version probe, "-m venv DIR" to create a venv.
STUB = textwrap.dedent("""\
    #!/bin/sh
    case "$1" in
      -c) echo {version} ;;
      --version) echo "Python {version}" ;;
      -m) [ "$2" = venv ] || exit 9
          mkdir -p "$3/bin" && cp "$0" "$3/bin/python"
          printf '#!/bin/sh\\necho "pip $*" >> "$(dirname "$0")/../pip.log"\\n' > "$3/bin/pip"
          chmod +x "$3/bin/pip" ;;
    esac
    """)

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")


def stub_python(folder: Path, version: str) -> Path:
    path = folder / f"python-{version}"
    path.write_text(STUB.format(version=version))
    path.chmod(0o755)
    return path


def make_setup(python: Path, venv: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "setup", f"PYTHON={python}",
                           f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False)


def test_setup_with_python_3_10_fails_naming_3_11_and_leaves_no_venv(tmp_path):
    venv = tmp_path / "venv"
    result = make_setup(stub_python(tmp_path, "3.10.12"), venv)
    assert result.returncode != 0
    assert "3.11" in result.stderr and "3.10.12" in result.stderr, result.stderr
    assert not venv.exists()
    assert result.stdout == ""


def test_a_venv_made_by_an_older_python_is_recreated(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    shutil.copy2(stub_python(tmp_path, "3.10.12"), venv / "bin" / "python")
    (venv / ".stamp").touch()  # the older run had finished: only the interpreter is wrong
    (venv / "made-by-3.10").touch()
    result = make_setup(stub_python(tmp_path, "3.11.9"), venv)
    assert result.returncode == 0, result.stderr
    assert not (venv / "made-by-3.10").exists()
    assert "removing" in result.stderr and "3.10.12" in result.stderr
    assert (venv / ".stamp").is_file()
    assert "install -q -e .[dev]" in (venv / "pip.log").read_text()


def test_each_setup_step_prints_one_banner_with_its_expected_duration(tmp_path):
    result = make_setup(stub_python(tmp_path, "3.11.9"), tmp_path / "venv")
    assert result.returncode == 0, result.stderr
    banners = [line for line in result.stderr.splitlines() if "(expected: " in line]
    assert len(banners) == 3, result.stderr  # the venv, pip, ortserve and its dependencies
    assert result.stdout == ""  # stdout is for results (make run's answer)
    # Up to date: nothing to do, nothing said.
    again = make_setup(stub_python(tmp_path, "3.11.9"), tmp_path / "venv")
    assert again.returncode == 0 and "(expected: " not in again.stderr


def test_make_run_prerequisites_print_nothing_on_stdout_when_prepared(tmp_path):
    # `make run` = setup, model, then the runner (whose stdout is the answer). Up to date,
    # the prerequisites must add nothing to stdout: no recipe echo, no paths. A probe goal
    # stands in for run, so make's own "Nothing to be done" notice for goals does not apply.
    if subprocess.run(["make", "-q", "setup", "tools-setup"], cwd=ROOT,
                      capture_output=True, check=False).returncode != 0:
        pytest.skip("the virtualenvs are not set up (make setup tools-setup)")
    models = model_cache().expanduser() / "models"
    if not all((models / name / "ortserve-model.json").is_file() for name in (
            "smollm2-135m-instruct-fp32", "smollm2-135m-instruct-int4", "tiny-llama")):
        pytest.skip("the models are not prepared (make model tiny-model)")
    probe = tmp_path / "probe.mk"
    probe.write_text("probe: setup model tiny-model\n\t@true\n")
    result = subprocess.run(["make", "--no-print-directory", "-f", "Makefile", "-f", str(probe),
                             "probe"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert result.stderr.count("already prepared") == 3, result.stderr
