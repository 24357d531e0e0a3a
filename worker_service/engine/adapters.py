"""The LoRA adapters an engine serves, and the rule for changing them: only between two
engine steps (an adapter's values are bound into the runs, and a per-row graph restacks
them all), and never one a running sequence or an open session's K/V was computed under.

The adapters themselves (reading, checking, binding) are runtime/lora.py's AdapterSet;
the runtime admin that moves their bytes in the KV capacity and the ledger is
adapter_admin.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from worker_service.runtime.lora import Adapter, AdapterBusy, AdapterNotFound, AdapterSet
from worker_service.runtime.prefix_cache import PrefixCache

# (sequence ids running under the adapter, session ids holding K/V computed under it)
InUse = Callable[[str], tuple[list[str], list[str]]]


class EngineAdapters:
    """`served`: the runner's AdapterSet where its graph takes LoRA weights as inputs;
    None where it takes none (then every adapter name is not found)."""

    def __init__(self, served: AdapterSet | None, step_lock: threading.Lock,
                 lock: threading.Condition, in_use: InUse,
                 prefix_cache: PrefixCache | None) -> None:
        self.served = served
        self._step_lock = step_lock
        self._lock = lock
        self._in_use = in_use  # called holding both locks
        self._prefix_cache = prefix_cache

    def names(self) -> list[str]:
        return self.served.names() if self.served is not None else []

    def loaded(self) -> list[Adapter]:
        """The adapters served now, by name."""
        return [self.served.adapters[n] for n in self.names()] if self.served is not None else []

    def total_bytes(self) -> int:
        """Bytes the loaded adapters hold (on the session's device)."""
        return self.served.total_bytes() if self.served is not None else 0

    def check(self, name: str) -> None:
        """Raise AdapterNotFound unless this engine serves adapter `name`."""
        if self.served is None:
            raise AdapterNotFound(name, [])
        self.served.check(name)

    def read(self, name: str, path: str | Path, field: str = "--lora") -> Adapter:
        """Read and check an adapter file without serving it (AdapterSet.read)."""
        if self.served is None:
            raise AdapterNotFound(name, [])
        return self.served.read(name, path, field)

    def add(self, adapter: Adapter) -> None:
        """Serve an adapter `read` returned, between two engine steps."""
        if self.served is None:
            raise AdapterNotFound(adapter.name, [])
        with self._step_lock, self._lock:
            self.served.add(adapter)

    def remove(self, name: str) -> Adapter:
        """Stop serving adapter `name`, between two engine steps; AdapterBusy while sequences
        run under it or open sessions hold K/V computed under it. Its prefix-cache blocks go
        with it (the cache is cleared: a later adapter of that name must not find them)."""
        if self.served is None:
            raise AdapterNotFound(name, [])
        with self._step_lock, self._lock:
            self.served.check(name)
            running, sessions = self._in_use(name)
            if running or sessions:
                raise AdapterBusy(name, running, sessions)
            adapter = self.served.unload(name)
        if self._prefix_cache is not None:
            self._prefix_cache.clear()
        return adapter
