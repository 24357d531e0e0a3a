"""One status table for the one reason enum, the same for every service."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import grpc

from ortserve.rpc import auth, error_path
from ortserve.status import status_table
from ortserve.status.errors import ErrorReason

ROOT = Path(__file__).resolve().parents[4]


def test_every_reason_maps_to_exactly_one_code():
    table = status_table.STATUS_OF_REASON
    assert set(table) == set(ErrorReason)  # a new reason must be given its code here
    assert all(isinstance(code, grpc.StatusCode) for code in table.values())
    # Never UNKNOWN, never OK: a reason is a precise failure.
    assert not {grpc.StatusCode.UNKNOWN, grpc.StatusCode.OK} & set(table.values())


def test_a_lease_that_does_not_exist_is_not_found_on_every_service():
    # The scheduler said NOT_FOUND and the worker FAILED_PRECONDITION once.
    assert status_table.status_of(ErrorReason.LEASE_NOT_FOUND) == grpc.StatusCode.NOT_FOUND
    assert status_table.status_of(ErrorReason.SESSION_NOT_FOUND) == grpc.StatusCode.NOT_FOUND


def test_the_error_path_and_the_auth_interceptor_use_the_one_table_object():
    assert error_path.STATUS_OF_REASON is status_table.STATUS_OF_REASON
    # register_service takes no table: a service cannot bring its own.
    assert list(inspect.signature(error_path.register_service).parameters) == [
        "server", "service", "servicer"]
    assert list(inspect.signature(error_path.domain_status).parameters) == ["error"]
    assert not hasattr(auth, "AUTH_STATUS")


def test_no_module_maps_a_reason_to_a_code_but_the_table():
    mapping = re.compile(r"ErrorReason\.\w+\s*:\s*(grpc\.)?(StatusCode|S)\.")
    for folder in ("scheduler_service", "worker_service", "gateway", "ortserve"):
        for source in (ROOT / folder).rglob("*.py"):
            if source.name == "status_table.py" or "/v1/" in source.as_posix():
                continue
            assert not mapping.search(source.read_text(encoding="utf-8")), source
