"""LoRA adapters loaded on demand: a catalog of adapter files the scheduler knows, and the
step that loads a catalogued adapter no worker serves onto a worker with room before the
request naming it is admitted (docs/features/lora.md#loaded-on-demand).

The catalog is a TOML file (`--adapter-catalog adapters.toml`):

    [adapters.french]
    model = "smollm2-135m-instruct-fp32"   # the base it was trained for
    path = "/models/adapters/french.onnx_adapter"   # as the workers see it

or a folder of NAME.onnx_adapter files (any model's workers may load them; a file made
for another base is refused by the worker that tries). The load is the operator's load
(Scheduler.LoadAdapter's path): the worker takes the adapter's bytes out of its capacity
and the ledger's in one call, so the ledger's rules hold, and a worker whose leases leave
no room refuses with ADAPTER_NO_ROOM and its numbers.
"""

from __future__ import annotations

import asyncio
import tomllib
from dataclasses import dataclass
from pathlib import Path

import structlog

from ortserve.status.errors import DomainError, ErrorReason, quoted
from ortserve.status.units import human_bytes
from ortserve.v1 import types_pb2
from scheduler_service.ledger import placement
from scheduler_service.ledger.ledger import Ledger

log = structlog.get_logger("scheduler")
SUFFIX = ".onnx_adapter"


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    path: str  # on the workers' file system
    model: str = ""  # the base it is for; "": any


class CatalogError(ValueError):
    """A catalog that cannot be read: the message names the file and the field."""


@dataclass(frozen=True)
class AdapterCatalog:
    entries: dict[str, CatalogEntry]
    source: str = ""

    @classmethod
    def load(cls, path: str) -> AdapterCatalog:
        """A TOML file or a folder of *.onnx_adapter files; "" is the empty catalog."""
        if not path:
            return cls({})
        p = Path(path)
        if p.is_dir():
            return cls({f.name[:-len(SUFFIX)]: CatalogEntry(f.name[:-len(SUFFIX)], str(f))
                        for f in sorted(p.glob(f"*{SUFFIX}"))}, str(p))
        try:
            data = tomllib.loads(p.read_text())
        except (OSError, tomllib.TOMLDecodeError) as error:
            raise CatalogError(f"adapter catalog {path}: {error}") from None
        table = data.get("adapters")
        if not isinstance(table, dict) or set(data) - {"adapters"}:
            raise CatalogError(f"adapter catalog {path}: expected only [adapters.NAME] tables "
                               f"(found {sorted(data) or 'nothing'})")
        entries = {}
        for name, entry in table.items():
            if not isinstance(entry, dict) or not isinstance(entry.get("path"), str) \
                    or set(entry) - {"path", "model"} or not isinstance(entry.get("model", ""), str):
                raise CatalogError(f"adapter catalog {path}: [adapters.{name}] needs path "
                                   "(a string) and may name model (a string), nothing else")
            entries[name] = CatalogEntry(name, entry["path"], entry.get("model", ""))
        return cls(entries, str(p))

    def find(self, name: str, model: str) -> CatalogEntry | None:
        entry = self.entries.get(name)
        if entry is None or (entry.model and model and entry.model != model):
            return None
        return entry


def no_room(entry: CatalogEntry, adapter_bytes: int, workers: list) -> DomainError:
    """No worker of the model has the adapter's bytes free now (RESOURCE_EXHAUSTED)."""
    best = max(workers, key=lambda w: w.available_bytes, default=None)
    free = best.available_bytes if best is not None else 0
    return DomainError(
        ErrorReason.ADAPTER_NO_ROOM,
        f"adapter {quoted(entry.name)} is catalogued but loaded nowhere, and loading it needs "
        f"{human_bytes(adapter_bytes)} ({adapter_bytes:,} bytes) free on a worker; the most "
        f"any of the {len(workers)} worker(s) of the model has free is "
        f"{human_bytes(free)} ({free:,} bytes)"
        + (f" (worker {quoted(best.geometry.worker_id)})" if best is not None else "")
        + "; retry when requests finish, unload an adapter, or add a worker",
        metadata={"adapter": entry.name, "adapter_bytes": adapter_bytes,
                  "largest_available_bytes": free, "workers": len(workers)})


class OnDemand:
    """Loads a catalogued adapter that no worker of the request's model serves, once, on
    the worker with the most free bytes; the request then goes through admission as any."""

    def __init__(self, catalog: AdapterCatalog, ledger: Ledger, load) -> None:
        """`load(LoadAdapterRequest)`: the operator's load (AdapterAdmin.load)."""
        self._catalog, self._ledger, self._load = catalog, ledger, load
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    def _served(self, adapter: str, model: str) -> bool:
        return any(w.geometry.serves_adapter(adapter)
                   for w in placement.serving(self._ledger.snapshot(), model))

    async def ensure(self, adapter: str, model: str) -> None:
        entry = self._catalog.find(adapter, model) if adapter else None
        if entry is None or self._served(adapter, model):
            return  # the base, served already, or not catalogued (placement's NOT_FOUND)
        # One load per adapter: requests that name it meanwhile wait for it.
        async with self._locks.setdefault((model, adapter), asyncio.Lock()):
            if self._served(adapter, model):
                return
            workers = [w for w in placement.serving(self._ledger.snapshot(), model)
                       if not w.draining]
            # The file's size: what the worker will hold, give or take its header.
            try:
                adapter_bytes = Path(entry.path).stat().st_size
            except OSError:
                adapter_bytes = 0  # not visible here: the worker's own load decides
            roomy = sorted((w for w in workers if w.available_bytes >= adapter_bytes),
                           key=lambda w: -w.available_bytes)
            if not roomy:
                raise no_room(entry, adapter_bytes, workers)
            chosen = roomy[0].geometry.worker_id
            log.info("loading a catalogued adapter on demand", adapter=adapter, model=model,
                     worker_id=chosen, path=entry.path, file_bytes=adapter_bytes)
            await self._load(types_pb2.LoadAdapterRequest(worker_id=chosen, name=adapter,
                                                          path=entry.path))
