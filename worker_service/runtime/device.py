"""Device resolution, the ORT session on it, and why CUDA did not come up.

ORT falls back to CPU silently when the CUDA libraries are missing, so a
session asked for CUDA is checked after creation and refused (naming what is
missing) unless CUDA really runs it.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import structlog

from worker_service.core.errors import DeviceUnavailable, ModelLoadError
from worker_service.runtime import last_logits, lora
from worker_service.runtime.model import ModelSpec
from worker_service.runtime.node_placement import PlacedNode, Placement, nodes_from_profile

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
    placed every node (see _placed_nodes); returns them and the profile's folder."""
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


# ORT refuses a session that lists the CPU provider and also disables falling back to it
# ("Conflicting session configuration"); the placement check below replaces that switch.
_NO_CPU_FALLBACK = "session.disable_cpu_ep_fallback"


def session_providers(device: str, device_id: int) -> list:
    """The providers a session on `device` is created with. On CUDA the CPU provider stays
    listed: ORT places its CPU-preferred shape nodes there, and the placement check
    (runtime/node_placement.py) refuses a session whose heavy nodes would land on it."""
    if device == "cuda":
        return [(CUDA, {"device_id": device_id}), CPU]
    return [CPU]


def create_session(spec: ModelSpec, device: str, device_id: int, intra_op_threads: int,
                   inter_op_threads: int = 1, config_entries: tuple[tuple[str, str], ...] = (),
                   last_position_logits: bool = True,
                   cuda_graphs: bool = False) -> ort.InferenceSession:
    """An ORT session for `spec` on `device`, verified to run where it was asked to.

    On CUDA: refused (DeviceUnavailable) when the CUDA provider is not active (naming
    the missing library or device), when the placement is unknown, or when a heavy
    node runs on the CPU provider (naming the nodes); the shape nodes ORT keeps on the
    CPU on purpose are allowed and reported (`placement(session)`).

    `last_position_logits`: the graph with the LM head only at the positions the engine
    reads (runtime/last_logits.py), where the graph allows the edit; the runners see
    which by its `logits_positions` input.

    `cuda_graphs` (CUDA only): the CUDA provider's enable_cuda_graph, so decode steps can
    replay a graph per bucket (runtime/decode_step.py); where ORT refuses it for this
    graph, the session is made without it and the log says why (every step then runs
    uncaptured, and the metrics say so).
    """
    if device not in ("cpu", "cuda"):
        raise DeviceUnavailable(f"device {device!r} is not one of 'cpu', 'cuda'")
    options, profile_dir = _profiled_options(intra_op_threads, inter_op_threads)
    for key, value in config_entries:
        if key == _NO_CPU_FALLBACK:
            raise ModelLoadError(f"the session config entry {key} conflicts with the CPU "
                                 "provider ORT needs for its shape nodes; drop it (heavy nodes "
                                 "off the device are refused by the placement check instead)")
        options.add_session_config_entry(key, value)
    providers = session_providers(device, device_id)
    preload_log = _preload_cuda_libraries() if device == "cuda" else ""
    model: str | bytes = str(spec.model_file)
    if last_position_logits:
        # The greedy choice in the graph on CUDA only (last_logits.py: ORT's CPU ArgMax is
        # ~100x slower than numpy's over host logits).
        graph, folder, note = last_logits.edited_graph(spec.model_file, spec.logits_name,
                                                       next_ids=device == "cuda")
        if graph is not None:
            model = graph
            options.add_session_config_entry(last_logits.EXTERNAL_FOLDER_KEY, str(folder))
        log.info("logits graph", model_file=str(spec.model_file), edited=graph is not None,
                 note=note)
    try:
        session = None
        if cuda_graphs and device == "cuda":
            graphed = [(CUDA, {"device_id": device_id, "enable_cuda_graph": "1"}), CPU]
            try:
                session = ort.InferenceSession(model, options, providers=graphed)
            except Exception as exc:  # noqa: BLE001 - refused graphs: run without them
                log.warning("CUDA graphs refused for this graph; decode runs uncaptured",
                            model_file=str(spec.model_file), cause=str(exc))
        if session is None:
            session = ort.InferenceSession(model, options, providers=providers)
    except Exception as exc:
        shutil.rmtree(profile_dir, ignore_errors=True)
        if device == "cuda":
            raise DeviceUnavailable(
                f"ONNX Runtime could not create a CUDA session for {spec.model_file} ({exc}); "
                f"{describe_missing_cuda(device_id, preload_log)}. Fix the CUDA setup, or run "
                "with --device cpu") from exc
        raise ModelLoadError(f"ONNX Runtime could not load {spec.model_file}: {exc}") from exc
    active = session.get_providers()
    if device == "cuda" and (not active or active[0] != CUDA):
        shutil.rmtree(profile_dir, ignore_errors=True)
        raise _cuda_not_active(active, device_id, preload_log)
    _check_session_io(session, spec)
    placed = Placement(CUDA if device == "cuda" else CPU,
                       tuple(_placed_nodes(session, spec, profile_dir)))
    if device == "cuda":
        _refuse_bad_placement(spec, placed)
    if placed.off_device:
        log.info("nodes off the device", device=device, allowed=placed.off_device_report())
    session.ortserve_placement = placed
    return session


def placement(session: ort.InferenceSession) -> Placement | None:
    """The session's placement as profiled at creation (None for a session made elsewhere)."""
    return getattr(session, "ortserve_placement", None)


def node_placement(session: ort.InferenceSession) -> dict[str, int]:
    """How many graph nodes each execution provider runs, from ORT's own profile."""
    placed = placement(session)
    return placed.nodes_by_provider if placed is not None else {}


def _refuse_bad_placement(spec: ModelSpec, placed: Placement) -> None:
    if not placed.known:
        raise DeviceUnavailable(
            f"the placement of {spec.model_file}'s nodes could not be read from ONNX Runtime's "
            "profile (see the warning logged before this), so the worker cannot tell whether "
            "the heavy nodes run on CUDA; check the model folder loads with --device cpu")
    heavy = placed.heavy_off_device
    if heavy:
        shown = "; ".join(n.describe() for n in heavy[:8])
        more = f" and {len(heavy) - 8} more" if len(heavy) > 8 else ""
        raise DeviceUnavailable(
            f"{spec.model_file}: {len(heavy)} heavy node(s) would run on the CPU provider, "
            f"copying activations or KV between host and GPU every step: {shown}{more}. Use "
            "a model folder built for CUDA (the genai builder's -e cuda, fp16), or run with "
            "--device cpu")


def _placed_nodes(session: ort.InferenceSession, spec: ModelSpec,
                  profile_dir: str) -> list[PlacedNode]:
    """Run one token through a fresh empty cache with profiling on; the nodes ORT ran,
    where (an empty list when the profile could not be read)."""
    try:
        feeds = {spec.input_ids_name: np.ones((1, 1), dtype=np.int64),
                 spec.attention_mask_name: np.ones((1, 1), dtype=np.int64)}
        if spec.position_ids_name:
            feeds[spec.position_ids_name] = np.zeros((1, 1), dtype=np.int64)
        if last_logits.LOGITS_POSITIONS in {i.name for i in session.get_inputs()}:
            feeds[last_logits.LOGITS_POSITIONS] = np.zeros((1, 1, 1), dtype=np.int64)
        for name, shape in lora.lora_inputs(session).items():  # the base: rank-1 zeros
            feeds[name] = np.zeros([d if isinstance(d, int) else 1 for d in shape], np.float32)
        if lora.SLOT_INPUT in {i.name for i in session.get_inputs()}:
            feeds[lora.SLOT_INPUT] = np.zeros(1, np.int64)
        empty = np.zeros((1, spec.kv_heads, 0, spec.head_dim), dtype=spec.kv_dtype)
        for i in range(spec.num_layers):
            for name in (spec.past_key_name, spec.past_value_name):
                feeds[name.format(i=i)] = empty
        session.run(None, feeds)
        with open(session.end_profiling()) as f:
            return nodes_from_profile(json.load(f))
    except Exception as exc:  # reported; on CUDA an unknown placement refuses the start
        log.warning("node placement unknown", error=f"{type(exc).__name__}: {exc}")
        return []
    finally:
        shutil.rmtree(profile_dir, ignore_errors=True)


def _cuda_not_active(active: list[str], device_id: int, preload_log: str) -> DeviceUnavailable:
    return DeviceUnavailable(
        f"{CUDA} not active: the session runs on {active} because "
        f"{describe_missing_cuda(device_id, preload_log)}; ONNX Runtime falls back to "
        "CPU silently, so the worker refuses to start. Install the CUDA 13 libraries "
        "onnxruntime-gpu needs (cuBLAS, cuRAND, the CUDA runtime: the nvidia/cuda 13 runtime "
        "image has them) on a machine with an NVIDIA GPU, or run with --device cpu")


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


# The dynamic loader's words for a library it could not find ("libcublasLt.so.12: cannot
# open shared object file: No such file or directory").
_MISSING_LIBRARY = re.compile(r"(lib[\w+-]+(?:\.[\w+-]+)*\.so(?:\.\d+)*)\s*:\s*cannot open shared")


def missing_libraries(text: str) -> list[str]:
    """The shared libraries a loader error (or ORT's preload log) says it could not find."""
    return list(dict.fromkeys(_MISSING_LIBRARY.findall(text)))


def describe_missing_cuda(device_id: int = 0, preload_log: str = "") -> str:
    """Best-effort account of why the CUDA provider did not come up, naming the missing
    library or device."""
    if CUDA not in ort.get_available_providers():
        return "this onnxruntime build has no CUDA provider (install onnxruntime-gpu, not onnxruntime)"
    reasons = []
    capi = Path(ort.__file__).parent / "capi"
    try:
        ctypes.CDLL(str(capi / "libonnxruntime_providers_shared.so"), mode=ctypes.RTLD_GLOBAL)
        ctypes.CDLL(str(capi / "libonnxruntime_providers_cuda.so"))
    except OSError as exc:
        libs = missing_libraries(str(exc))
        reasons.append(f"the CUDA library {', '.join(libs)} is missing ({exc})" if libs else
                       f"its CUDA provider library cannot load ({exc})")
    if not any(Path("/dev").glob("nvidia[0-9]*")):
        reasons.append("no NVIDIA GPU is visible (no /dev/nvidia0)")
    elif not Path(f"/dev/nvidia{device_id}").exists():
        reasons.append(f"GPU {device_id} is not visible (no /dev/nvidia{device_id})")
    failed = [line.strip() for line in preload_log.splitlines() if line.startswith("Failed to load")]
    if failed and not reasons:
        libs = missing_libraries(preload_log)
        reasons.append((f"the CUDA library {', '.join(libs)} is missing: " if libs else "")
                       + "; ".join(failed[:3]))
    return " and ".join(reasons) or "the CUDA provider failed to initialise (see ORT's log)"
