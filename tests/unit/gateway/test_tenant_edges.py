"""Tenants and priorities at the edges: the gateway's parameter and header, the cap's
header and notice, the CLI's budget table."""

from __future__ import annotations

import argparse

import pytest
from ortserve_client import cli
from ortserve_client.report import cap_notice
from ortserve_client.types import BudgetCap
from starlette.applications import Starlette
from starlette.requests import Request

from gateway.caller import passed_through
from gateway.reply.ortserve_numbers import CAP_HEADER, admission_headers
from gateway.request.translate import ParamError, parse_request
from ortserve.v1 import scheduler_pb2, types_pb2

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_the_gateway_passes_vllms_priority_on_and_refuses_a_non_integer():
    assert parse_request("chat", {**BODY, "priority": -5}).generate.priority == -5
    assert not parse_request("chat", BODY).generate.HasField("priority")
    assert parse_request("completion", {"model": "m", "prompt": "x", "priority": 3}).generate.priority == 3
    with pytest.raises(ParamError) as refused:
        parse_request("chat", {**BODY, "priority": "high"})
    assert refused.value.param == "priority"


def _request(headers: dict[str, str], tenant_header: str) -> Request:
    app = Starlette()
    app.state.tenant_header = tenant_header
    return Request({"type": "http", "app": app, "headers": [
        (k.lower().encode(), v.encode()) for k, v in headers.items()]})


def test_the_gateway_sends_the_tenant_header_as_metadata_only_when_configured():
    headers = {"Authorization": "Bearer k", "X-Team": "batch"}
    assert passed_through(_request(headers, "X-Team")) == (("authorization", "Bearer k"),
                                                           ("ortserve-tenant", "batch"))
    assert passed_through(_request(headers, "")) == (("authorization", "Bearer k"),)
    # Anthropic's SDKs send their key as x-api-key: a bearer key, the tenant header kept.
    anthropic = {"x-api-key": "k", "X-Team": "batch"}
    assert passed_through(_request(anthropic, "X-Team"), "x-api-key") == (
        ("authorization", "Bearer k"), ("ortserve-tenant", "batch"))
    assert passed_through(_request(anthropic, "X-Team")) == (("ortserve-tenant", "batch"),)


def _tenant_cap() -> types_pb2.BudgetCap:
    return types_pb2.BudgetCap(requested_max_new_tokens=200, admitted_max_new_tokens=50,
                               requested_bytes=2_500, admitted_bytes=1_000, available_bytes=1_000,
                               capacity_bytes=10_000, bytes_per_token=10, prompt_tokens=50,
                               worker_id="w1", reason="r", limit=types_pb2.CAP_LIMIT_TENANT_QUOTA,
                               tenant="small", tenant_quota_bytes=3_000, tenant_reserved_bytes=2_000)


def test_a_tenant_cap_carries_its_numbers_in_the_gateway_header_and_the_clients_notice():
    adm = types_pb2.Admission(decision=types_pb2.CAPPED, budget_cap=_tenant_cap())
    header = admission_headers(adm)[CAP_HEADER]
    assert ('limit="tenant_quota", tenant="small", tenant_quota_bytes=3000, '
            'tenant_reserved_bytes=2000') in header
    cap = BudgetCap.from_pb(_tenant_cap())
    assert cap.limit == "tenant_quota" and cap.tenant_quota_bytes == 3_000
    assert cap_notice(cap).startswith("CAPPED by tenant small's KV quota")
    assert "held 2.0 KiB of its 2.9 KiB quota" in cap_notice(cap)


def test_ortserve_budget_prints_each_tenants_reserved_quota_and_queue(capsys):
    budget = scheduler_pb2.Budget(tenants_source="t.toml", tenants=[
        scheduler_pb2.TenantBudget(tenant="small", model="m", reserved_bytes=3_000,
                                   quota_bytes=3_000, weight=1, leases=1, queue_length=2,
                                   queue_waiting_bytes=2_000),
        scheduler_pb2.TenantBudget(tenant="free", model="m", weight=1)])

    class Fake:
        def budget(self, include_leases=False):
            return budget

    assert cli.cmd_budget(Fake(), argparse.Namespace(leases=False, json=False)) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "(t.toml)" in out
    small = next(line for line in out.splitlines() if line.startswith("small"))
    assert small.split() == ["small", "m", "2.9", "KiB", "2.9", "KiB", "1", "1", "2", "2.0", "KiB",
                            "0", "B"]
    assert next(line for line in out.splitlines() if line.startswith("free")).split()[4] == "none"
