"""A local cluster as processes: the scheduler and N workers, as compose.yaml runs them.

  python -m devtools.cluster --workers 2            (make cluster WORKERS=2)
  python -m devtools.cluster --workers 1 --demo     (make run)

Each process logs to <log-dir>/<name>.log; Ctrl-C stops them all cleanly.
stdout carries the demo's answer and nothing else; every notice goes to stderr.
The end-to-end tests and the bench start their processes through this module too.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from ortserve_client import Client, cap_notice, notice, print_stats
from ortserve_client.flags import int_range

from ortserve.process.banner import parse as parse_banner
from ortserve.rpc.probe import check

__all__ = ["DEFAULT_MODEL", "ClusterError", "LocalCluster", "Service", "console_command",
           "default_model_dir",
           "model_cache", "start_service", "stop_service", "usable_cores", "wait_serving"]

DEFAULT_MODEL = "smollm2-135m-instruct-fp32"


def model_cache() -> Path:
    return Path(os.environ.get("ORTSERVE_MODEL_CACHE", Path.home() / ".cache" / "ortserve"))


def default_model_dir() -> Path:
    return model_cache() / "models" / DEFAULT_MODEL


def usable_cores() -> int:
    return len(os.sched_getaffinity(0))


class ClusterError(RuntimeError):
    pass


@dataclass
class Service:
    """One running process: its name, address and log file."""

    name: str
    process: subprocess.Popen
    address: str
    log_path: Path
    banner: str = ""  # the banner as 'listening HOST:PORT' (the scheduler adds 'internal HOST:PORT'), whichever form was printed

    def log_tail(self, n_lines: int = 30) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n_lines:])


def _bin(name: str) -> str:
    """A console script of this venv (beside the running interpreter)."""
    return str(Path(sys.executable).with_name(name))


# Each console script's module: where ortserve is not installed (the GPU machine runs this
# working tree from PYTHONPATH: devtools/gpu/), `python -m MODULE` starts the same program.
_MODULES = {"ortserve-scheduler": "scheduler_service", "ortserve-worker": "worker_service",
            "ortserve-gateway": "gateway", "ortserve": "ortserve_client.cli"}


def console_command(name: str) -> list[str]:
    """The argv that starts a console script: the venv's script, else `python -m` its module."""
    script = Path(sys.executable).with_name(name)
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", _MODULES[name]]


def start_service(name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None,
                  timeout_s: float = 60.0) -> Service:
    """Start a process that prints its banner first on stdout (ortserve.process.banner: plain or
    JSON); return once it has."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    log_file = open(log_path, "wb")  # noqa: SIM115 (the child owns it for its lifetime)
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log_file, stdin=subprocess.DEVNULL,
                               env={**os.environ, **(env or {})}, start_new_session=True)
    log_file.close()
    deadline = time.monotonic() + timeout_s
    line = process.stdout.readline().decode().strip()
    announced = parse_banner(line)
    if announced is None or time.monotonic() > deadline:
        process.kill()
        raise ClusterError(f"{name} did not start ({line!r}); see {log_path}:\n"
                           + log_path.read_text(errors="replace")[-3000:])
    return Service(name, process, announced.address, log_path, banner=announced.plain())


def wait_serving(service: Service, health_service: str = "", timeout_s: float = 120.0,
                 credentials=None) -> None:
    deadline = time.monotonic() + timeout_s
    status = ""
    while time.monotonic() < deadline:
        if service.process.poll() is not None:
            raise ClusterError(f"{service.name} exited with {service.process.returncode}; "
                               f"see {service.log_path}:\n{service.log_tail()}")
        status = check(service.address, health_service, timeout_s=2.0, credentials=credentials)
        if status == "SERVING":
            return
        time.sleep(0.05)  # cheap to ask, and every cluster start waits on it
    raise ClusterError(f"{service.name} not SERVING after {timeout_s:g} s (last: {status}); "
                       f"see {service.log_path}:\n{service.log_tail()}")


def stop_service(service: Service, timeout_s: float = 10.0) -> int:
    if service.process.poll() is None:
        service.process.send_signal(signal.SIGTERM)
    return _wait_stopped(service, timeout_s)


def _wait_stopped(service: Service, timeout_s: float) -> int:
    """Its exit status once it has gone (killed if it outlives timeout_s after SIGTERM)."""
    try:
        service.process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        service.process.kill()
        service.process.wait()
    return service.process.returncode


@dataclass
class LocalCluster:
    model_dir: Path
    workers: int = 1
    log_dir: Path = Path("logs")
    scheduler_port: int = 0
    host: str = "127.0.0.1"
    kv_capacities: list[str | None] = field(default_factory=list)  # per worker; None: the default
    # Per worker, the model folder it serves (None or missing: model_dir): several models
    # behind one scheduler, each request placed on its own model's workers.
    model_dirs: list[Path | None] = field(default_factory=list)
    threads: int = 0  # per worker; 0: the cores shared out
    device: str = "cpu"
    scheduler_args: list[str] = field(default_factory=list)
    worker_args: list[str] = field(default_factory=list)  # given to every worker
    # TLS everywhere when set: a folder with ca.pem, scheduler.pem, scheduler-key.pem,
    # worker.pem, worker-key.pem (compose's TLS profile uses the same names).
    tls_dir: Path | None = None
    api_key: str = ""  # what the cluster's own GetBudget calls send (keys configured)
    # When set: each worker gets --session-dir <this>/worker-<index>, the same folder
    # again when it is restarted (the disk tier of sessions; docs/features/sessions.md).
    session_root: Path | None = None
    services: list[Service] = field(default_factory=list)

    def _tls_args(self, who: str) -> list[str]:
        if self.tls_dir is None:
            return []
        d = self.tls_dir
        return ["--tls-cert", str(d / f"{who}.pem"), "--tls-key", str(d / f"{who}-key.pem"),
                "--tls-ca", str(d / "ca.pem")]

    def credentials(self, client_cert: bool = False):
        """TLS channel credentials for this cluster (client_cert: the scheduler's, for mutual TLS)."""
        if self.tls_dir is None:
            return None
        from ortserve.rpc.tls import channel_credentials

        d = self.tls_dir
        if client_cert:
            return channel_credentials(str(d / "ca.pem"), str(d / "scheduler.pem"),
                                       str(d / "scheduler-key.pem"))
        return channel_credentials(str(d / "ca.pem"))

    @property
    def internal_address(self) -> str:
        """The scheduler's worker-facing port (SchedulerInternal), from its banner."""
        words = self.services[0].banner.split()
        return words[words.index("internal") + 1]

    @property
    def address(self) -> str:
        return self.services[0].address

    @property
    def worker_services(self) -> list[Service]:
        return self.services[1:]

    def start(self) -> LocalCluster:
        try:
            scheduler = start_service("scheduler", [
                *console_command("ortserve-scheduler"), "--host", self.host, "--port", str(self.scheduler_port),
                "--internal-port", "0", *self._tls_args("scheduler"), *self.scheduler_args],
                self.log_dir)
            self.services.append(scheduler)
            wait_serving(scheduler, credentials=self.credentials())
            for i in range(self.workers):
                self.start_worker(i)
            for worker in self.worker_services:
                wait_serving(worker, "ortserve.v1.Worker", credentials=self.credentials(True))
            self.wait_registered(self.workers)
        except BaseException:
            self.stop()
            raise
        return self

    def start_worker(self, index: int, extra_args: list[str] = ()) -> Service:
        threads = self.threads or max(1, usable_cores() // max(self.workers, 1))
        model_dir = (self.model_dirs[index] if index < len(self.model_dirs) else None) or self.model_dir
        argv = [*console_command("ortserve-worker"), "--model-dir", str(model_dir),
                "--scheduler", self.internal_address, "--host", self.host, "--port", "0",
                *self._tls_args("worker"),
                "--worker-id", f"worker-{index}", "--device", self.device, "--threads", str(threads)]
        capacity = self.kv_capacities[index] if index < len(self.kv_capacities) else None
        if capacity:
            argv += ["--kv-capacity", capacity]
        if self.session_root is not None:
            argv += ["--session-dir", str(self.session_root / f"worker-{index}")]
        service = start_service(f"worker-{index}", [*argv, *self.worker_args, *extra_args],
                                self.log_dir)
        self.services.append(service)
        return service

    def wait_registered(self, n_workers: int, timeout_s: float = 60.0) -> None:
        from ortserve.rpc.tls import secure_or_insecure_channel
        from ortserve.v1 import scheduler_pb2, scheduler_pb2_grpc

        deadline = time.monotonic() + timeout_s
        metadata = (("authorization", f"Bearer {self.api_key}"),) if self.api_key else None
        with secure_or_insecure_channel(self.address, self.credentials(), aio=False) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            while time.monotonic() < deadline:
                budget = stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5,
                                        metadata=metadata)
                if len(budget.workers) >= n_workers:
                    return
                time.sleep(0.05)  # cheap to ask, and every cluster start waits on it
        raise ClusterError(f"only {len(budget.workers)} of {n_workers} workers registered "
                           f"after {timeout_s:g} s; see the logs in {self.log_dir}")

    def stop(self) -> None:
        # The workers first and all at once (each drains on its own: one after another, a
        # cluster's stop took the sum of them), then the scheduler their drains reported to.
        workers = self.services[1:]
        for worker in workers:
            if worker.process.poll() is None:
                worker.process.send_signal(signal.SIGTERM)
        for worker in reversed(workers):
            _wait_stopped(worker, 10.0)
        if self.services:
            stop_service(self.services[0])
        self.services.clear()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


DEMO_PROMPT = "What is the capital of France? Answer in one sentence."


def demo(address: str, out: TextIO | None = None) -> None:
    """Stream one answer to `out` (default: stdout); the cap, prompt and stats go to stderr."""
    out = out or sys.stdout
    with Client(address, timeout_s=120) as client:
        stream = client.stream(chat=[("user", DEMO_PROMPT)], max_new_tokens=64,
                               on_admission=lambda a: a.budget_cap and notice(cap_notice(a.budget_cap)))
        notice(f"demo: {DEMO_PROMPT}")
        for chunk in stream:
            out.write(chunk.text)
            out.flush()
        out.write("\n")
        out.flush()
        print_stats(stream.result)


def _how_to_call(address: str) -> str:
    return f"""
ortserve is serving on {address}  (Ctrl-C stops it)
  CLI:     .venv/bin/ortserve --address {address} generate "Name three rivers." --chat --stats
           .venv/bin/ortserve --address {address} budget
  grpcurl: .venv/bin/grpcurl -plaintext {address} list
           .venv/bin/grpcurl -plaintext -d '{{"chat": {{"messages": [{{"role": "user", "content": "Hi!"}}]}}, "max_new_tokens": 32}}' {address} ortserve.v1.Scheduler/Generate
  any language: compile protos/ortserve/v1/*.proto with -I protos (Node example: clients/node/)
"""


positive_int = int_range(1, 1024, "an integer from 1 to 1,024")
port_number = int_range(0, 65_535, "a TCP port from 0 to 65,535 (0: any free port)")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m devtools.cluster", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=positive_int, default=1)
    p.add_argument("--model-dir", type=Path, default=default_model_dir())
    p.add_argument("--port", type=port_number, default=int(os.environ.get("ORTSERVE_SCHEDULER_PORT", 50051)))
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--kv-capacity", default=os.environ.get("ORTSERVE_WORKER_KV_CAPACITY"),
                   help="per worker, e.g. 1GiB")
    p.add_argument("--log-dir", type=Path, default=Path("logs"))
    p.add_argument("--demo", action="store_true", help="stream one demo answer, then keep serving")
    a = p.parse_args(argv)
    if not (a.model_dir / "genai_config.json").exists():
        sys.exit(f"ortserve: no model at {a.model_dir}: run `make model` (or pass --model-dir)")
    cluster = LocalCluster(model_dir=a.model_dir, workers=a.workers, log_dir=a.log_dir,
                           scheduler_port=a.port, host=a.host,
                           kv_capacities=[a.kv_capacity] * a.workers)
    notice(f"starting the scheduler and {a.workers} worker(s) on {a.model_dir.name}; "
           f"logs in {a.log_dir}/")
    stopping = []

    def interrupt(signum, frame):
        # Only the first signal interrupts: a second one (make forwards SIGTERM while
        # `timeout` or a terminal sends its own) must not cut the stop short.
        if not stopping:
            stopping.append(signum)
            raise KeyboardInterrupt

    # NOTE: explicit handlers: a shell starting us in the background leaves SIGINT
    # ignored, and SIGTERM (docker stop, kill) must stop the children as Ctrl-C does.
    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    try:
        cluster.start()
        if a.demo:
            demo(cluster.address)
        print(_how_to_call(cluster.address), file=sys.stderr, flush=True)
        while True:
            time.sleep(0.5)
            for service in cluster.services:
                if service.process.poll() is not None:
                    raise ClusterError(f"{service.name} exited ({service.process.returncode}); "
                                       f"see {service.log_path}:\n{service.log_tail()}")
    except KeyboardInterrupt:
        pass
    except ClusterError as error:
        sys.exit(f"ortserve: {error}")
    finally:
        stopping.append("stop")  # from here on signals are ignored (see interrupt)
        cluster.stop()  # the children get SIGTERM, then SIGKILL after 10 s
    notice("stopped")


if __name__ == "__main__":
    main()
