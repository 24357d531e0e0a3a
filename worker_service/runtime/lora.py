"""LoRA adapters over a base graph whose LoRA weights are graph inputs.

The graph (model_tools/lora.py) has, per adapted projection, two float inputs
`...lora_A...` [in, rank] and `...lora_B...` [rank, out] (B already scaled):
batch-shared, so one run serves one adapter, and rows of different adapters
decode in one run per adapter group. An adapter is a `.onnx_adapter` file
(onnxruntime.AdapterFormat) holding one value per LoRA input.

ORT's own switch, RunOptions.add_active_adapter, does not apply to runs with
IOBinding, which is how the runners run: so the adapter's OrtValues are bound
as inputs by name (`bind`). The base is zeros of rank 1 for every LoRA input
(a LoRA branch that adds exactly 0). Values live on the session's device,
made once at load, so a bind copies nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from worker_service.core.errors import EngineError, ErrorReason, InvalidWorkerField

BASE = ""  # the adapter name that means the base model
# A per-row graph (model_tools.lora --per-row): each LoRA input X is X.stacked
# [slots, in, rank], gathered by SLOT_INPUT [batch] (row b's slot), so rows of
# different adapters run in one run. Slot 0 is the base (zeros).
SLOT_INPUT = "lora_slot"
STACKED_SUFFIX = ".stacked"


def is_lora_input(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def lora_inputs(session: ort.InferenceSession) -> dict[str, list]:
    """The session's LoRA inputs: name -> declared shape (the rank axis symbolic)."""
    return {i.name: list(i.shape) for i in session.get_inputs() if is_lora_input(i.name)}


class AdapterNotFound(EngineError):
    """A request named an adapter this worker does not serve (NOT_FOUND, as an unserved
    model is: an adapter is a model name to the caller)."""

    reason = ErrorReason.MODEL_NOT_FOUND

    def __init__(self, name: str, served: list[str]) -> None:
        listed = ", ".join(served) if served else "none"
        super().__init__(f"adapter {name!r} is not served by this worker (served adapters: "
                         f"{listed}); name one of them, or leave the adapter empty for the base",
                         field="adapter", adapter=name, served_adapters=",".join(served))
        self.name, self.served = name, served


class AdapterBusy(EngineError):
    """An unload while sequences (or idle sessions, whose K/V was computed under it) use
    the adapter (FAILED_PRECONDITION): retry once they finish or close."""

    reason = ErrorReason.ADAPTER_BUSY

    def __init__(self, name: str, sequences: list[str], sessions: list[str]) -> None:
        users = ([f"{len(sequences)} running sequence(s) ({', '.join(sequences[:8])})"]
                 if sequences else []) + (
                [f"{len(sessions)} open session(s) ({', '.join(sessions[:8])})"] if sessions else [])
        super().__init__(f"adapter {name!r} is in use by {' and '.join(users)}; it unloads only "
                         "when idle: retry once they finish (sessions: close them)",
                         adapter=name, sequences=",".join(sequences[:32]),
                         sessions=",".join(sessions[:32]))


class AdapterNoRoom(EngineError):
    """Loading an adapter would take bytes the KV in use holds (RESOURCE_EXHAUSTED)."""

    reason = ErrorReason.ADAPTER_NO_ROOM

    def __init__(self, name: str, adapter_bytes: int, capacity_bytes: int,
                 in_use_bytes: int) -> None:
        free = max(capacity_bytes - in_use_bytes, 0)
        super().__init__(f"adapter {name!r} needs {adapter_bytes:,} bytes of this worker's "
                         f"{capacity_bytes:,}-byte KV capacity, but its sequences hold "
                         f"{in_use_bytes:,} bytes: {free:,} are free; retry when requests "
                         "finish, unload another adapter, or raise --kv-capacity",
                         adapter=name, adapter_bytes=adapter_bytes,
                         capacity_bytes=capacity_bytes, in_use_bytes=in_use_bytes)


@dataclass
class Adapter:
    name: str
    path: str
    rank: int
    nbytes: int  # parameter bytes held on the device
    values: dict[str, ort.OrtValue]
    host: dict[str, np.ndarray]  # the same values in host memory (a per-row graph restacks)


def parse_lora_flag(value: str) -> tuple[str, str]:
    """--lora NAME=PATH -> (name, path)."""
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise InvalidWorkerField("--lora", f"wants NAME=PATH, got {value!r}")
    return name, path


def parameter_bytes(path: str | Path) -> int:
    """The bytes an .onnx_adapter file's parameters take once loaded (what the worker
    counts against its capacity); raise InvalidWorkerField when it cannot be read."""
    try:
        adapter_file = ort.AdapterFormat.read_adapter(str(path))
        params = adapter_file.get_parameters()
        return sum(int(np.prod(v.shape())) * np.dtype(np.float32).itemsize
                   for v in params.values())
    except Exception as error:  # ORT raises its own types for an unreadable file
        raise InvalidWorkerField("--lora", f"{path} is not a readable .onnx_adapter file "
                             f"({error})") from error


class AdapterSet:
    """The adapters one worker serves, each bound as the LoRA inputs of its rows' runs."""

    def __init__(self, session: ort.InferenceSession, device: str = "cpu",
                 device_id: int = 0) -> None:
        found = lora_inputs(session)
        self.per_row = SLOT_INPUT in {i.name for i in session.get_inputs()}
        # The adapter's parameter names and shapes [in, rank] / [rank, out].
        self.inputs = ({name.removesuffix(STACKED_SUFFIX): shape[1:]
                        for name, shape in found.items()} if self.per_row else found)
        self.device, self.device_id = device, device_id
        self.adapters: dict[str, Adapter] = {}
        self._base = {name: self._ortvalue(np.zeros(self._base_shape(shape), np.float32))
                      for name, shape in self.inputs.items()}
        self.version = 0  # bumped when an adapter comes or goes (bindings re-bind)
        self._slots: dict[str, int] = {BASE: 0}
        self._stacked: dict[str, ort.OrtValue] = {}
        if self.per_row:
            self._restack()

    @property
    def enabled(self) -> bool:
        """Whether the graph takes LoRA weights as inputs at all."""
        return bool(self.inputs)

    def names(self) -> list[str]:
        return sorted(self.adapters)

    def total_bytes(self) -> int:
        return sum(a.nbytes for a in self.adapters.values())

    def load(self, name: str, path: str | Path) -> Adapter:
        """Load a .onnx_adapter file as `name`; raise InvalidWorkerField naming what does not fit."""
        return self.add(self.read(name, path))

    def read(self, name: str, path: str | Path, field: str = "--lora") -> Adapter:
        """Read and check a .onnx_adapter file as `name` without serving it yet (`add`
        does); raise InvalidWorkerField on `field` naming what does not fit."""
        if not self.enabled:
            raise InvalidWorkerField(
                field, f"adapter {name!r}: this base model has no LoRA inputs (no graph input named "
                f"*.lora_A.* / *.lora_B.*), so it cannot serve adapters; build a base with "
                f"`python -m model_tools.lora` or start without --lora")
        if not name or name in self.adapters:
            raise InvalidWorkerField(field, f"adapter name {name!r} is empty or already loaded "
                                 f"(loaded: {', '.join(self.names()) or 'none'})")
        path = Path(path)
        try:
            # The parameters' memory belongs to the AdapterFormat: it must outlive the copies.
            adapter_file = ort.AdapterFormat.read_adapter(str(path))
            params = adapter_file.get_parameters()
        except Exception as error:  # ORT raises its own types for an unreadable file
            raise InvalidWorkerField(field, f"adapter {name!r}: {path} is not a readable .onnx_adapter "
                                 f"file ({error})") from error
        missing = sorted(set(self.inputs) - set(params))
        extra = sorted(set(params) - set(self.inputs))
        if missing or extra:
            raise InvalidWorkerField(
                field, f"adapter {name!r} ({path}) does not fit this base: {len(missing)} LoRA inputs "
                f"missing (e.g. {missing[:2]}), {len(extra)} unknown (e.g. {extra[:2]}); "
                f"build the adapter against this base folder")
        values, host, ranks, nbytes = {}, {}, set(), 0
        for key, shape in self.inputs.items():
            array = params[key].numpy().copy()
            fixed = [(axis, dim) for axis, dim in enumerate(shape) if isinstance(dim, int)]
            if array.ndim != 2 or array.dtype != np.float32 or any(
                    array.shape[axis] != dim for axis, dim in fixed):
                raise InvalidWorkerField(field, f"adapter {name!r}: {key} is {array.dtype} "
                                     f"{list(array.shape)}, the graph wants float32 {shape}")
            ranks.add(array.shape[1] if ".lora_A." in key else array.shape[0])
            host[key] = np.ascontiguousarray(array)
            if not self.per_row:
                values[key] = self._ortvalue(host[key])
            nbytes += array.nbytes
        del params, adapter_file
        if len(ranks) != 1:
            raise InvalidWorkerField(field, f"adapter {name!r}: its weights disagree on the rank "
                                 f"({sorted(ranks)})")
        return Adapter(name, str(path), ranks.pop(), nbytes, values, host)

    def add(self, adapter: Adapter) -> Adapter:
        """Serve an adapter `read` made (between engine steps: a per-row graph restacks)."""
        if adapter.name in self.adapters:
            raise InvalidWorkerField("name", f"adapter {adapter.name!r} is already loaded "
                                 f"(loaded: {', '.join(self.names())})")
        self.adapters[adapter.name] = adapter
        if self.per_row:
            self._restack()
        else:
            self.version += 1
        return adapter

    def unload(self, name: str) -> Adapter:
        if name not in self.adapters:
            raise AdapterNotFound(name, self.names())
        adapter = self.adapters.pop(name)
        if self.per_row:
            self._restack()
        else:
            self.version += 1
        return adapter

    def slot(self, name: str) -> int:
        """A per-row graph: the stacked slot of adapter `name` (0: the base)."""
        return self._slots[name]

    def bind_stacked(self, binding: ort.IOBinding) -> None:
        """A per-row graph: bind every served adapter's values, stacked by slot."""
        for key, value in self._stacked.items():
            binding.bind_ortvalue_input(key + STACKED_SUFFIX, value)

    def _restack(self) -> None:
        # Ranks are padded to the largest with zeros (a zero column of A and row of B add
        # nothing), so adapters of different ranks share one stacked tensor.
        order = sorted(self.adapters)
        rank = max([a.rank for a in self.adapters.values()] + [1])
        self._slots = {BASE: 0, **{name: i + 1 for i, name in enumerate(order)}}
        stacked = {}
        for key, shape in self.inputs.items():
            is_a = ".lora_A." in key
            dims = (shape[0], rank) if is_a else (rank, shape[1])
            array = np.zeros((len(order) + 1, *dims), np.float32)
            for i, name in enumerate(order):
                value = self.adapters[name].host[key]
                if is_a:
                    array[i + 1, :, :value.shape[1]] = value
                else:
                    array[i + 1, :value.shape[0], :] = value
            stacked[key] = self._ortvalue(array)
        self._stacked = stacked
        self.version += 1

    def check(self, name: str) -> None:
        """Raise AdapterNotFound unless `name` is the base or a loaded adapter."""
        if name != BASE and name not in self.adapters:
            raise AdapterNotFound(name, self.names())

    def bind(self, binding: ort.IOBinding, name: str) -> None:
        """Bind adapter `name`'s values (BASE: the zeros) as the LoRA inputs."""
        if not self.inputs:
            if name != BASE:
                raise AdapterNotFound(name, [])
            return
        if self.per_row:
            raise ValueError("a per-row graph binds its adapters stacked (bind_stacked)")
        values = self._base if name == BASE else self.adapters[name].values
        for key, value in values.items():
            binding.bind_ortvalue_input(key, value)

    def _base_shape(self, shape: list) -> tuple[int, int]:
        # Rank 1 of zeros: the smallest tensor that makes the LoRA branch add 0.
        return tuple(dim if isinstance(dim, int) else 1 for dim in shape)

    def _ortvalue(self, array: np.ndarray) -> ort.OrtValue:
        if self.device == "cpu":
            return ort.OrtValue.ortvalue_from_numpy(array)
        return ort.OrtValue.ortvalue_from_numpy(array, self.device, self.device_id)
