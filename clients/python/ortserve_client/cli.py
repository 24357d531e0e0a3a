"""ortserve: the command line. stdout carries results only; every notice goes to stderr.

  ortserve generate "What is the capital of France?" --chat --stats
  ortserve generate - --json < prompt.txt
  ortserve generate "A person:" --json-schema person.json --json --logprobs 2
  ortserve admit "..." --max-new-tokens 512        (dry run: admitted, capped or rejected?)
  ortserve budget --leases
  ortserve chat --stats                            (one stdin line per turn, on a session)

Exit codes: 0 done; 1 failed; 2 bad usage; 3 rejected by admission; 4 invalid request;
130 interrupted (Ctrl-C cancels the stream; a second one exits at once); 141 stdout closed early (`| head`), quietly, as a tool killed by SIGPIPE would report.
A cap (max_new_tokens reduced by the KV budget) is printed on stderr before the
first token, and is in --stats and --json. A wait in the scheduler's admission queue is
queue_wait_ms in --stats and --json (with --no-direct its place is also said on stderr). An output that ends
before completing its constraint (--json-schema, --regex, ...) is said on stderr after
it, and the constraint's result is in --stats and --json; so are --logprobs.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

from google.protobuf import json_format

from ortserve.process.version import package_version
from ortserve.status.units import human_bytes

from . import chat, flags
from .client import DEFAULT_ADDRESS, Client, Retry
from .errors import InvalidRequest, OrtserveError, Rejected
from .interrupt import EXIT_INTERRUPTED, Interrupt
from .report import cap_notice, constraint_notice, notice, print_stats, queued_notice
from .types import Admission

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_REJECTED, EXIT_INVALID = 0, 1, 2, 3, 4
EXIT_BROKEN_PIPE = 128 + 13  # 128 + SIGPIPE: what the shell reports for `cat` in the same place


def _request_kwargs(a: argparse.Namespace) -> dict:
    prompt = sys.stdin.read() if a.prompt == "-" else a.prompt
    kw = dict(max_new_tokens=a.max_new_tokens, min_new_tokens=a.min_new_tokens, strict=a.strict,
              wait_full=a.wait_full, model=a.model, adapter=a.adapter)
    if a.chat:
        turns = ([("system", a.system)] if a.system else []) + [("user", prompt)]
        kw["chat"] = turns
    else:
        kw["prompt"] = prompt
    for name in ("temperature", "top_k", "top_p", "seed", "repetition_penalty", "presence_penalty",
                 "frequency_penalty", "min_p", "logprobs", "stop", "request_id",
                 "stream_interval_ms", "json_schema", "json_object", "regex", "grammar",
                 "priority", "max_itl_ms", "max_ttft_ms"):
        value = getattr(a, name, None)
        if value is not None:
            kw[name] = value
    return kw


def cmd_generate(client: Client, a: argparse.Namespace) -> int:
    def announce(admission: Admission) -> None:
        if admission.budget_cap:
            notice(cap_notice(admission.budget_cap))

    def retrying(error: OrtserveError, delay_s: float) -> None:
        notice(f"retrying in {delay_s:.1f} s ({client.retry.attempts - stream.retries} left): "
               f"{error.message}")

    kw = _request_kwargs(a)
    if a.max_queue_wait_s is not None:
        kw["max_queue_wait_ms"] = int(a.max_queue_wait_s * 1e3)
    stream = client.stream(on_admission=announce, on_queued=lambda q: notice(queued_notice(q)),
                           on_retry=retrying, **kw)
    for chunk in stream:
        if not a.json:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
    result = stream.result
    if a.json:
        print(json.dumps(result.to_dict()))
    else:
        sys.stdout.write("\n")
    if result.constraint is not None and not result.constraint.satisfied:
        notice(constraint_notice(result.constraint))
    if a.logprobs is not None and not (a.json or a.stats):
        notice(f"--logprobs: the {len(result.logprobs):,} tokens' log-probabilities are "
               "reported with --json (on stdout) or --stats (on stderr)")
    if a.stats:
        print_stats(result)
    return EXIT_OK


def _admission_text(adm: Admission) -> str:
    if adm.decision == "REJECTED":
        r = adm.rejection
        return f"REJECTED ({r['cause']}): {r['message']}; {r['remedy']}"
    line = (f"{adm.decision}: worker {adm.worker_id} (model {adm.model}), "
            f"prompt {adm.prompt_tokens:,} tokens, "
            f"max_new_tokens {adm.max_new_tokens:,}, {human_bytes(adm.reserved_bytes)} of KV")
    if adm.budget_cap:
        line += f"\n{cap_notice(adm.budget_cap)}"
    return line


def cmd_admit(client: Client, a: argparse.Namespace) -> int:
    adm = client.admit(dry_run=True, **_request_kwargs(a))
    if a.json:
        print(json.dumps({**adm.__dict__, "budget_cap": adm.budget_cap.__dict__ if adm.budget_cap else None}))
    else:
        print(_admission_text(adm))
    return EXIT_REJECTED if adm.decision == "REJECTED" else EXIT_OK


def time_line(w) -> str:
    """A worker's time budget in one line (docs/features/time-budget.md)."""
    if not w.time_measured:
        line = "time: not measured yet (admitted by bytes alone until its first decode steps)"
        return f"{line}; {prompt_pace(w)}" if w.prompt_token_ms else line
    goal = f"goal {w.itl_goal_ms:,} ms" if w.itl_goal_ms else "no goal"
    line = (f"time: {w.streams:,} streams, step {w.step_ms:.1f} ms, with one more "
            f"{w.next_step_ms:.1f} ms, {goal} ({w.steps_measured:,} steps measured)")
    return f"{line}; {prompt_pace(w)}"


def prompt_pace(w) -> str:
    """The prompt chunks' pace the worker's heartbeat said (what the TTFT prediction reads)."""
    if not w.prompt_token_ms:
        return "prompt pace not measured yet"
    return (f"prompt {w.prompt_token_ms:.3f} ms a token + {w.prompt_chunk_ms:.1f} ms a chunk, "
            f"at most {w.prefill_chunk_tokens:,} tokens a step")


def cmd_budget(client: Client, a: argparse.Namespace) -> int:
    budget = client.budget(include_leases=a.leases)
    if a.json:
        print(json.dumps(json_format.MessageToDict(budget, preserving_proto_field_name=True,
                                                   always_print_fields_with_no_presence=True)))
        return EXIT_OK
    # host and disk: parked sessions' tiers, apart from the KV capacity (never admitted against).
    print(f"{'worker':<24} {'capacity':>12} {'reserved':>12} {'available':>12} {'leases':>6} "
          f"{'host':>10} {'disk':>10}  provider")
    for w in budget.workers:
        print(f"{w.worker_id:<24} {human_bytes(w.capacity_bytes):>12} {human_bytes(w.reserved_bytes):>12} "
              f"{human_bytes(w.available_bytes):>12} {w.lease_count:>6} {human_bytes(w.host_bytes):>10} "
              f"{human_bytes(w.disk_bytes):>10}  {w.execution_provider}")
        if w.decode_graph_bytes or w.decode_buffer_bytes:
            print(f"  decode path holds {human_bytes(w.decode_graph_bytes)} of CUDA graphs and "
                  f"{human_bytes(w.decode_buffer_bytes)} of bucket buffers (out of capacity)")
        print(f"  {time_line(w)}")
        for lease in w.leases:
            print(f"  lease {lease.lease_id} request {lease.request_id} {human_bytes(lease.reserved_bytes)}"
                  f" max_new_tokens {lease.max_new_tokens:,}{' CAPPED' if lease.HasField('budget_cap') else ''}")
    print(f"{'total':<24} {human_bytes(budget.total_capacity_bytes):>12} "
          f"{human_bytes(budget.total_reserved_bytes):>12} {human_bytes(budget.total_available_bytes):>12} "
          f"{budget.total_leases:>6} {human_bytes(budget.total_host_bytes):>10} "
          f"{human_bytes(budget.total_disk_bytes):>10}")
    goals = [f"{name} {value:,}" for name, value in (("max_itl_ms", budget.max_itl_ms),
                                                      ("max_ttft_ms", budget.max_ttft_ms)) if value]
    print("time goals: " + (", ".join(goals) if goals else "none (admission by KV bytes alone)"))
    if budget.tenants:
        print(f"\n{'tenant':<16} {'model':<20} {'reserved':>10} {'quota':>10} {'weight':>6} "
              f"{'leases':>6} {'queued':>6} {'waits for':>10} {'disk':>10}   ({budget.tenants_source})")
        for t in budget.tenants:
            quota = human_bytes(t.quota_bytes) if t.HasField("quota_bytes") else "none"
            print(f"{t.tenant or '(none)':<16} {t.model:<20} {human_bytes(t.reserved_bytes):>10} "
                  f"{quota:>10} {t.weight:>6g} {t.leases:>6} {t.queue_length:>6} "
                  f"{human_bytes(t.queue_waiting_bytes):>10} {human_bytes(t.disk_bytes):>10}")
    return EXIT_OK


def cmd_info(client: Client, a: argparse.Namespace) -> int:
    """What the cluster is: the scheduler's version, and each worker's version, model,
    device, provider and capacity (from their registrations; one call to the scheduler)."""
    budget = client.budget(include_leases=False)
    if a.json:
        print(json.dumps({
            "client_version": package_version(), "scheduler": {"address": client.address,
                                                               "version": budget.scheduler_version},
            "workers": [{"worker_id": w.worker_id, "address": w.address, "version": w.version,
                         "model": w.model, "device": w.device,
                         "execution_provider": w.execution_provider,
                         "capacity_bytes": w.capacity_bytes, "context_length": w.context_length,
                         "block_tokens": w.block_tokens, "draining": w.draining,
                         "nodes_off_device": list(w.nodes_off_device),
                         "adapters": [{"name": x.name, "held_bytes": x.held_bytes}
                                      for x in w.adapters]}
                        for w in budget.workers]}))
        return EXIT_OK
    print(f"client     ortserve {package_version()}")
    print(f"scheduler  {client.address}  ortserve {budget.scheduler_version or '?'}")
    for w in budget.workers:
        print(f"worker     {w.worker_id}  {w.address}  ortserve {w.version or '?'}  model {w.model}  "
              f"device {w.device or '?'}  {w.execution_provider}  capacity "
              f"{human_bytes(w.capacity_bytes)}  context {w.context_length:,}"
              f"{'  DRAINING' if w.draining else ''}")
        if w.nodes_off_device:
            print(f"           {len(w.nodes_off_device)} shape node(s) off the device, allowed: "
                  f"{'; '.join(w.nodes_off_device)}")
        if w.adapters:
            print(f"           {len(w.adapters)} LoRA adapter(s): " + ", ".join(
                f"{x.name} ({human_bytes(x.held_bytes)})" for x in w.adapters))
    for m in budget.models:
        print(f"model      {m.model}  {m.workers} worker(s)  capacity "
              f"{human_bytes(m.capacity_bytes)}  available {human_bytes(m.available_bytes)}  "
              f"context {m.context_length:,}")
    if not budget.workers:
        notice("no worker is registered")
    return EXIT_OK


def _add_request_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt", help="the prompt text, or - to read it from stdin")
    p.add_argument("--chat", action="store_true", help="send as a user turn (the model's chat template)")
    p.add_argument("--system", help="with --chat: a system turn first")
    p.add_argument("--max-new-tokens", type=flags.max_new_tokens,
                   help="1 to 4,294,967,295; unset: the remaining context window (may be capped)")
    p.add_argument("--min-new-tokens", type=flags.uint32, default=0,
                   help="no EOS or stop sequence ends the output before this many tokens")
    policy = p.add_mutually_exclusive_group()
    policy.add_argument("--strict", action="store_true", help="refuse to be capped: reject instead")
    policy.add_argument("--wait-full", action="store_true",
                        help="wait in the queue for the full max_new_tokens; cap only when the "
                             "wait runs out (cap policy WAIT_FULL)")
    p.add_argument("--request-id")
    p.add_argument("--priority", type=int, default=None,
                   help="the admission queue's order when it waits: lower is sooner (unset: 0); "
                        "nothing admitted is preempted")
    flags.add_goal_flags(p)
    p.add_argument("--model", default="",
                   help="the served model to answer with (`ortserve info` lists them); unset: "
                        "the cluster's one model (refused, listing them, when it serves several)")
    p.add_argument("--adapter", default="",
                   help="a LoRA adapter of the model to run under (`ortserve info` lists them); "
                        "unset: the base model")
    # One constraint at most (docs/features/structured-output.md); the server compiles it.
    constraint = p.add_mutually_exclusive_group()
    constraint.add_argument("--json-schema", type=flags.json_schema, metavar="FILE|JSON",
                            help="the output is one JSON value valid against this JSON Schema "
                                 "(inline JSON, or a file)")
    constraint.add_argument("--json-object", action="store_true",
                            help="the output is any one JSON object")
    constraint.add_argument("--regex", metavar="RE",
                            help="the whole output matches this regular expression (Rust syntax)")
    constraint.add_argument("--grammar", type=flags.text_file, metavar="FILE",
                            help="the output derives from this Lark grammar (llguidance's dialect)")


def _direct_from_env(value: str) -> bool | None:
    value = value.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    return None


def _adapter_change(change, verb: str, a: argparse.Namespace) -> int:
    if a.json:
        print(json.dumps({"worker_id": change.worker_id, verb: change.adapter.name,
                          "held_bytes": change.adapter.held_bytes,
                          "capacity_bytes": change.capacity_bytes,
                          "adapters": [x.name for x in change.adapters]}))
        return EXIT_OK
    print(f"{verb} {change.adapter.name} ({human_bytes(change.adapter.held_bytes)}) on worker "
          f"{change.worker_id}: KV capacity now {human_bytes(change.capacity_bytes)}; adapters: "
          f"{', '.join(x.name for x in change.adapters) or 'none'}")
    return EXIT_OK


def cmd_load_adapter(client: Client, a: argparse.Namespace) -> int:
    return _adapter_change(client.load_adapter(a.name, a.path, a.worker), "loaded", a)


def cmd_unload_adapter(client: Client, a: argparse.Namespace) -> int:
    return _adapter_change(client.unload_adapter(a.name, a.worker), "unloaded", a)


def build_parser() -> argparse.ArgumentParser:
    # NOTE: allow_abbrev=False: argparse matches every option-like word of the whole command
    # line against this parser's flags as a prefix, a subcommand's too, so `load-adapter ...
    # --worker ID` was "ambiguous" between --worker-ca/-cert/-key (exit 2) and could not be said.
    p = argparse.ArgumentParser(prog="ortserve", description=__doc__, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--address", default=os.environ.get("ORTSERVE_ADDRESS", DEFAULT_ADDRESS),
                   help="the scheduler's host:port (env ORTSERVE_ADDRESS)")
    p.add_argument("--cacert", default=os.environ.get("ORTSERVE_CACERT"),
                   help="TLS: the CA (PEM) the scheduler's certificate chains to (env ORTSERVE_CACERT); "
                        "unset: plaintext")
    p.add_argument("--api-key-file", default=os.environ.get("ORTSERVE_API_KEY_FILE"),
                   help="a file holding the API key (env ORTSERVE_API_KEY_FILE, or the key itself "
                        "in env ORTSERVE_API_KEY; never on the command line)")
    p.add_argument("--timeout", type=flags.timeout_s, default=None, help="deadline in seconds")
    p.add_argument("--direct", action=argparse.BooleanOptionalAction,
                   default=_direct_from_env(os.environ.get("ORTSERVE_DIRECT", "")),
                   help="the two-step path only: Admit, then stream from the worker directly "
                        "(the scheduler relays no token; this machine must reach the workers' "
                        "addresses); --no-direct: the scheduler relays every stream. Default: "
                        "the two-step path to the workers this machine reaches, relayed to the "
                        "others (said on stderr); env ORTSERVE_DIRECT=1 or 0")
    for name, what in (("ca", "the CA (PEM) the workers' certificates chain to"),
                       ("cert", "this client's certificate (PEM), signed by the cluster's CA"),
                       ("key", "its private key (PEM)")):
        p.add_argument(f"--worker-{name}", default=None,
                       help=f"with --direct, mutual TLS to the workers: {what}")
    p.add_argument("--retries", type=flags.retries, default=0,
                   help="retry a refused admission (busy, queue full, queue timeout, no worker) "
                        "this many times, waiting as the server's RetryInfo says (backoff otherwise)")
    p.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="stream a generation to stdout")
    _add_request_flags(g)
    g.add_argument("--temperature", type=flags.temperature, help=">= 0; unset or 0: greedy")
    g.add_argument("--top-k", type=flags.uint32,
                   help=">= 0; 0: no limit")
    g.add_argument("--top-p", type=flags.top_p, help="in (0, 1]; 1: no limit")
    g.add_argument("--seed", type=flags.uint64, help="0 to 2**64-1; unset: random, reported")
    g.add_argument("--repetition-penalty", type=flags.repetition_penalty, help="> 0; 1: none")
    g.add_argument("--presence-penalty", type=flags.finite_float,
                   help="in [-2, 2], once per generated token id; 0: none")
    g.add_argument("--frequency-penalty", type=flags.finite_float,
                   help="in [-2, 2], per time a token id was generated; 0: none")
    g.add_argument("--min-p", type=flags.finite_float,
                   help="in [0, 1]: keep tokens at least this times the likeliest's probability "
                        "(sampling only); 0: no limit")
    g.add_argument("--logprobs", type=flags.uint32, metavar="N",
                   help="each token's log-probability and its N likeliest alternatives (0 to 20; "
                        "0: the token's own only), in --json and --stats")
    g.add_argument("--stop", action="append", help="a stop sequence (repeatable)")
    g.add_argument("--stream-interval-ms", type=flags.uint32,
                   help="the shortest time between two chunks (the tokens meanwhile come as one: "
                        "fewer messages; the first token is never held); unset or 0: each token "
                        "as it comes; at most 10,000")
    g.add_argument("--stats", action="store_true", help="timings and usage on stderr")
    g.add_argument("--json", action="store_true", help="one JSON object on stdout instead of the text "
                   "(queue_wait_ms included)")
    g.add_argument("--max-queue-wait-s", type=flags.queue_wait_s,
                   help="the longest to wait for KV budget in the scheduler's queue (0: do not "
                        "wait); unset: the server's bound")
    g.set_defaults(func=cmd_generate)
    ad = sub.add_parser("admit", help="dry run: would this be admitted, capped or rejected?")
    _add_request_flags(ad)
    ad.add_argument("--json", action="store_true")
    ad.set_defaults(func=cmd_admit)
    b = sub.add_parser("budget", help="the ledger, per worker")
    b.add_argument("--leases", action="store_true")
    b.add_argument("--json", action="store_true")
    b.set_defaults(func=cmd_budget)
    i = sub.add_parser("info", help="what the cluster runs: versions, models, devices, capacity")
    i.add_argument("--json", action="store_true")
    i.set_defaults(func=cmd_info)
    ld = sub.add_parser("load-adapter", help="load a LoRA adapter on a worker (an admin key)")
    ld.add_argument("name", help="the name requests will give it (--adapter NAME)")
    ld.add_argument("path", help="its .onnx_adapter file, as a path on the worker")
    ld.add_argument("--worker", default="", help="the worker's id (unset: the one registered)")
    ld.add_argument("--json", action="store_true")
    ld.set_defaults(func=cmd_load_adapter)
    ul = sub.add_parser("unload-adapter", help="unload an idle LoRA adapter (an admin key)")
    ul.add_argument("name")
    ul.add_argument("--worker", default="", help="the worker's id (unset: the one registered)")
    ul.add_argument("--json", action="store_true")
    ul.set_defaults(func=cmd_unload_adapter)
    chat.add_parser(sub)
    return p


def run(argv: list[str] | None = None) -> int:
    """Parse argv, run the command, return the exit code (argparse's own exits included)."""
    try:
        a = build_parser().parse_args(argv)
    except SystemExit as exit_:  # --help, --version, usage errors: their output is flushed in main
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    try:
        api_key = (pathlib.Path(a.api_key_file).read_text(encoding="utf-8").strip() if a.api_key_file
                   else os.environ.get("ORTSERVE_API_KEY"))
    except OSError as error:
        notice(f"--api-key-file: cannot read {a.api_key_file!r}: {error.strerror}")
        return EXIT_USAGE
    worker_tls = (a.worker_ca, a.worker_cert, a.worker_key)
    if any(worker_tls) and not all(worker_tls):
        notice("--worker-ca, --worker-cert and --worker-key go together (mutual TLS to the "
               "workers): give all three, or none for plaintext")
        return EXIT_USAGE
    try:
        client = Client(a.address, timeout_s=a.timeout, cacert=a.cacert, api_key=api_key,
                        retry=Retry(attempts=a.retries) if a.retries else None, direct=a.direct,
                        worker_tls=worker_tls if all(worker_tls) else None)
    except OSError as error:
        notice(f"cannot read {error.filename!r}: {error.strerror}")
        return EXIT_USAGE
    interrupt = Interrupt(client).install()
    try:
        with client:
            code = _run_command(client, a, interrupt)
            interrupt.settle()  # a cancel's lease given back before the channels close
            return code
    finally:
        interrupt.restore()


def _run_command(client: Client, a: argparse.Namespace, interrupt: Interrupt) -> int:
    """The command, its errors said and mapped to the exit codes."""
    try:
        return a.func(client, a)
    except OrtserveError as error:
        if interrupt.fired:  # its stream was cancelled by the interrupt: said as one
            notice("interrupted")
            return EXIT_INTERRUPTED
        label = "rejected" if isinstance(error, Rejected) else "error"
        notice(f"{label} [{error.code.name}]: {error.message}")
        if getattr(a, "json", False):
            print(json.dumps(error.to_dict()))
        return (EXIT_REJECTED if isinstance(error, Rejected)
                else EXIT_INVALID if isinstance(error, InvalidRequest) else EXIT_FAILED)
    except KeyboardInterrupt:
        notice("interrupted")
        return EXIT_INTERRUPTED


def main(argv: list[str] | None = None) -> None:
    try:
        code = run(argv)
        # NOTE: flush here, not at interpreter exit: a reader that closed the pipe
        # (`| head`) would make the exit-time flush print "Exception ignored".
        sys.stdout.flush()
        if code == EXIT_INTERRUPTED:
            # Done, the calls cancelled and the channels closed: skip the interpreter's
            # shutdown, whose collection of gRPC's call objects can wait forever on a lock
            # a thread cut off by the interrupt holds (interrupt.py).
            sys.stderr.flush()
            os._exit(code)
    except BrokenPipeError:
        # The reader is gone; leaving the Client's block cancelled the stream (the lease
        # is freed). Point both streams at /dev/null so the exit-time flush cannot fail.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.dup2(devnull, sys.stderr.fileno())
        code = EXIT_BROKEN_PIPE
    sys.exit(code)


if __name__ == "__main__":
    main()
