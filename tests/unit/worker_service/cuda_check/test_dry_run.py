"""`python -m worker_service.cuda_check --dry-run` end to end on real model folders: every
check on CPU through the device-rows code, bound to CPU OrtValues, passing check by check.
The KV is sized from the model (before, a constant fit only the tiny model: SmolLM2's
90 MiB row did not fit its 64 MiB)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.models import prepared_model_dir

EVERY_CHECK = ["session_starts", "heavy_nodes_on_the_device", "kv_on_device",
               "kv_memory_as_charged", "batched_equals_solo", "session_swap_equals_fresh",
               "prefix_cache_hit_equals_miss", "captured_equals_uncaptured",
               "graph_id_vs_sessions", "ledger",
               "decode_speed", "equal_to_cpu"]


def dry_run(model_dir, tokens: int) -> dict:
    out = subprocess.run([sys.executable, "-m", "worker_service.cuda_check", "--model-dir",
                          str(model_dir), "--tokens", str(tokens), "--dry-run"],
                         capture_output=True, text=True, timeout=900)
    summary = json.loads(out.stdout)  # whole JSON on stdout, whatever happened
    failed = {name: c for name, c in summary["checks"].items() if not c["ok"]}
    assert out.returncode == 0 and summary["ok"] and not failed, (failed, out.stderr[-2000:])
    return summary


def assert_every_check_judged(summary: dict) -> None:
    checks = summary["checks"]
    assert summary["dry_run"] and list(checks) == EVERY_CHECK and summary["failed"] == []
    assert all(c["status"] == "passed" for n, c in checks.items() if n != "decode_speed")
    assert checks["decode_speed"]["status"] == "not_applicable"
    assert checks["kv_on_device"]["kv_layout"] == "device-rows"
    memory = checks["kv_memory_as_charged"]
    assert memory["reserved_bytes"] == memory["charged_bytes"] + memory["overhead_bytes"]
    assert memory["reserved_bytes"] == memory["expected_reserved_bytes"]
    # The decode buckets' buffers are charged out of the allocation; no graphs on the CPU.
    assert memory["decode_buffer_bytes"] > 0 and memory["decode_graph_bytes"] == 0
    assert memory["charged_bytes"] == memory["capacity_bytes"] + memory["decode_buffer_bytes"]
    assert 0 < memory["overhead_bytes"] <= 256 * memory["tensors"]
    batched = checks["batched_equals_solo"]
    assert batched["largest_batch"] >= 5 and batched["tokens"]["ok"]
    for name in ("batched_equals_solo", "session_swap_equals_fresh",
                 "prefix_cache_hit_equals_miss", "equal_to_cpu"):
        logits = checks[name]["logits"]
        # The numbers the CUDA verdict reads, present and judged on the dry run too.
        assert logits["ok"] and logits["max_abs_diff"] <= logits["tolerance"], (name, logits)
        assert logits["argmax_agree"] > 0 and "near_ties" in logits and "ref_abs_max" in logits
        assert checks[name]["tokens"]["ok"], (name, checks[name]["tokens"])
    session = checks["session_swap_equals_fresh"]
    assert session["state_after_swap_out"] == "swapped" and session["kept_kv"]["ok"]
    assert session["reused_prompt_tokens"] > 0 and session["logits_vs_fresh"]["ok"]
    assert checks["prefix_cache_hit_equals_miss"]["cached_prompt_tokens"] > 0
    modes = checks["graph_id_vs_sessions"]
    assert modes["same_greedy_ids"] and set(modes["id"]["ms_per_step"]) == {"1", "4"}
    assert set(modes["sessions"]["ms_per_step"]) == {"1", "4"} and not modes["captured"]
    ledger = checks["ledger"]
    assert ledger["allocated_bytes"] == ledger["capacity_bytes"] + ledger["decode_buffer_bytes"]
    # Sized from the model: the rows hold ROW_TOKENS of this model, not a constant.
    starts = checks["session_starts"]
    assert starts["capacity_bytes"] >= starts["rows"] * starts["row_bytes"]


def test_the_dry_run_passes_check_by_check_on_the_tiny_model(tiny_dir):
    assert_every_check_judged(dry_run(tiny_dir, tokens=4))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2-135m-instruct-fp32", "smollm2-135m-instruct-int4"])
def test_the_dry_run_passes_check_by_check_on_smollm2(name):
    assert_every_check_judged(dry_run(prepared_model_dir(name), tokens=8))


def test_a_wrong_row_in_the_batched_decode_fails_the_check_with_its_numbers(tiny_dir,
                                                                             monkeypatch):
    """The check can fail: a decode that hands each row its neighbour's logits (a wrong
    row) is caught by the teacher-forced comparison, which names the numbers."""
    import time

    from worker_service.cuda_check import checks, harness
    from worker_service.runtime.ort_rows import Decoded, OrtRows

    real = OrtRows.decode_rows

    def wrong_row(self, rows, *args, **kwargs):
        decoded = real(self, rows, *args, **kwargs)
        if rows == 1:
            return decoded
        logits = np.roll(decoded.logits(), 1, axis=0)  # ids and logits of the neighbour
        return Decoded(rows, np.roll(decoded.next_ids, 1), lambda: logits, logits)

    monkeypatch.setattr(OrtRows, "decode_rows", wrong_row)
    ctx = harness.Context(model_dir=tiny_dir, device="cpu", device_id=0, dry_run=True,
                          deadline_at=time.monotonic() + 300)
    summary = {"deadline_s": 300, "checks": {}, "failed": [], "ok": False}
    out = harness.run_checks([("session_starts", checks.session_starts),
                              ("batched_equals_solo", checks.batched_equals_solo)], ctx, summary)
    batched = out["checks"]["batched_equals_solo"]
    assert out["checks"]["session_starts"]["ok"] and batched["status"] == "failed"
    logits = batched["logits"]
    assert not logits["ok"] and logits["max_abs_diff"] > logits["tolerance"]
    assert logits["failed_sequences"] and "max |d|" in logits["why"]


def test_a_session_brought_back_with_a_stale_past_fails_the_swap_check(tiny_dir, monkeypatch):
    """The check can fail: a row import that writes each position's neighbour (a stale
    past) is caught byte for byte in the kept K/V, whatever the logits show (the tiny
    model's logits hardly depend on the past: its stale_past_control says how much)."""
    import time

    from worker_service.cuda_check import checks, harness
    from worker_service.runtime.device_rows import DeviceRows

    real = DeviceRows.import_row

    def stale(self, row, keys, values, n_tokens):
        return real(self, row, [np.roll(k, 1, axis=1) for k in keys],
                    [np.roll(v, 1, axis=1) for v in values], n_tokens)

    monkeypatch.setattr(DeviceRows, "import_row", stale)
    ctx = harness.Context(model_dir=tiny_dir, device="cpu", device_id=0, dry_run=True,
                          deadline_at=time.monotonic() + 300)
    summary = {"deadline_s": 300, "checks": {}, "failed": [], "ok": False}
    out = harness.run_checks([("session_starts", checks.session_starts),
                              ("session_swap_equals_fresh", checks.session_swap_equals_fresh)],
                             ctx, summary)
    session = out["checks"]["session_swap_equals_fresh"]
    assert session["status"] == "failed" and not session["kept_kv"]["ok"]
    assert "bytes differ" in session["kept_kv"]["why"]
    assert session["stale_past_control"]["positions"] == 12
