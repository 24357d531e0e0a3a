"""Check the engine on an NVIDIA GPU: `python -m worker_service.cuda_check --model-dir DIR`.

Runs the CUDA runtime (device rows, runtime/device_rows.py) through what a GPU
user needs to know and prints ONE JSON summary on stdout, check by check, in the
order of checks.CHECKS:

- session_starts: the CUDA provider is active (else the cause); the KV sized
  from the model (rows x its bytes per row, plus a prefix-cache block area);
- heavy_nodes_on_the_device: ORT's placement, the allowed shape nodes listed;
- kv_on_device: the KV rows are OrtValues on the device;
- kv_memory_as_charged: what the KV allocator reserved is what the pool charges
  plus the stated overhead (runtime/device_memory.py); on CUDA the device's free
  memory is read around a probe allocation too;
- batched_equals_solo: 8 sequences of different lengths, joining and leaving at
  different steps, each equal to its batch-1 run;
- session_swap_equals_fresh: a session turn after swap-out and swap-in equals the
  same turn without the swap and a fresh run of the whole conversation, and the
  K/V it kept came back bit-exact;
- prefix_cache_hit_equals_miss: a prompt served from the prefix cache equals its
  first (missed) run;
- captured_equals_uncaptured: decode in a padded bucket with fixed buffers (a CUDA
  graph where the session has them) equals plain decode, teacher-forced: bit for
  bit on the CPU, max logit difference <= 0.05 on CUDA (runtime/graph_check.py);
- graph_id_vs_sessions: a CUDA graph per bucket by gpu_graph_id in one session
  against one captured session per bucket: ms per step at 1, 8, 32 rows and the
  device memory each took (graph_modes.py; on the dry run the path runs, the ids
  equal bit for bit, and the figures mean nothing);
- ledger: the device memory allocated is the pool's capacity plus what the decode
  path holds beside it (bucket buffers, captured graphs: taken off the capacity at
  start); what the rows held never exceeded what was charged, nor the charge the
  capacity;
- decode_speed (GPU only): decode tokens/s at 1, 8, 32, 64, 128 streams, beside
  onnxruntime-genai where it is installed;
- equal_to_cpu: the device against the CPU provider on the same folder.

"Equal" is judged on teacher-forced logits (forcing.py, compare.py): the same
tokens through both runs, max |d| within a stated tolerance and the argmax
agreeing except at near ties; on the dry run the seeded sampled tokens must be
bit-exact too, and byte moves (a session's K/V) are bit-exact everywhere.

The JSON (stable; new keys may be added, none renamed):

    {"model_dir": str, "device": "cuda" | "cpu", "dry_run": bool,
     "deadline_s": float, "elapsed_s": float,
     "tolerances": {"same_device": {atol, rtol, near_tie},
                    "recomputed": {atol, rtol, near_tie},
                    "across_devices": {atol, rtol, near_tie}},
     "checks": {NAME: {"ok": bool,
                       "status": "passed" | "failed" | "error" | "skipped"
                                 | "not_applicable",
                       "elapsed_s": float,
                       "error": str, "traceback": [str]   (status "error")
                       "skipped": str                     (skipped / not_applicable)
                       ...the check's own numbers: a "logits" entry holds
                       compare.compare_logits's (max_abs_diff, ref_abs_max,
                       tolerance, argmax_agree, near_ties, why, ...)}},
     "failed": [NAME, ...], "ok": bool}

Every check is guarded: an exception is its entry's and the next check runs;
after `--deadline-s` the checks not yet run are "skipped"; the summary is
always printed (a watchdog prints it as it stands if a check hangs past the
deadline). Exit status 0 when every check is ok, 1 otherwise. `--dry-run` runs
every check on CPU through the same device-rows code, bound to CPU OrtValues
(the test suite runs it on the tiny and SmolLM2 folders).
"""
