"""The gateway's `model` naming a LoRA adapter (as vLLM takes it): its base, with it."""

from __future__ import annotations

import asyncio

from gateway.upstream import Upstream
from ortserve.v1 import scheduler_pb2, types_pb2


def upstream_serving(*budgets: scheduler_pb2.Budget) -> tuple[Upstream, list]:
    """An Upstream whose GetBudget answers `budgets` in turn (the last one from then on)."""
    upstream = Upstream("127.0.0.1:1", request_timeout_s=5, models_cache_s=3600)
    asked = []

    async def budget(timeout_s: float = 5.0, metadata=()):
        asked.append(metadata)
        return budgets[min(len(asked), len(budgets)) - 1]

    upstream.budget = budget
    return upstream, asked


def served(**adapters: list[str]) -> scheduler_pb2.Budget:
    return scheduler_pb2.Budget(models=[scheduler_pb2.ModelBudget(model=m, adapters=a)
                                        for m, a in adapters.items()])


async def resolve(upstream: Upstream, model: str) -> types_pb2.GenerateRequest:
    request = types_pb2.GenerateRequest(model=model)
    await upstream.resolve_adapter(request)
    return request


def test_an_adapters_name_becomes_its_base_with_that_adapter():
    async def check():
        upstream, _ = upstream_serving(served(base=["fr", "de"], other=[]))
        r = await resolve(upstream, "fr")
        assert (r.model, r.adapter) == ("base", "fr")
        r = await resolve(upstream, "base")
        assert (r.model, r.adapter) == ("base", "")
    asyncio.run(check())


def test_an_adapter_loaded_since_the_cached_listing_is_found_by_asking_again():
    async def check():
        upstream, asked = upstream_serving(served(base=[]), served(base=["late"]))
        assert (await resolve(upstream, "base")).adapter == ""  # caches the first listing
        r = await resolve(upstream, "late")
        assert (r.model, r.adapter) == ("base", "late") and len(asked) == 2
    asyncio.run(check())


def test_an_unknown_name_is_left_for_the_scheduler_to_refuse():
    async def check():
        upstream, _ = upstream_serving(served(base=["fr"]))
        r = await resolve(upstream, "nope")
        assert (r.model, r.adapter) == ("nope", "")
    asyncio.run(check())
