"""API-key files and lease secrets: parsing and checking, no server."""

from __future__ import annotations

import pytest

from ortserve.rpc.auth import Role, load_keys, parse_keys
from ortserve.status.errors import DomainError, ErrorReason
from scheduler_service.lease_secrets import LeaseSecrets


def test_admin_keys_include_generate_and_comments_are_ignored(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# operators\nadmin:adm-0123456789abcdef\n\ngenerate:gen-0123456789abcdef # app\n")
    keys = load_keys(str(path), "generate:env-0123456789abcdef")
    assert len(keys) == 3
    assert keys.roles("adm-0123456789abcdef") == {Role.ADMIN, Role.GENERATE}
    assert keys.roles("gen-0123456789abcdef") == {Role.GENERATE}
    assert keys.roles("env-0123456789abcdef") == {Role.GENERATE}
    assert keys.roles("gen-0123456789abcdeX") is None
    assert not load_keys(None, None).enabled


@pytest.mark.parametrize(("text", "says"), [
    ("admin", "expected role:key"),
    ("root:0123456789abcdef0", "unknown role 'root'"),
    ("generate:short", "is 5 chars; use at least 16"),
])
def test_a_bad_key_entry_names_the_line_and_the_fix(text, says):
    with pytest.raises(ValueError, match=says) as err:
        parse_keys(f"# header\n{text}", "keys.txt")
    assert "keys.txt line 2" in str(err.value)


def test_lease_secret_is_per_lease_and_per_scheduler():
    secrets = LeaseSecrets()
    secrets.check("L1", secrets.of("L1"))
    for wrong in ("", secrets.of("L2"), LeaseSecrets().of("L1")):
        with pytest.raises(DomainError) as err:
            secrets.check("L1", wrong)
        assert err.value.reason is ErrorReason.LEASE_SECRET_MISMATCH


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("localhost", True), ("::1", True), ("[::1]", True),
    ("0.0.0.0", False), ("", False), ("10.0.0.5", False), ("scheduler", False)])
def test_plaintext_and_open_ports_warn_unless_bound_to_loopback(host, loopback):
    from ortserve.rpc.tls import is_loopback

    assert is_loopback(host) is loopback


def test_every_scheduler_rpc_has_a_role():
    # A method missing from METHOD_ROLES is admin-only: every public RPC is decided here.
    from ortserve.rpc.auth import METHOD_ROLES
    from ortserve.v1 import scheduler_pb2

    service = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"]
    methods = {f"/{service.full_name}/{m.name}" for m in service.methods}
    assert methods - set(METHOD_ROLES) == set()
    sessions = [m for m in methods if "Session" in m]
    assert len(sessions) == 5 and {METHOD_ROLES[m] for m in sessions} == {Role.GENERATE}
