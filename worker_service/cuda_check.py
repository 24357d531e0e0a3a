"""Check the engine on an NVIDIA GPU: `python -m worker_service.cuda_check --model-dir DIR`.

Asserts that CUDAExecutionProvider is really active, that the KV buffers live
in device memory, and that greedy tokens on CUDA equal those on CPU for two
prompts. Prints one JSON summary on stdout; exit status 0 when every check
passes, 1 otherwise (on a machine without a usable GPU it fails at the first
check, naming what is missing).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ortserve.logs import configure_logging
from worker_service.core.errors import EngineError
from worker_service.core.sequence import SequenceRequest
from worker_service.engine import Engine, EngineConfig

PROMPTS = (
    "What is the capital of France? Answer in one sentence.",
    "Write a haiku about the sea.",
)


def _greedy(engine: Engine, prompt: str, new_tokens: int, label: str) -> dict:
    ids = engine.tokenizer.encode_chat([("user", prompt)])
    req = SequenceRequest(sequence_id=f"{label}-{len(ids)}-{time.monotonic_ns()}",
                          prompt_ids=tuple(ids), max_new_tokens=new_tokens)
    done = engine.generate(req, timeout_s=300)
    return {"token_ids": list(done.token_ids), "text": done.text,
            "decode_tokens_per_s": round(done.decode_tokens_per_s, 1),
            "ttft_ms": round(done.ttft_ms, 1)}


def run_checks(model_dir: Path, device_id: int, new_tokens: int, dry_run: bool = False) -> dict:
    """The checks; `dry_run` runs the same ones with the CPU provider standing in for CUDA
    (static layout), so the script is exercised by the test suite on machines with no GPU."""
    device, provider = ("cpu", "CPUExecutionProvider") if dry_run else (
        "cuda", "CUDAExecutionProvider")
    summary: dict = {"model_dir": str(model_dir), "device": device, "dry_run": dry_run,
                     "checks": {}, "ok": False}
    checks = summary["checks"]
    try:
        cuda = Engine(EngineConfig(model_dir=model_dir, device=device, device_id=device_id,
                                   kv_layout="static"))
    except EngineError as exc:
        checks["cuda_provider_active"] = {"ok": False, "error": str(exc)}
        return summary
    try:
        checks["cuda_provider_active"] = {"ok": cuda.provider == provider,
                                          "providers": list(cuda.providers)}
        # Heavy nodes on the device; the shape nodes ORT keeps on the CPU listed (the
        # session refuses to start otherwise, so a started one passes: reported here).
        checks["heavy_nodes_on_the_device"] = {
            "ok": bool(cuda.nodes_by_provider) and provider in cuda.nodes_by_provider,
            "nodes_by_provider": cuda.nodes_by_provider,
            "allowed_off_device": cuda.nodes_off_device}
        devices = sorted(cuda.runtime.kv_device_names())
        checks["kv_on_device"] = {"ok": devices == [device], "device_names": devices}
        cuda_out = [_greedy(cuda, p, new_tokens, "cuda") for p in PROMPTS]
    finally:
        cuda.close()
    with Engine(EngineConfig(model_dir=model_dir, device="cpu")) as cpu:
        cpu_out = [_greedy(cpu, p, new_tokens, "cpu") for p in PROMPTS]
    for i, (on_cuda, on_cpu) in enumerate(zip(cuda_out, cpu_out, strict=True)):
        same = on_cuda["token_ids"] == on_cpu["token_ids"]
        first_diff = next((j for j, (a, b) in enumerate(
            zip(on_cuda["token_ids"], on_cpu["token_ids"], strict=False)) if a != b), None)
        checks[f"greedy_equal_prompt_{i}"] = {
            "ok": same, "prompt": PROMPTS[i], "first_difference_at": first_diff,
            "cuda_text": on_cuda["text"], "cpu_text": on_cpu["text"],
            "cuda_decode_tokens_per_s": on_cuda["decode_tokens_per_s"],
            "cpu_decode_tokens_per_s": on_cpu["decode_tokens_per_s"]}
    summary["ok"] = all(c["ok"] for c in checks.values())
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker_service.cuda_check",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--device-id", type=int, default=0)
    parser.add_argument("--tokens", type=int, default=32, help="greedy tokens per prompt")
    parser.add_argument("--dry-run", action="store_true",
                        help="the same checks with the CPU provider standing in (no GPU needed)")
    args = parser.parse_args(argv)
    configure_logging(json=False)  # log lines to stderr: stdout is the JSON summary only
    summary = run_checks(args.model_dir, args.device_id, args.tokens, args.dry_run)
    print(json.dumps(summary, indent=2, ensure_ascii=False))
    if not summary["ok"]:
        failed = [name for name, c in summary["checks"].items() if not c["ok"]]
        first = summary["checks"][failed[0]] if failed else {}
        print(f"cuda_check FAILED: {', '.join(failed)}: {first.get('error', '')}", file=sys.stderr)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
