"""The adapter catalog (a TOML file or a folder) and the on-demand load: once per adapter
however many requests name it at once, on the worker with the most free bytes, and
ADAPTER_NO_ROOM with the numbers where no worker of the model has the adapter's bytes free."""

from __future__ import annotations

import asyncio

import pytest

from ortserve.status.errors import DomainError, ErrorReason
from scheduler_service.adapter_catalog import AdapterCatalog, CatalogError, OnDemand
from scheduler_service.ledger.ledger import AdmissionRequest, Ledger, WorkerGeometry

BPT = 1_000


def test_a_toml_catalog_names_path_and_model_and_a_folder_its_files(tmp_path):
    toml = tmp_path / "adapters.toml"
    toml.write_text('[adapters.fr]\npath = "/a/fr.onnx_adapter"\nmodel = "m"\n'
                    '[adapters.any]\npath = "/a/any.onnx_adapter"\n')
    catalog = AdapterCatalog.load(str(toml))
    assert catalog.find("fr", "m").path == "/a/fr.onnx_adapter"
    assert catalog.find("fr", "other") is None  # made for another base
    assert catalog.find("any", "other").path == "/a/any.onnx_adapter"
    assert catalog.find("de", "m") is None
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "x.onnx_adapter").write_bytes(b"0")
    (tmp_path / "dir" / "notes.txt").write_text("")
    assert list(AdapterCatalog.load(str(tmp_path / "dir")).entries) == ["x"]
    assert AdapterCatalog.load("").entries == {}


@pytest.mark.parametrize(("text", "names"), [
    ("[adapters.fr]\nmodel = 'm'\n", "path"),
    ("[adapters.fr]\npath = '/a'\nrank = 4\n", "path"),
    ("[other]\nx = 1\n", "[adapters.NAME]"),
    ("[adapters.fr\n", "adapters.toml"),
])
def test_a_bad_catalog_is_refused_naming_the_file_and_field(tmp_path, text, names):
    toml = tmp_path / "adapters.toml"
    toml.write_text(text)
    with pytest.raises(CatalogError, match="adapters.toml") as error:
        AdapterCatalog.load(str(toml))
    assert names in str(error.value)


def ledger_with(*free_tokens: int) -> Ledger:
    ledger = Ledger(lease_ttl_s=1e9, claim_ttl_s=1e9)
    for i, tokens in enumerate(free_tokens):
        ledger.register(WorkerGeometry(worker_id=f"w{i}", address=f"w{i}:1", model="m",
                                       context_length=4_096, bytes_per_token=BPT,
                                       capacity_bytes=tokens * BPT))
    return ledger


def on_demand(tmp_path, ledger: Ledger, adapter_bytes: int):
    path = tmp_path / "fr.onnx_adapter"
    path.write_bytes(b"\0" * adapter_bytes)
    calls = []

    async def load(request):
        calls.append(request.worker_id)
        await asyncio.sleep(0.01)  # the worker's load takes a while: others wait for it
        ledger.resize_for_adapter(request.worker_id, request.name, adapter_bytes, loaded=True)

    catalog = AdapterCatalog({"fr": AdapterCatalog.load(str(tmp_path)).entries["fr"]})
    return OnDemand(catalog, ledger, load), calls


def test_many_requests_at_once_load_it_once_on_the_roomiest_worker(tmp_path):
    ledger = ledger_with(100, 300)
    loader, calls = on_demand(tmp_path, ledger, 5 * BPT)

    async def burst():
        await asyncio.gather(*(loader.ensure("fr", "m") for _ in range(5)))

    asyncio.run(burst())
    assert calls == ["w1"]
    asyncio.run(loader.ensure("", "m"))  # the base: nothing to load
    asyncio.run(loader.ensure("de", "m"))  # not catalogued: left to placement's NOT_FOUND
    assert calls == ["w1"]


def test_no_worker_with_room_is_adapter_no_room_with_the_numbers(tmp_path):
    ledger = ledger_with(100, 50)
    assert ledger.admit(AdmissionRequest("r", prompt_tokens=40, max_new_tokens=58,
                                         min_new_tokens=58, model="m")).worker.worker_id == "w0"
    loader, calls = on_demand(tmp_path, ledger, 60 * BPT)
    with pytest.raises(DomainError) as error:
        asyncio.run(loader.ensure("fr", "m"))
    assert error.value.reason is ErrorReason.ADAPTER_NO_ROOM and calls == []
    assert error.value.metadata["adapter_bytes"] == 60 * BPT
    assert error.value.metadata["largest_available_bytes"] == 50 * BPT
    assert "50,000 bytes" in str(error.value) and "'w1'" in str(error.value)
