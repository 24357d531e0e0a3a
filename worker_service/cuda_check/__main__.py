"""`python -m worker_service.cuda_check`: argv -> the checks -> one JSON summary on stdout."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ortserve.process.logs import configure_logging
from worker_service import cuda_check
from worker_service.cuda_check import compare, harness
from worker_service.cuda_check.checks import CHECKS

# Fits the device script's budget for cuda_check (its whole run stops within ~9 minutes).
DEFAULT_DEADLINE_S = 300.0


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m worker_service.cuda_check",
                                     description=(cuda_check.__doc__ or "").splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--device-id", type=int, default=0)
    parser.add_argument("--tokens", type=int, default=32,
                        help="forced (and, on the dry run, sampled) tokens per prompt in "
                             "equal_to_cpu")
    parser.add_argument("--speed-tokens", type=int, default=128,
                        help="new tokens per stream in decode_speed")
    parser.add_argument("--deadline-s", type=float, default=DEFAULT_DEADLINE_S,
                        help="after this many seconds the checks not yet run are recorded as "
                             f"skipped (default {DEFAULT_DEADLINE_S:g})")
    parser.add_argument("--dry-run", action="store_true",
                        help="every check on CPU through the device-rows code (no GPU needed)")
    args = parser.parse_args(argv)
    if args.tokens < 1 or args.speed_tokens < 1:
        parser.error(f"--tokens and --speed-tokens must be at least 1, got {args.tokens} and "
                     f"{args.speed_tokens}")
    if args.deadline_s <= 0:
        parser.error(f"--deadline-s must be positive, got {args.deadline_s:g}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    configure_logging(json=False)  # log lines to stderr: stdout is the JSON summary only
    ctx = harness.Context(model_dir=args.model_dir, device="cpu" if args.dry_run else "cuda",
                          device_id=args.device_id, dry_run=args.dry_run,
                          deadline_at=time.monotonic() + args.deadline_s,
                          new_tokens=args.tokens, speed_tokens=args.speed_tokens)
    summary: dict = {"model_dir": str(args.model_dir), "device": ctx.device,
                     "dry_run": args.dry_run, "deadline_s": args.deadline_s,
                     "tolerances": {"same_device": compare.SAME_DEVICE.as_dict(),
                                    "recomputed": compare.RECOMPUTED.as_dict(),
                                    "across_devices": compare.ACROSS_DEVICES.as_dict()},
                     "checks": {}, "failed": [], "ok": False}
    printer = harness.Printer()
    watchdog = harness.start_watchdog(summary, CHECKS, ctx, printer)
    try:
        harness.run_checks(CHECKS, ctx, summary)
    except BaseException as exc:  # noqa: BLE001 - the summary is printed whatever happened
        summary["error"] = f"{type(exc).__name__}: {exc}"
        harness.finish(summary, ctx)
    finally:
        watchdog.cancel()
        printer.print(summary)
    if not summary["ok"]:
        first = summary["checks"].get(summary["failed"][0], {}) if summary["failed"] else {}
        reason = first.get("error") or first.get("skipped") or first.get("why") or (
            first.get("logits", {}) or {}).get("why", "")
        print(f"cuda_check FAILED: {', '.join(summary['failed']) or summary.get('error')}: "
              f"{reason}", file=sys.stderr)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
