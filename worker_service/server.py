"""build_server: the worker's grpc.aio server. Health says NOT_SERVING until the
model is loaded and its execution provider verified; then it registers."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import dataclass, replace

import grpc
import structlog

from ortserve.process import ports
from ortserve.process.metrics import new_registry
from ortserve.process.metrics import serve as serve_metrics
from ortserve.process.version import package_version
from ortserve.rpc import tls
from ortserve.rpc.error_path import register_service
from ortserve.rpc.serving import add_health_and_reflection, new_server, set_serving
from ortserve.status.units import human_bytes, human_bytes_at_least
from ortserve.v1 import scheduler_pb2, worker_pb2
from worker_service import adapter_admin
from worker_service.config import WorkerConfig
from worker_service.core.errors import ConfigError, DeviceUnavailable
from worker_service.engine.config import EngineConfig
from worker_service.engine.engine import Engine
from worker_service.lease_lifecycle import LeaseLifecycle
from worker_service.metrics import WorkerMetrics
from worker_service.runtime import device as devices
from worker_service.runtime import lora
from worker_service.scheduler_link import SchedulerLink
from worker_service.servicer import WorkerServicer

log = structlog.get_logger("worker")

SERVICE = worker_pb2.DESCRIPTOR.services_by_name["Worker"]
SERVICE_NAME = SERVICE.full_name


def resolve_kv_capacity(config: WorkerConfig, device: str) -> int:
    if config.kv_capacity_bytes is not None:
        return config.kv_capacity_bytes
    base = (devices.free_cuda_memory_bytes(config.device_id) if device == "cuda"
            else devices.available_memory_bytes())
    return int(base * config.kv_capacity_fraction)


def check_kv_capacity(engine: Engine) -> None:
    """Refuse a capacity that cannot serve one request; warn below one context."""
    spec = engine.spec
    smallest = engine.kv.bytes_for(2)  # one prompt token and one new token
    full_context = engine.kv.bytes_for(spec.context_length)
    if engine.capacity_bytes < smallest:
        raise ConfigError(
            f"--kv-capacity {engine.capacity_bytes:,} bytes cannot hold a single request: the "
            f"smallest (1 prompt + 1 new token) needs {smallest:,} bytes and one full context of "
            f"{spec.context_length:,} tokens needs {human_bytes(full_context)} at "
            f"{spec.bytes_per_token:,} B/token; raise --kv-capacity to at least "
            f"{human_bytes_at_least(full_context)}")
    if engine.capacity_bytes < full_context:
        log.warning("kv capacity below one full context: long requests will be capped",
                    capacity_bytes=engine.capacity_bytes, full_context_bytes=full_context)


def registration_request(engine: Engine, worker_id: str,
                         address: str) -> scheduler_pb2.RegisterWorkerRequest:
    """What the worker tells the scheduler about itself at registration."""
    spec = engine.spec
    return scheduler_pb2.RegisterWorkerRequest(
        worker_id=worker_id, address=address, model=spec.name,
        context_length=spec.context_length, bytes_per_token=spec.bytes_per_token,
        capacity_bytes=engine.capacity_bytes, block_tokens=engine.kv.block_tokens,
        execution_provider=engine.provider, vocab_size=spec.vocab_size,
        version=package_version(), device=engine.device,
        # Rows bound the batch only in a batched runtime (static: one buffer per sequence).
        max_batch_rows=engine.max_batch_rows if engine.runtime.capabilities.batched else 0,
        nodes_off_device=engine.nodes_off_device,
        adapters=adapter_admin.adapters_pb(engine),
        # Already out of capacity_bytes (Engine._charge_decode_path).
        decode_graph_bytes=engine.decode_graph_bytes,
        decode_buffer_bytes=engine.decode_buffer_bytes,
    )


def advertise_address(config: WorkerConfig, port: int) -> str:
    if config.advertise_address:
        return config.advertise_address
    host = config.host
    if host in ("0.0.0.0", "::", "[::]", ""):
        host = socket.gethostbyname(socket.gethostname())
    return f"{host}:{port}"


@dataclass
class WorkerServer:
    server: grpc.aio.Server
    port: int
    servicer: WorkerServicer
    _tasks: list[asyncio.Task]
    health: object = None
    drained: bool = False  # drain() ran: the stop is a clean one

    async def drain(self, timeout_s: float) -> int:
        """Stop taking work and let live streams finish (up to timeout_s); returns how many
        were still running when the time ran out (stop() then cancels them).

        NOT_SERVING first, then the scheduler is told (no new placements from that
        moment); requests already placed but not yet arrived are refused UNAVAILABLE.
        """
        if self.health is not None:
            await set_serving(self.health, [SERVICE_NAME], False)
        self.servicer.draining = True
        self.drained = True  # a clean stop: stop() then tells the scheduler this worker left
        leases = self.servicer.leases
        if leases is None:
            return 0
        await leases.link.announce_draining()
        log.info("draining", live_sequences=leases.engine.active_sequences(),
                 drain_timeout_s=timeout_s)
        deadline = asyncio.get_running_loop().time() + timeout_s
        while leases.engine.active_sequences() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        self.servicer.end_relay_calls()
        left = leases.engine.active_sequences()
        if left:
            log.warning("drain timeout: cancelling live sequences", live_sequences=left,
                        drain_timeout_s=timeout_s)
        await self._park_sessions(leases)
        return left

    async def _park_sessions(self, leases) -> None:
        """A clean stop with a disk tier: every idle session still in memory goes to disk
        first, so a worker started again on the folder serves it (a SIGKILL keeps only
        those already there)."""
        table = leases.engine.sessions
        if table is None or table.disk is None:
            return
        try:
            moved = await self.servicer.session_rpcs().park_idle(-1.0)
        except OSError as error:
            log.error("could not write sessions to the disk tier at stop", error=str(error))
            return
        log.info("sessions written to the disk tier at stop", sessions=moved,
                 disk_used_bytes=table.disk_used_bytes)

    async def stop(self, grace_s: float = 5.0) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.server.stop(grace_s)
        leases = self.servicer.leases
        if leases is not None:
            if self.drained:
                # After the drain and the server's stop: every stream has ended and the idle
                # sessions are on disk (where there is a disk tier), so the scheduler may
                # forget this worker now; a crash never gets here and waits out the TTL.
                await leases.link.deregister()
            await leases.link.close()
            leases.engine.close()
        if self.servicer.stop_metrics is not None:
            self.servicer.stop_metrics()


async def _load_and_register(config: WorkerConfig, servicer: WorkerServicer, health, port: int) -> None:
    device = devices.resolve_device(config.device)
    capacity_bytes = resolve_kv_capacity(config, device)
    # LoRA adapters live in the memory the capacity names: what they hold is not KV room,
    # so the ledger's capacity is the rest (it moves by an adapter's bytes).
    adapter_bytes = sum(lora.parameter_bytes(path) for _, path in config.lora)
    if config.lora:
        if adapter_bytes >= capacity_bytes:
            raise ConfigError(f"the {len(config.lora)} LoRA adapters hold {adapter_bytes:,} "
                              f"bytes, all of the {capacity_bytes:,}-byte KV capacity; raise "
                              "--kv-capacity or load fewer adapters")
        log.info("lora adapters", adapters=[name for name, _ in config.lora],
                 adapter_bytes=adapter_bytes, kv_capacity_bytes=capacity_bytes - adapter_bytes)
        capacity_bytes -= adapter_bytes
    engine_config = EngineConfig(model_dir=config.model_dir, device=device,
                                 device_id=config.device_id,
                                 intra_op_threads=config.intra_op_threads,
                                 intra_op_spinning=config.intra_op_spinning,
                                 cuda_graphs=config.cuda_graphs,
                                 max_batch_rows=config.max_batch_rows,
                                 max_context_tokens=config.max_context_tokens,
                                 kv_capacity_bytes=capacity_bytes,
                                 session_swap_bytes=config.session_swap_bytes,
                                 session_dir=config.session_dir,
                                 session_disk_bytes=config.session_disk_bytes,
                                 prefix_cache_bytes=config.prefix_cache_bytes,
                                 bench_rate_set_tokens_per_s=config.bench_rate_set_tokens_per_s,
                                 lora_adapters=config.lora,
                                 speculative=config.speculative)
    # ORT session creation blocks for seconds: keep it off the event loop.
    try:
        engine = await asyncio.to_thread(Engine, engine_config)
    except DeviceUnavailable as error:
        if config.device != "auto" or device != "cuda":
            raise  # an explicit --device cuda stays strict
        # auto: CUDA only when its provider really runs the whole graph; else CPU, said so.
        log.warning("device auto: CUDA is not usable, resolving to cpu", reason=str(error))
        device = "cpu"
        engine_config = replace(engine_config, device="cpu",
                                kv_capacity_bytes=resolve_kv_capacity(config, "cpu"))
        engine = await asyncio.to_thread(Engine, engine_config)
    log.info("device resolved", requested=config.device, device=engine.device,
             provider=engine.provider)
    try:
        check_kv_capacity(engine)
    except ConfigError:
        engine.close()
        raise
    spec = engine.spec
    log.info("model loaded", model=spec.name, device=engine.device, provider=engine.provider,
             intra_op_threads=engine.intra_op_threads, capacity_bytes=engine.capacity_bytes,
             bytes_per_token=spec.bytes_per_token, context_length=spec.context_length)
    registration = registration_request(engine, servicer.worker_id, servicer.address)
    if config.metrics_port is not None:
        registry = new_registry()
        servicer.metrics = WorkerMetrics(registry, engine)
        metrics_port, servicer.stop_metrics = serve_metrics(registry, config.host,
                                                            config.metrics_port)
        log.info("metrics serving", address=f"{config.host}:{metrics_port}", path="/metrics")
    files = config.tls
    link = SchedulerLink(config.scheduler_address, registration, servicer.live_leases,
                         lambda: (engine.active_sequences(), engine.batch_rows,
                                  engine.runner.largest_batch),
                         tls.channel_credentials(files.ca, files.cert, files.key)
                         if files.enabled else None)
    servicer.leases = LeaseLifecycle(servicer.worker_id, engine, link)
    link.live_sessions = servicer.live_sessions
    link.prefix_cache = engine.prefix_cache_report
    link.step_timings = engine.step_times.drain
    link.decode_tail_s = lambda rows: engine.prefill_pace.decode_tail_s(rows) or 0.0
    link.prefill_pace = lambda: ((engine.prefill_pace.prompt_token_s or 0.0) * 1e3,
                                 engine.prefill_pace.chunk_s * 1e3,
                                 engine.scheduler.max_prefill_tokens)
    link.drop_sessions = servicer.drop_sessions
    link.stop_unrestored = servicer.stop_unrestored
    parking = None
    if config.session_dir and engine.sessions is not None:
        # Before the first registration: the sessions on disk register with it.
        restored = await asyncio.to_thread(servicer.session_rpcs().restore_from_disk)
        log.info("session disk tier", session_dir=config.session_dir,
                 session_disk_bytes=config.session_disk_bytes, restored_sessions=restored,
                 disk_used_bytes=engine.sessions.disk_used_bytes,
                 idle_to_disk_after_s=config.session_disk_after_s)
        parking = asyncio.create_task(
            servicer.session_rpcs().park_idle_forever(config.session_disk_after_s))
    heartbeats = asyncio.create_task(link.run())
    registered = asyncio.create_task(link.registered.wait())
    try:
        # SERVING only once registered: before that no lease can reach this worker.
        await asyncio.wait({heartbeats, registered}, return_when=asyncio.FIRST_COMPLETED)
        if registered.done():
            await set_serving(health, [SERVICE_NAME], True)
        await heartbeats  # forever, or raises what stopped it
    finally:
        registered.cancel()
        heartbeats.cancel()
        if parking is not None:
            parking.cancel()


async def build_server(config: WorkerConfig) -> tuple[WorkerServer, asyncio.Task]:
    """Bind and start; returns the server and the task that loads the model and then
    registers and heartbeats (it raises if the model or device cannot be had)."""
    server = new_server(keepalive_s=config.caller_keepalive_s)
    config.tls.check("ortserve-worker", need_ca=True)
    # NOTE: mutual TLS: the worker's port serves leases the scheduler handed out, so
    # only holders of a cluster certificate (the scheduler) may call it.
    port = ports.bind_grpc(
        lambda: tls.bind(server, f"{config.host}:{config.port}", config.tls, True, "worker"),
        config.host, config.port, "--port")
    worker_id = config.worker_id or f"{socket.gethostname()}-{port}"
    config = replace(config, worker_id=worker_id)
    servicer = WorkerServicer(worker_id, advertise_address(config, port), config.device)
    register_service(server, SERVICE, servicer)
    health = add_health_and_reflection(server, [SERVICE_NAME])
    await set_serving(health, [SERVICE_NAME], False)
    await server.start()
    log.info("worker listening (loading model)", address=f"{config.host}:{port}",
             worker_id=worker_id, model_dir=str(config.model_dir), device=config.device)
    task = asyncio.create_task(_load_and_register(config, servicer, health, port))
    return WorkerServer(server=server, port=port, servicer=servicer, _tasks=[task],
                        health=health), task
