"""build_server: the worker's grpc.aio server. Health says NOT_SERVING until the
model is loaded and its execution provider verified; then it registers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from dataclasses import dataclass, replace

import grpc
import structlog

from ortserve.serving import add_health_and_reflection, set_serving
from ortserve.v1 import scheduler_pb2, worker_pb2, worker_pb2_grpc

from .config import WorkerConfig
from .engine import Engine, EngineConfig
from .scheduler_link import SchedulerLink
from .servicer import WorkerServicer

log = structlog.get_logger("worker")

SERVICE_NAME = worker_pb2.DESCRIPTOR.services_by_name["Worker"].full_name


def resolve_device(requested: str) -> str:
    """'auto' -> 'cuda' where an NVIDIA GPU is present, else 'cpu'; others unchanged."""
    if requested != "auto":
        return requested
    return "cuda" if os.path.exists("/dev/nvidia0") else "cpu"


def available_memory_bytes() -> int:
    """MemAvailable from /proc/meminfo (the CPU path's budget base)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise OSError("MemAvailable not found in /proc/meminfo: pass --kv-budget explicitly")


def free_cuda_memory_bytes(device_id: int) -> int:
    import subprocess

    out = subprocess.run(["nvidia-smi", f"--id={device_id}", "--query-gpu=memory.free",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[0]) * 2**20


def resolve_kv_budget(config: WorkerConfig, device: str) -> int:
    if config.kv_budget_bytes is not None:
        return config.kv_budget_bytes
    base = free_cuda_memory_bytes(config.device_id) if device == "cuda" else available_memory_bytes()
    return int(base * config.kv_budget_fraction)


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

    async def stop(self, grace_s: float = 5.0) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.server.stop(grace_s)
        if self.servicer.link is not None:
            await self.servicer.link.close()
        if self.servicer.engine is not None:
            self.servicer.engine.close()


async def _load_and_register(config: WorkerConfig, servicer: WorkerServicer, health, port: int) -> None:
    device = resolve_device(config.device)
    capacity_bytes = resolve_kv_budget(config, device)
    engine_config = EngineConfig(model_dir=config.model_dir, device=device,
                                 device_id=config.device_id,
                                 intra_op_threads=config.intra_op_threads,
                                 kv_capacity_bytes=capacity_bytes)
    # ORT session creation blocks for seconds: keep it off the event loop.
    engine = await asyncio.to_thread(Engine, engine_config)
    spec = engine.spec
    log.info("model loaded", model=spec.name, device=engine.device, provider=engine.provider,
             intra_op_threads=engine.intra_op_threads, capacity_bytes=engine.capacity_bytes,
             bytes_per_token=spec.bytes_per_token, context_length=spec.context_length)
    registration = scheduler_pb2.RegisterWorkerRequest(
        worker_id=servicer.worker_id, address=servicer.address, model=spec.name,
        context_length=spec.context_length, bytes_per_token=spec.bytes_per_token,
        capacity_bytes=engine.capacity_bytes, block_tokens=engine.kv.block_tokens,
        execution_provider=engine.provider, vocab_size=spec.vocab_size,
    )
    servicer.link = SchedulerLink(config.scheduler_address, registration, servicer.live_leases)
    servicer.engine = engine
    await set_serving(health, [SERVICE_NAME], True)
    await servicer.link.run()


async def build_server(config: WorkerConfig) -> tuple[WorkerServer, asyncio.Task]:
    """Bind and start; returns the server and the task that loads the model and then
    registers and heartbeats (it raises if the model or device cannot be had)."""
    server = grpc.aio.server()
    port = server.add_insecure_port(f"{config.host}:{config.port}")
    if port == 0:
        raise OSError(f"could not bind {config.host}:{config.port}: is the port in use? "
                      "pick another with --port")
    worker_id = config.worker_id or f"{socket.gethostname()}-{port}"
    config = replace(config, worker_id=worker_id)
    servicer = WorkerServicer(worker_id, advertise_address(config, port), config.device)
    worker_pb2_grpc.add_WorkerServicer_to_server(servicer, server)
    health = add_health_and_reflection(server, [SERVICE_NAME])
    await set_serving(health, [SERVICE_NAME], False)
    await server.start()
    log.info("worker listening (loading model)", address=f"{config.host}:{port}",
             worker_id=worker_id, model_dir=str(config.model_dir), device=config.device)
    task = asyncio.create_task(_load_and_register(config, servicer, health, port))
    return WorkerServer(server=server, port=port, servicer=servicer, _tasks=[task]), task
