"""Device resolution, the ORT session on it, and why CUDA did not come up.

ORT falls back to CPU silently when the CUDA libraries are missing, so a
session asked for CUDA is checked after creation and refused (naming what is
missing) unless CUDA really runs it.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import io
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import structlog

from worker_service.core.errors import DeviceUnavailable, ModelLoadError
from worker_service.runtime import last_logits
from worker_service.runtime.model import ModelSpec

log = structlog.get_logger(__name__)

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


def resolve_device(requested: str) -> str:
    """'auto' -> 'cuda' worth trying (a GPU is visible and ORT has a CUDA provider), else
    'cpu'; others unchanged. The server falls back to CPU when the CUDA try fails."""
    if requested != "auto":
        return requested
    gpu = os.path.exists("/dev/nvidia0") or shutil.which("nvidia-smi") is not None
    return "cuda" if gpu and CUDA in ort.get_available_providers() else "cpu"


def usable_cores() -> int:
    """Cores this process may run on (the ORT thread count when none is given)."""
    with contextlib.suppress(AttributeError):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def available_memory_bytes() -> int:
    """MemAvailable from /proc/meminfo (the CPU path's capacity base)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise OSError("MemAvailable not found in /proc/meminfo: pass --kv-capacity explicitly")


def free_cuda_memory_bytes(device_id: int) -> int:
    """Free memory on GPU `device_id`, from nvidia-smi: the CUDA path's capacity base when
    no --kv-capacity is given. Without a driver in sight that is a device error."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        raise DeviceUnavailable(
            "--device cuda without --kv-capacity sizes the KV capacity from the GPU's free memory, "
            "read with nvidia-smi, which is not on PATH: no NVIDIA driver is visible here (in a "
            "container, attach the GPU: docker run --gpus all, compose's device reservation, "
            "the NVIDIA container toolkit); or give --kv-capacity, or use --device cpu")
    command = [tool, f"--id={device_id}", "--query-gpu=memory.free", "--format=csv,noheader,nounits"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=30)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines or not lines[0].strip().isdigit():
        said = (out.stderr or out.stdout).strip()[:300] or "nothing"
        raise DeviceUnavailable(
            f"nvidia-smi could not report the free memory of GPU {device_id} (exit "
            f"{out.returncode}: {said}); check the GPUs with `nvidia-smi -L` and --device-id, "
            f"or give --kv-capacity")
    return int(lines[0]) * 2**20


def _profiled_options(intra_op_threads: int, inter_op_threads: int = 1
                      ) -> tuple[ort.SessionOptions, str]:
    """Session options, with profiling on for the one warm-up run that tells where ORT
    placed every node (see _placement); returns them and the profile's folder."""
    options = ort.SessionOptions()
    # Explicit threads: ORT's default pool is clearly slower on small machines (MODEL_NOTES).
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = inter_op_threads
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # The missing-CUDA warnings are reported, with a remedy, by DeviceUnavailable.
    options.log_severity_level = 3
    profile_dir = tempfile.mkdtemp(prefix="ortserve-placement-")
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(profile_dir, "placement")
    return options, profile_dir


def create_session(spec: ModelSpec, device: str, device_id: int, intra_op_threads: int,
                   inter_op_threads: int = 1, config_entries: tuple[tuple[str, str], ...] = (),
                   last_position_logits: bool = True) -> ort.InferenceSession:
    """An ORT session for `spec` on `device`, verified to run where it was asked to.

    `last_position_logits`: the graph with the LM head only at the positions the engine
    reads (runtime/last_logits.py), where the graph allows the edit; the runners see
    which by its `logits_positions` input.
    """
    if device not in ("cpu", "cuda"):
        raise DeviceUnavailable(f"device {device!r} is not one of 'cpu', 'cuda'")
    options, profile_dir = _profiled_options(intra_op_threads, inter_op_threads)
    for key, value in config_entries:
        options.add_session_config_entry(key, value)
    preload_log = ""
    if device == "cuda":
        providers: list = [(CUDA, {"device_id": device_id}), CPU]
        # NOTE: ORT places nodes without a CUDA kernel (GroupQueryAttention in fp32, say)
        # on the CPU provider silently, copying KV across every step: refuse instead.
        options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        preload_log = _preload_cuda_libraries()
    else:
        providers = [CPU]
    model: str | bytes = str(spec.model_file)
    if last_position_logits:
        graph, folder, note = last_logits.edited_graph(spec.model_file, spec.logits_name)
        if graph is not None:
            model = graph
            options.add_session_config_entry(last_logits.EXTERNAL_FOLDER_KEY, str(folder))
        log.info("logits graph", model_file=str(spec.model_file), edited=graph is not None,
                 note=note)
    try:
        session = ort.InferenceSession(model, options, providers=providers)
    except Exception as exc:
        shutil.rmtree(profile_dir, ignore_errors=True)
        if device == "cuda" and "fallback" in str(exc).lower():
            # Either CUDA is not there at all, or some nodes have no CUDA kernel: a
            # session that may fall back tells which, and names the nodes.
            _explain_cuda_fallback(spec, device_id, intra_op_threads, preload_log, exc)
        raise ModelLoadError(f"ONNX Runtime could not load {spec.model_file}: {exc}") from exc
    active = session.get_providers()
    if device == "cuda" and (not active or active[0] != CUDA):
        raise _cuda_not_active(active, device_id, preload_log)
    _check_session_io(session, spec)
    session.ortserve_nodes_by_provider = _placement(session, spec, profile_dir)
    return session


def node_placement(session: ort.InferenceSession) -> dict[str, int]:
    """How many graph nodes each execution provider runs, from ORT's own profile."""
    return dict(getattr(session, "ortserve_nodes_by_provider", {}))


def _placement(session: ort.InferenceSession, spec: ModelSpec, profile_dir: str,
               op_types_on: str = ""):
    """Run one token through a fresh empty cache with profiling on; count nodes per provider
    (or, with op_types_on, return the set of op types that provider runs)."""
    try:
        feeds = {spec.input_ids_name: np.ones((1, 1), dtype=np.int64),
                 spec.attention_mask_name: np.ones((1, 1), dtype=np.int64)}
        if spec.position_ids_name:
            feeds[spec.position_ids_name] = np.zeros((1, 1), dtype=np.int64)
        if last_logits.LOGITS_POSITIONS in {i.name for i in session.get_inputs()}:
            feeds[last_logits.LOGITS_POSITIONS] = np.zeros((1, 1, 1), dtype=np.int64)
        empty = np.zeros((1, spec.kv_heads, 0, spec.head_dim), dtype=spec.kv_dtype)
        for i in range(spec.num_layers):
            for name in (spec.past_key_name, spec.past_value_name):
                feeds[name.format(i=i)] = empty
        session.run(None, feeds)
        with open(session.end_profiling()) as f:
            events = json.load(f)
    except Exception as exc:  # a report, not a gate: never fail the start over it
        log.warning("node placement unknown", error=f"{type(exc).__name__}: {exc}")
        return {}
    finally:
        shutil.rmtree(profile_dir, ignore_errors=True)
    providers: dict[str, tuple[str, str]] = {}
    for event in events:
        args = event.get("args", {})
        if event.get("cat") == "Node" and "provider" in args:
            providers[args.get("node_index", event.get("name"))] = (args["provider"],
                                                                    args.get("op_name", "?"))
    if op_types_on:
        return {op for provider, op in providers.values() if provider == op_types_on}
    return dict(collections.Counter(provider for provider, _ in providers.values()))


def _cuda_not_active(active: list[str], device_id: int, preload_log: str) -> DeviceUnavailable:
    return DeviceUnavailable(
        f"{CUDA} not active: the session runs on {active} because "
        f"{describe_missing_cuda(device_id, preload_log)}; ONNX Runtime falls back to "
        "CPU silently, so the worker refuses to start. Install the CUDA and cuDNN libraries "
        "onnxruntime-gpu needs on a machine with an NVIDIA GPU, or run with --device cpu")


def _explain_cuda_fallback(spec: ModelSpec, device_id: int, intra_op_threads: int,
                           preload_log: str, error: Exception) -> None:
    """Raise DeviceUnavailable saying why a no-fallback CUDA session refused to load."""
    options, profile_dir = _profiled_options(intra_op_threads)
    probe = ort.InferenceSession(str(spec.model_file), options,
                                 providers=[(CUDA, {"device_id": device_id}), CPU])
    active = probe.get_providers()
    if not active or active[0] != CUDA:
        shutil.rmtree(profile_dir, ignore_errors=True)
        raise _cuda_not_active(active, device_id, preload_log) from error
    on_cpu = sorted(_placement(probe, spec, profile_dir, op_types_on=CPU))
    raise DeviceUnavailable(
        f"{spec.model_file} has nodes with no CUDA kernel ({', '.join(on_cpu) or 'unknown'}), "
        "which ONNX Runtime would run on the CPU provider with host-device copies every "
        "step; use a model folder built for CUDA (the genai builder's -e cuda, fp16), or run "
        "with --device cpu") from error


def _check_session_io(session: ort.InferenceSession, spec: ModelSpec) -> None:
    names = {i.name for i in session.get_inputs()}
    needed = {spec.input_ids_name, spec.attention_mask_name, spec.past_key_name.format(i=0)}
    if not needed <= names:
        raise ModelLoadError(f"the session of {spec.model_file} lacks inputs "
                             f"{sorted(needed - names)}; rebuild the model folder")


def _preload_cuda_libraries() -> str:
    # onnxruntime-gpu finds pip-installed CUDA/cuDNN (nvidia-* wheels) only after
    # preload_dlls; it prints what it could not load, which the diagnosis reuses.
    captured = io.StringIO()
    with contextlib.suppress(Exception), contextlib.redirect_stdout(captured):
        ort.preload_dlls()
    return captured.getvalue()


def describe_missing_cuda(device_id: int = 0, preload_log: str = "") -> str:
    """Best-effort account of why the CUDA provider did not come up."""
    if CUDA not in ort.get_available_providers():
        return "this onnxruntime build has no CUDA provider (install onnxruntime-gpu, not onnxruntime)"
    reasons = []
    capi = Path(ort.__file__).parent / "capi"
    try:
        ctypes.CDLL(str(capi / "libonnxruntime_providers_shared.so"), mode=ctypes.RTLD_GLOBAL)
        ctypes.CDLL(str(capi / "libonnxruntime_providers_cuda.so"))
    except OSError as exc:
        reasons.append(f"its CUDA provider library cannot load ({exc})")
    if not any(Path("/dev").glob("nvidia[0-9]*")):
        reasons.append("no NVIDIA GPU is visible (no /dev/nvidia0)")
    elif not Path(f"/dev/nvidia{device_id}").exists():
        reasons.append(f"GPU {device_id} is not visible (no /dev/nvidia{device_id})")
    failed = [line.strip() for line in preload_log.splitlines() if line.startswith("Failed to load")]
    if failed and not reasons:
        reasons.append("; ".join(failed[:3]))
    return " and ".join(reasons) or "the CUDA provider failed to initialise (see ORT's log)"
