"""cuda_check's guard rails (worker_service/cuda_check/harness.py, __main__.py): one check's
exception is its own entry, a deadline skips what is left, the JSON is always printed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from worker_service.cuda_check import harness
from worker_service.cuda_check.__main__ import main


def context(deadline_s: float = 60.0) -> harness.Context:
    return harness.Context(model_dir=Path("."), device="cpu", device_id=0, dry_run=True,
                           deadline_at=time.monotonic() + deadline_s)


def summary_for(ctx: harness.Context) -> dict:
    return {"deadline_s": 60.0, "checks": {}, "failed": [], "ok": False}


def test_a_check_that_raises_is_its_own_entry_and_the_next_checks_run():
    def boom(ctx):
        raise IndexError("list index out of range")

    ctx = context()
    out = harness.run_checks([("first", lambda c: {"ok": True}), ("boom", boom),
                              ("after", lambda c: {"ok": True, "n": 3})], ctx, summary_for(ctx))
    boom_entry = out["checks"]["boom"]
    assert boom_entry["status"] == "error" and not boom_entry["ok"]
    assert boom_entry["error"] == "IndexError: list index out of range"
    assert any("in boom" in frame for frame in boom_entry["traceback"])
    assert out["checks"]["after"] == {"ok": True, "n": 3, "status": "passed",
                                      "elapsed_s": out["checks"]["after"]["elapsed_s"]}
    assert out["failed"] == ["boom"] and out["ok"] is False


def test_a_check_without_its_engine_is_skipped_with_the_reason():
    ctx = context()
    ctx.engine_error = "DeviceUnavailable: CUDA is not active"
    out = harness.run_checks([("needs_engine", lambda c: {"ok": c.engine is not None})], ctx,
                             summary_for(ctx))
    entry = out["checks"]["needs_engine"]
    assert entry["status"] == "skipped" and "CUDA is not active" in entry["skipped"]


def test_past_the_deadline_the_rest_are_skipped_with_its_numbers():
    ctx = context(deadline_s=0.3)

    def slow(c):
        time.sleep(0.5)
        return {"ok": True}

    out = harness.run_checks([("slow", slow), ("late", lambda c: {"ok": True})], ctx,
                             summary_for(ctx))
    assert out["checks"]["slow"]["ok"]
    late = out["checks"]["late"]
    assert late["status"] == "skipped" and "deadline of 60 s passed" in late["skipped"]
    assert out["failed"] == ["late"]


def test_waits_are_bounded_by_what_is_left_of_the_deadline():
    ctx = context(deadline_s=20)
    assert 1.0 <= ctx.wait_s() <= 20 and ctx.wait_s(cap_s=5) == 5
    assert context(deadline_s=-5).wait_s() == 1.0


def test_a_model_folder_that_does_not_load_still_prints_the_whole_json(tmp_path, capsys):
    rc = main(["--model-dir", str(tmp_path / "missing"), "--dry-run", "--deadline-s", "60"])
    summary = json.loads(capsys.readouterr().out)
    assert rc == 1 and summary["ok"] is False
    checks = summary["checks"]
    assert checks["session_starts"]["status"] == "error"
    assert all(c["status"] == "skipped" and "did not start" in c["skipped"]
               for name, c in checks.items() if name not in ("session_starts", "decode_speed"))
    assert checks["decode_speed"]["status"] == "not_applicable"
    assert set(summary["tolerances"]) == {"same_device", "recomputed", "across_devices"}


def test_a_hung_check_is_stopped_by_the_watchdog_and_the_json_still_comes_out():
    script = textwrap.dedent("""
        import time
        from pathlib import Path
        from worker_service.cuda_check import harness
        ctx = harness.Context(model_dir=Path("."), device="cpu", device_id=0, dry_run=True,
                              deadline_at=time.monotonic() + 0.2)
        summary = {"deadline_s": 0.2, "checks": {}, "failed": [], "ok": False}
        checks = [("done", lambda c: {"ok": True}), ("hangs", lambda c: time.sleep(600)),
                  ("never", lambda c: {"ok": True})]
        harness.start_watchdog(summary, checks, ctx, harness.Printer(), grace_s=0.5)
        harness.run_checks(checks, ctx, summary)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    summary = json.loads(out.stdout)
    assert out.returncode == 1, out.stderr
    assert summary["checks"]["done"]["ok"]
    assert "stopped" in summary["checks"]["hangs"]["skipped"]
    assert summary["checks"]["never"]["status"] == "skipped"
    assert summary["failed"] == ["hangs", "never"]


class _NoTokenEngine:
    """An engine whose streams end at once with no token (a stream with no token)."""

    max_batch_rows = 8

    class tokenizer:  # noqa: N801 - the engine's attribute
        @staticmethod
        def encode_chat(messages):
            return [1, 2, 3]

    def submit(self, req, on_event):
        from worker_service.core.sequence import Completed, FinishReason

        on_event(Completed(req.sequence_id, FinishReason.EOS, "", 3, 0, req.max_new_tokens,
                           0, 0, 0, 0, 0, 0, None, ""))

        class Handle:
            def cancel(self):
                pass

        return Handle()


def test_decode_speed_reports_a_stream_with_no_token_instead_of_raising():
    from worker_service.cuda_check import speed

    ctx = context()
    ctx.dry_run, ctx.streams, ctx._engine = False, (1, 4, 16), _NoTokenEngine()
    out = speed.decode_speed(ctx)
    assert not out["ok"]
    assert out["streams_1"] == {"error": "1 of 1 streams produced no token"}
    assert out["streams_4"] == {"error": "4 of 4 streams produced no token"}
    assert "more than the 8 rows" in out["streams_16"]["skipped"]
    assert "streams_1: 1 of 1 streams produced no token" in out["why"]
