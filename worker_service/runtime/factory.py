"""One factory builds the engine's runtime for a device: the KV pool, the runner, the row
store behind them and what that runtime can do.

Above this module nothing branches on a device or a layout name: the engine,
the server and cuda_check read the `Runtime`'s fields and capabilities. The
layouts (RuntimeConfig.kv_layout):

- "rows" (what "auto" picks, on either device): the running sequences are rows
  of one row store (row_store.py), decoded in one batched run per step: the
  host arena on CPU (its Info name stays "arena"), device rows on CUDA
  (device_rows.py: allocated at start, the pool's capacity is what was
  allocated);
- "arena": the host arena, CPU only (refused on CUDA: host memory);
- "device-rows": device rows on the device asked for, CPU included: the dry
  run (cuda_check --dry-run, the tests) runs the CUDA code path over CPU
  OrtValues;
- "static": one buffer per sequence, one run each, no sessions, no prefix
  cache: only when asked for by name, never picked for the caller.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnxruntime as ort
import structlog

from ortserve.status.units import human_bytes, tokens
from worker_service.core.errors import DeviceUnavailable, InvalidWorkerField
from worker_service.runtime import device as devices
from worker_service.runtime.config import RuntimeConfig
from worker_service.runtime.device_rows import DeviceRows, rows_for_capacity
from worker_service.runtime.kv_arena import KVArena
from worker_service.runtime.kv_pool import HostBudget, KVPool, StaticSharedKV
from worker_service.runtime.model import ModelSpec
from worker_service.runtime.prefix_cache import PrefixCache
from worker_service.runtime.rate_set_runner import RateSetRunner
from worker_service.runtime.row_store import RowStore
from worker_service.runtime.rows_runner import RowsRunner
from worker_service.runtime.runner import Runner
from worker_service.runtime.static_model_runner import StaticModelRunner

log = structlog.get_logger(__name__)

LAYOUTS = ("auto", "rows", "arena", "device-rows", "static")


@dataclass(frozen=True)
class Capabilities:
    """What a runtime can do, for the engine and the reports."""

    batched: bool  # one run decodes every running sequence (rows bound the batch)
    sessions: bool  # K/V kept between a session's turns
    prefix_cache: bool  # whole blocks of finished prompts reused by later ones


@dataclass
class Runtime:
    """The engine's runtime on one device (see the module docstring)."""

    kind: str  # Info's kv_layout: "arena" (host rows), "device-rows", "static"
    device: str  # "cpu" | "cuda": where the KV lives
    pool: KVPool
    runner: Runner
    rows: RowStore | None  # None for "static"
    capabilities: Capabilities
    prefix_cache: PrefixCache | None = None
    allocated_bytes: int = 0  # KV memory allocated at start (device rows: all of the pool)
    # Device memory the KV allocator reserved for it: allocated_bytes plus a stated
    # overhead (device_memory.py); 0 where KV is host memory committed on touch.
    reserved_bytes: int = 0
    memory_strategy: str = ""  # device_memory.KVMemory.strategy ("" without device rows)

    @property
    def batch_rows(self) -> int:
        """Rows of the running batch now (a racy read, for reports)."""
        return self.rows.rows if self.rows is not None else 0

    @property
    def max_batch_rows(self) -> int:
        """The most sequences one run may hold (1 for "static")."""
        return self.rows.max_rows if self.rows is not None else 1

    def kv_device_names(self) -> set[str]:
        """Where the KV tensors live, as ORT names the devices (for cuda_check)."""
        if self.rows is not None:
            return self.rows.device_names()
        probe = self.pool.layout.allocate(1)  # type: ignore[attr-defined]
        try:
            return probe.device_names()
        finally:
            probe.free()

    def close(self) -> None:
        if self.rows is not None:
            self.rows.close()


@dataclass(frozen=True)
class DeviceSession:
    """The engine's ORT session and what ORT resolved for it (what Info reports)."""

    session: ort.InferenceSession
    providers: tuple[str, ...]  # as ORT resolved them, the first one runs the graph
    nodes_by_provider: dict[str, int]  # ORT's own placement, from its profile
    nodes_off_device: list[str]  # the CPU-preferred shape nodes a CUDA session keeps (reported)
    device: str  # "cpu" | "cuda:N"
    intra_op_threads: int


def open_device_session(config: RuntimeConfig, spec: ModelSpec) -> DeviceSession:
    """The model's ORT session on the device `config` names, verified to run there
    (device.create_session refuses what would silently run elsewhere)."""
    threads = config.intra_op_threads or devices.usable_cores()
    spinning = ("session.intra_op.allow_spinning", "1" if config.intra_op_spinning else "0")
    session = devices.create_session(spec, config.device, config.device_id, threads,
                                     config.inter_op_threads,
                                     (spinning, *config.ort_session_config),
                                     last_position_logits=config.last_position_logits,
                                     # Graphs replay device rows' fixed addresses only.
                                     cuda_graphs=config.cuda_graphs and config.kv_layout in (
                                         "auto", "rows", "device-rows"))
    placed = devices.placement(session)
    # The served-path bench's set rate runs no model: Info says no execution provider ran.
    providers = ("BenchRateSet",) if config.bench_rate_set_tokens_per_s else tuple(
        session.get_providers())
    return DeviceSession(
        session, providers, devices.node_placement(session),
        placed.off_device_report() if placed is not None else [],
        "cpu" if config.device == "cpu" else f"cuda:{config.device_id}", threads)


# Without --prefix-cache-bytes the device block area takes what the rows leave, at most
# this share of the capacity asked for: the leftover of a large capacity with few rows
# (42 GiB beside 32 rows on an H200) is not memory to reserve for a cache by default.
DEVICE_CACHE_SHARE = 0.5


def _device_rows(config: RuntimeConfig, spec: ModelSpec) -> DeviceRows:
    """Device rows and the prefix cache's device block area, allocated now: the pool's
    capacity is what was allocated. With --prefix-cache-bytes the block area is that (at
    most the capacity) and the rows are what the rest holds; without it, the rows are as
    many full rows as the capacity holds and the block area is what is left over, at
    most DEVICE_CACHE_SHARE of the capacity. Rows are at most --max-batch-rows either way."""
    row, block = DeviceRows.row_bytes_for(spec), DeviceRows.block_bytes_for(spec)
    capacity = config.kv_capacity_bytes
    if config.prefix_cache_bytes is not None:
        cache = min(capacity, config.prefix_cache_bytes)
        rows = rows_for_capacity(spec, capacity - cache, config.max_batch_rows)
    else:
        rows = rows_for_capacity(spec, capacity, config.max_batch_rows)
        cache = min(capacity - rows * row, int(capacity * DEVICE_CACHE_SHARE))
    if rows < 1:
        raise InvalidWorkerField("kv_capacity", f"one device KV row of {spec.name}'s "
                             f"{tokens(spec.context_length)} context takes {human_bytes(row)} "
                             f"({row:,} bytes), more than the KV capacity of "
                             f"{human_bytes(capacity)} (less the prefix cache's); give "
                             "--kv-capacity of at least one row, a larger fraction of the GPU's "
                             "memory, or a shorter --max-context-tokens")
    slots = cache // block
    try:
        store = DeviceRows(spec, rows, config.device, config.device_id, cache_blocks=slots)
    except Exception as exc:  # ORT's allocator: out of device memory, say
        raise DeviceUnavailable(
            f"allocating {rows} device KV rows and {slots} cache blocks "
            f"({human_bytes(rows * row + slots * block)}) on {config.device}:{config.device_id} "
            f"failed ({exc}); give a smaller --kv-capacity or --max-batch-rows") from exc
    log.info("device KV pool allocated", device=f"{config.device}:{config.device_id}",
             rows=rows, row_tokens=store.seq_tokens, row_bytes=row, cache_blocks=slots,
             cache_bytes=slots * block, allocated_bytes=store.allocated_bytes,
             reserved_bytes=store.reserved_bytes, overhead_bytes=store.overhead_bytes,
             allocator=store.memory.strategy, asked_capacity_bytes=capacity,
             max_batch_rows=config.max_batch_rows,
             note="the worker's KV capacity is this allocation; reserved is what the device "
                  "holds for it (each tensor rounded to 256 bytes, the copier's scratch)")
    return store


def build_runtime(config: RuntimeConfig, spec: ModelSpec, session: ort.InferenceSession,
                  chunk_tokens: int) -> Runtime:
    """The runtime `config` asks for on its device, over `session`."""
    layout = config.kv_layout
    if layout not in LAYOUTS:
        raise InvalidWorkerField("kv_layout", f"kv_layout {layout!r} is not one of "
                             f"{', '.join(LAYOUTS)}")
    host = HostBudget(config.session_swap_bytes)
    if layout == "static":
        pool = KVPool(StaticSharedKV(spec, config.device, config.device_id),
                      config.kv_capacity_bytes, host)
        return Runtime("static", config.device, pool, StaticModelRunner(session, spec, pool), None,
                       Capabilities(batched=False, sessions=False, prefix_cache=False))
    if layout == "arena" and config.device != "cpu":
        raise InvalidWorkerField("kv_layout", "the KV arena is host memory: use it with device "
                             "cpu; on cuda the rows live on the device (kv_layout rows or auto)")
    if config.device == "cpu" and layout != "device-rows":
        store: RowStore = KVArena(spec, config.max_batch_rows, config.kv_capacity_bytes)
        kind, parks_on_host, allocated = "arena", False, 0  # committed on touch
        cache_bytes = min(config.kv_capacity_bytes, config.kv_capacity_bytes // 2
                          if config.prefix_cache_bytes is None else config.prefix_cache_bytes)
    else:
        rows = _device_rows(config, spec)
        store, kind, parks_on_host, allocated = rows, "device-rows", True, rows.allocated_bytes
        cache_bytes = rows.blocks.slots * rows.blocks.block_bytes  # its device block area
    pool = KVPool(store, store.capacity_bytes, host, parks_on_host=parks_on_host)
    runner = RowsRunner(session, spec, store, chunk_tokens,
                                batch_first_chunks=config.batch_first_chunks)
    runtime = Runtime(kind, config.device, pool, runner, store,
                      Capabilities(batched=True, sessions=True, prefix_cache=True),
                      allocated_bytes=allocated)
    if isinstance(store, DeviceRows):
        runtime.reserved_bytes, runtime.memory_strategy = (store.reserved_bytes,
                                                           store.memory.strategy)
    if config.bench_rate_set_tokens_per_s:
        # Bench only: the same pool and rows, no model run; tokens come at a set rate
        # (rate_set_runner.py), so the served path is measured apart from the model.
        runtime.runner = RateSetRunner(config.bench_rate_set_tokens_per_s, config.max_batch_rows,
                                       frozenset(spec.eos_token_ids))
        runtime.capabilities = Capabilities(batched=True, sessions=True, prefix_cache=False)
        return runtime
    if cache_bytes > 0:
        runtime.prefix_cache = runner.prefix_cache = PrefixCache(pool, cache_bytes,
                                                                 store.block_tokens)
    return runtime
