"""The tenants file: what it accepts, what it refuses (naming the line), whom a call is charged to."""

from __future__ import annotations

import pytest

from ortserve.status.errors import DomainError
from scheduler_service.ledger import tenants
from scheduler_service.ledger.tenants import Quota, TenantFileError, key_digest

KEY_A = "a" * 24
KEY_B = "b" * 24

GOOD = f"""
default_tenant = "batch"
trust_tenant_metadata = true

[tenants.interactive]
quota = "70%"
weight = 7
key_sha256 = ["{key_digest(KEY_A).hex()}"]

[tenants.batch]
quota = "2GiB"
weight = 3
key_sha256 = ["{key_digest(KEY_B).hex()}"]

[tenants.batch.models]
"SmolLM2-135M" = "30%"

[tenants.ops]
"""


def test_a_good_file_reads_quotas_weights_keys_and_per_model_quotas():
    table = tenants.parse(GOOD, "t.toml")
    assert set(table.tenants) == {"interactive", "batch", "ops"}
    assert table.tenants["interactive"].quota == Quota(share=0.7)
    assert table.quota_bytes("interactive", "m", 1000) == 700
    assert table.quota_bytes("batch", "other", 1000) == 2 * 1024**3
    assert table.quota_bytes("batch", "SmolLM2-135M", 1000) == 300  # its model's own line
    assert table.quota_bytes("ops", "m", 1000) is None  # no quota: the pool's room only
    assert table.weight("interactive") == 7 and table.weight("ops") == 1.0
    assert table.weight("nobody") == 1.0
    assert table.default_tenant == "batch" and table.trust_tenant_metadata


@pytest.mark.parametrize(("text", "line", "words"), [
    ('[tenants.a]\nquota = "30"\nweight = 1\n', 2, "not a byte size"),
    ('[tenants.a]\nquota = "130%"\n', 2, "at most 100 %"),
    ('[tenants.a]\nquota = -5\n', 2, "negative"),
    ('[tenants.a]\nquota = "10%"\n\nweight = 0\n', 4, "weight: must be a number > 0"),
    ('[tenants.a]\nquota = "10%"\nqouta = "1%"\n', 3, "unknown setting 'qouta'"),
    ('\n\ndefault_tenant = "z"\n[tenants.a]\n', 3, "default_tenant 'z' is not a tenant"),
    ('x = 1\n', 1, "unknown setting 'x'"),
    ('[tenants.a]\nkey_sha256 = ["abc"]\n', 2, "64 hex digits"),
    ('[tenants."a b"]\nquota = 1\n', 1, "tenant name 'a b'"),
    ('[tenants.a]\n[tenants.a.models]\nm1 = "1%"\nm2 = "x%"\n', 4, "not a percentage"),
    ('[tenants.a]\nquota = "1%"\n[tenants.b\n', 3, "not TOML"),
    ('trust_tenant_metadata = "yes"\n', 1, "true or false"),
])
def test_a_bad_file_is_refused_naming_its_line(text, line, words):
    with pytest.raises(TenantFileError) as refused:
        tenants.parse(text, "t.toml")
    assert f"line {line}" in str(refused.value) and words in str(refused.value)
    assert str(refused.value).startswith("t.toml")


def test_one_key_cannot_be_two_tenants():
    digest = key_digest(KEY_A).hex()
    with pytest.raises(TenantFileError, match="line 5: .*tenant 'a''s already"):
        tenants.parse(f'[tenants.a]\nkey_sha256 = ["{digest}"]\n\n[tenants.b]\n'
                      f'key_sha256 = ["{digest}"]\n', "t.toml")


def test_a_call_is_charged_to_its_keys_tenant_else_the_trusted_metadata_else_the_default():
    table = tenants.parse(GOOD, "t.toml")
    assert table.resolve(key_digest(KEY_A), None) == "interactive"
    assert table.resolve(key_digest(KEY_A), "interactive") == "interactive"
    assert table.resolve(None, "ops") == "ops"  # trusted gateway metadata, no key
    assert table.resolve(key_digest("unmapped" * 3), None) == "batch"  # the default
    assert table.resolve(None, None) == "batch"


def test_metadata_that_cannot_be_honoured_is_refused_never_ignored():
    table = tenants.parse(GOOD, "t.toml")
    with pytest.raises(DomainError, match="names tenant 'ops' but its API key is tenant 'interactive'"):
        table.resolve(key_digest(KEY_A), "ops")
    with pytest.raises(DomainError, match="not one of the 3"):
        table.resolve(None, "nobody")
    untrusting = tenants.parse(GOOD.replace("trust_tenant_metadata = true",
                                            "trust_tenant_metadata = false"), "t.toml")
    with pytest.raises(DomainError, match="does not trust ortserve-tenant metadata"):
        untrusting.resolve(None, "ops")
    assert untrusting.resolve(key_digest(KEY_B), None) == "batch"


def test_an_empty_table_charges_no_one():
    table = tenants.TenantTable()
    assert not table.enabled and table.resolve(None, None) == ""
    assert table.quota_bytes("anyone", "m", 100) is None


def test_a_rate_is_a_token_bucket_of_requests_per_second_with_a_burst():
    from scheduler_service.ledger.rate import RateLimits

    table = tenants.parse('[tenants.a]\nrequests_per_s = 2\nburst = 3\n[tenants.b]\n'
                          'requests_per_s = 0.5\n', "t.toml")
    a, b = table.tenants["a"], table.tenants["b"]
    assert (a.requests_per_s, a.burst, b.burst) == (2.0, 3, 1)
    limits = RateLimits()
    assert [limits.take(a, 0.0) for _ in range(4)] == [0.0, 0.0, 0.0, 0.5]  # 3 at once
    assert limits.take(a, 0.5) == 0.0 and limits.take(a, 0.5) == 0.5  # one back per 0.5 s
    assert limits.take(b, 0.0) == 0.0 and limits.take(b, 1.0) == pytest.approx(1.0)
    assert limits.take(table.tenants.get("nobody"), 0.0) == 0.0
    for text, line in (('[tenants.a]\nrequests_per_s = 0\n', 2),
                       ('[tenants.a]\nburst = 2\n', 2),
                       ('[tenants.a]\nrequests_per_s = 1\nburst = 0\n', 3)):
        with pytest.raises(TenantFileError, match=f"line {line}"):
            tenants.parse(text, "t.toml")
