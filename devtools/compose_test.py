"""`make compose-test`: compose.yaml in real containers, driven from outside as a user would.

  .venv/bin/python -m devtools.compose_test   (make compose-test)

Runs the README's "Local clusters" commands (the block between its
compose-commands markers; `docker` becomes this machine's engine, see
devtools/container_engine.py): builds the scheduler and cpu images, seeds
the model volume from the host model cache, brings up the cpu profile with
two workers, then, only through the published ports: lists services with
grpcurl (server reflection), generates, asks for more tokens than a worker's
KV budget holds and sees CAPPED before the first token and in the result,
sees both workers in GetBudget, the gateway's /v1/models and a chat completion
through its published port, stops one worker container (it must drain and exit
0) and sees its lease expire, and runs `down -v`, after which no container,
network or volume of the project may remain. Progress goes to
stderr; stdout gets one JSON summary (timings, image sizes).

Exit status: 0 passed; 1 failed; 77 (the automake "skipped" code) when this
machine cannot run containers at all (container_engine.EngineUnavailable),
which .ci/run reports as a skip rather than a failure of ortserve.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import yaml

from devtools.container_engine import (
    Engine,
    EngineUnavailable,
    HealthcheckRunner,
    base_image,
    open_engine,
    say,
    smoke_test,
)

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "ortserve-compose-test"
GRPCURL = Path(sys.executable).parent / "grpcurl"
# Small enough that a long request is capped: 32 MiB is ~700 tokens of SmolLM2-135M fp32.
WORKER_KV_BUDGET = "32MiB"
LEASE_TTL_S = 10  # compose.yaml's ORTSERVE_SCHEDULER_LEASE_TTL_S


def documented_commands() -> list[list[str]]:
    """The README's compose commands, as argv lists (lines starting with `docker`)."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- compose-commands -->\s*```(?:bash|sh)?\n(.*?)```", text, re.S)
    if block is None:
        raise RuntimeError("README.md lost its compose-commands block")
    return [shlex.split(line.split("#", 1)[0]) for line in block.group(1).splitlines()
            if line.startswith("docker ")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def grpcurl(port: int, method: str, body: dict | None = None) -> list[dict]:
    """One call through the published port; the JSON documents it printed."""
    argv = [str(GRPCURL), "-plaintext", "-max-time", "300"]
    if body is not None:
        argv += ["-d", json.dumps(body)]
    argv += [f"127.0.0.1:{port}", method]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=320)
    if result.returncode != 0:
        raise RuntimeError(f"grpcurl {method} failed: {result.stderr.strip()}")
    if method == "list":
        return [{"service": s} for s in result.stdout.split()]
    return [json.loads(doc) for doc in re.split(r"(?<=})\n(?={)", result.stdout.strip())]


def expect(condition: object, detail: object) -> None:
    """An assertion that `python -O` keeps: a failed check raises, naming what was seen."""
    if not condition:
        raise AssertionError(detail)


def wait_for(what: str, probe, timeout_s: float, interval_s: float = 1.0):
    """Poll probe() until it returns something truthy; its value, or TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last = probe()
            if last:
                return last
        except Exception as error:  # noqa: BLE001 - a probe failing is "not yet"
            last = error
        time.sleep(interval_s)
    raise TimeoutError(f"{what}: not within {timeout_s:.0f} s (last: {last!r})")


class Cluster:
    """The compose project: containers, their health, and `down`."""

    def __init__(self, engine: Engine, compose_argv: list[str], env: dict[str, str]):
        self.engine, self.env = engine, env
        # everything before `up`: the files and profiles the documented command names
        self.prefix = compose_argv[:compose_argv.index("up")]

    def compose(self, *args: str, timeout_s: float = 900) -> subprocess.CompletedProcess:
        result = subprocess.run([*self.engine.compose, *self.prefix, *args], env=self.env,
                                cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
        if result.returncode != 0:
            raise RuntimeError(f"compose {' '.join(args)} failed:\n{result.stderr[-4000:]}")
        return result

    def containers(self, service: str | None = None, all_states: bool = False) -> list[dict]:
        # IDs only: `ps --format json` differs between Docker and podman
        args = ["ps", "--format", "{{.ID}}", "--filter", f"label=com.docker.compose.project={PROJECT}"]
        if service:
            args += ["--filter", f"label=com.docker.compose.service={service}"]
        if all_states:
            args.append("--all")
        return [self.engine.inspect(ref) for ref in self.engine(*args).stdout.split()]

    def health(self, container: dict) -> str:
        state = container["State"]
        return (state.get("Health") or state.get("Healthcheck") or {}).get("Status", "none")

    def logs(self) -> str:
        try:
            return self.compose("logs", "--no-color", timeout_s=120).stdout[-8000:]
        except (RuntimeError, subprocess.TimeoutExpired) as error:
            return f"(no logs: {error})"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.parse_args(argv)
    t_start = time.monotonic()
    summary: dict = {"project": PROJECT}
    try:
        engine = open_engine()
    except EngineUnavailable as error:
        say(f"SKIPPED: {error}")
        sys.exit(77)
    summary["engine"] = {"cli": engine.cli, "compose": " ".join(engine.compose),
                         "healthchecks_run_by": "engine" if engine.runs_healthchecks
                         else "devtools.container_engine.HealthcheckRunner (no systemd)"}
    try:
        run_scenario(engine, summary)
    except EngineUnavailable as error:
        say(f"SKIPPED: {error}")
        sys.exit(77)
    finally:
        engine.close()
    summary["total_s"] = round(time.monotonic() - t_start, 1)
    say(f"passed in {summary['total_s']:.0f} s")
    print(json.dumps(summary, indent=2))


def run_scenario(engine: Engine, summary: dict) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    revision = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True).stdout.strip() or "unknown"
    commands = documented_commands()
    builds = [c for c in commands if c[:2] == ["docker", "build"]]
    ups = [c for c in commands if c[:2] == ["docker", "compose"] and "up" in c]
    if not builds or len(ups) != 1:
        raise RuntimeError(f"README compose-commands: want docker build lines and one compose up, got {commands}")
    base = base_image(engine)
    smoke_test(engine, base)
    summary["base_image"] = base
    images: dict[str, dict] = {}
    for argv in builds:
        tag = argv[argv.index("-t") + 1]
        say(f"building {tag} on {base} (expected: 1-3 min the first time, seconds when cached)")
        t0 = time.monotonic()
        engine(*argv[1:2], *engine.build_flags, "--build-arg", f"BASE={base}",
               "--build-arg", f"ORTSERVE_VERSION={version}",
               "--build-arg", f"ORTSERVE_REVISION={revision}", *argv[2:], timeout_s=1800)
        labels = engine.inspect(tag, kind="image")["Config"].get("Labels") or {}
        images[tag] = {"build_s": round(time.monotonic() - t0, 1),
                       "size_mb": round(engine.image_size_bytes(tag) / 1e6),
                       "version_label": labels.get("org.opencontainers.image.version")}
        if images[tag]["version_label"] != version:
            raise RuntimeError(f"{tag}: version label {images[tag]['version_label']!r}, want {version}")
    summary["images"] = images
    # Rebuilds leave the previous ortserve images untagged; drop those (only ours).
    engine("image", "prune", "-f", "--filter", "label=org.opencontainers.image.title=ortserve",
           check=False)
    check_images(engine)

    port, gateway_port = free_port(), free_port()
    env = {**engine.env, "COMPOSE_PROJECT_NAME": PROJECT, "ORTSERVE_PORT": str(port),
           "ORTSERVE_GATEWAY_PORT": str(gateway_port), "ORTSERVE_WORKER_KV_BUDGET": WORKER_KV_BUDGET,
           "ORTSERVE_MODEL_CACHE": os.environ.get("ORTSERVE_MODEL_CACHE",
                                                  str(Path.home() / ".cache" / "ortserve"))}
    up = ups[0]
    cluster = Cluster(engine, up[2:], env)
    up_args = up[2 + len(cluster.prefix):]  # "up", "--scale", "worker-cpu=2"
    # A run killed before its `down` leaves the project behind: start from nothing.
    cluster.compose("down", "-v", "--remove-orphans", timeout_s=300)
    try:
        with HealthcheckRunner(engine, PROJECT):
            say(f"{' '.join(up)} -d (scheduler on 127.0.0.1:{port}, gateway on :{gateway_port})")
            t0 = time.monotonic()
            cluster.compose(up_args[0], "-d", *up_args[1:])
            wanted = {"scheduler": 1, "gateway": 1, "worker-cpu": 2}
            for service, count in wanted.items():
                wait_for(f"{count} healthy {service} container(s)", lambda s=service, n=count: len(
                    [c for c in cluster.containers(s) if cluster.health(c) == "healthy"]) == n, 300)
            summary["up_to_healthy_s"] = round(time.monotonic() - t0, 1)
            say(f"all healthy after {summary['up_to_healthy_s']:.0f} s")
            check_through_ports(cluster, port, gateway_port, summary)
    except Exception:
        say("failed; the project's logs:\n" + cluster.logs())
        raise
    finally:
        down(cluster, summary)


def check_images(engine: Engine) -> None:
    """What each built image promises: its HEALTHCHECK is compose's (kept through the
    build format), it runs as a non-root user with a writable home, and only the
    workers carry ONNX Runtime (the CPU package in the cpu image)."""
    services = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    probe = ("import importlib.metadata as m, os; d = {x.metadata['Name'].lower() for x in m.distributions()}; "
             "print(os.getuid(), os.access(os.path.expanduser('~'), os.W_OK), "
             "sorted(d & {'onnxruntime', 'onnxruntime-gpu', 'numpy', 'tokenizers'}))")
    for image, service, runtime in (("ortserve:scheduler", "scheduler", "[]"),
                                    ("ortserve:cpu", "worker-cpu", "['numpy', 'onnxruntime', 'tokenizers']")):
        inspected = engine.inspect(image, kind="image")  # podman: top-level; Docker: in Config
        check = inspected.get("Healthcheck") or inspected["Config"].get("Healthcheck") or {}
        if check.get("Test") != services[service]["healthcheck"]["test"]:
            raise RuntimeError(f"{image}: HEALTHCHECK {check.get('Test')} is not compose.yaml's "
                               f"{services[service]['healthcheck']['test']}")
        uid, home_writable, found = engine("run", "--rm", "--entrypoint", "python3", image, "-c", probe,
                                           timeout_s=120).stdout.strip().split(None, 2)
        if uid == "0" or home_writable != "True" or found != runtime:
            raise RuntimeError(f"{image}: uid {uid}, home writable {home_writable}, carries {found}; "
                               f"want non-root, a writable home and {runtime}")


def check_through_ports(cluster: Cluster, port: int, gateway_port: int, summary: dict) -> None:
    services = {d["service"] for d in grpcurl(port, "list")}
    expect({"ortserve.v1.Scheduler", "grpc.health.v1.Health"} <= services, services)
    def budget_with_two_workers() -> dict | None:
        budget = grpcurl(port, "ortserve.v1.Scheduler/GetBudget", {})[0]
        return budget if len(budget.get("workers", [])) == 2 else None

    budget = wait_for("both workers in GetBudget", budget_with_two_workers, 120)
    summary["workers"] = [w["worker_id"] for w in budget["workers"]]
    say(f"GetBudget: workers {summary['workers']}")

    question = {"chat": {"messages": [{"role": "user", "content":
                "What is the capital of France? Answer in one sentence."}]}}
    events = grpcurl(port, "ortserve.v1.Scheduler/Generate", {**question, "max_new_tokens": 24})
    text = "".join(e["chunk"].get("text", "") for e in events if "chunk" in e)
    expect(events[0]["admission"]["decision"] == "ADMITTED", events[0])
    expect("Paris" in text and "finished" in events[-1], events)
    summary["generation"] = {"text": text, "finish": events[-1]["finished"].get("finish_reason")}
    say(f"Generate: {text!r}")

    # More than a worker's 32 MiB holds: capped to what fits, said before the first token.
    worker = budget["workers"][0]
    asked = int(worker["capacity_bytes"]) // int(worker["bytes_per_token"]) + 500
    events = grpcurl(port, "ortserve.v1.Scheduler/Generate",
                     {**question, "max_new_tokens": asked, "stop": ["."]})
    admission = events[0]["admission"]
    cap = admission.get("budget_cap", {})
    expect(admission["decision"] == "CAPPED", admission)
    expect(int(cap["requested_max_new_tokens"]) == asked > int(cap["admitted_max_new_tokens"]), cap)
    expect(events[-1]["finished"]["budget_cap"] == cap, events[-1])
    summary["capped"] = {"requested_max_new_tokens": asked,
                         "admitted_max_new_tokens": int(cap["admitted_max_new_tokens"]),
                         "reason": cap["reason"]}
    say(f"CAPPED: {asked} -> {cap['admitted_max_new_tokens']} ({cap['reason']})")

    models = json.load(urllib.request.urlopen(f"http://127.0.0.1:{gateway_port}/v1/models", timeout=10))
    expect(models["data"] and models["data"][0]["ortserve"]["workers"] == 2, models)
    request = urllib.request.Request(
        f"http://127.0.0.1:{gateway_port}/v1/chat/completions", headers={"content-type": "application/json"},
        data=json.dumps({"model": models["data"][0]["id"], "max_tokens": 24, "temperature": 0, "messages": [
            {"role": "user", "content": "What is the capital of France? Answer in one sentence."}]}).encode())
    completion = json.load(urllib.request.urlopen(request, timeout=120))
    expect("Paris" in completion["choices"][0]["message"]["content"], completion)
    say(f"gateway: {completion['choices'][0]['message']['content']!r}")
    budget = grpcurl(port, "ortserve.v1.Scheduler/GetBudget", {})[0]
    # every stream released its lease (grpcurl omits zero fields; the capacity shows the names match)
    expect(int(budget["total_capacity_bytes"]) == 2 * int(worker["capacity_bytes"]), budget)
    expect(int(budget.get("total_reserved_bytes", 0)) == 0 and not budget.get("total_leases"), budget)

    # Stop one worker container: it stops heartbeating, and its registration expires.
    victim = cluster.containers("worker-cpu")[0]
    gone = f"{victim['Config']['Hostname']}-50052"  # the default worker_id: <hostname>-<port>
    expect(gone in summary["workers"], (gone, summary["workers"]))
    t0 = time.monotonic()
    cluster.engine("stop", victim["Id"], timeout_s=120)
    stopped = cluster.engine.inspect(victim["Id"])["State"]
    summary["worker_stop"] = {"s": round(time.monotonic() - t0, 1), "exit_code": stopped["ExitCode"]}
    say(f"stopped {victim['Name']}: exit {stopped['ExitCode']} after {summary['worker_stop']['s']} s")
    # SIGTERM drains and exits 0; 137 would be the engine's SIGKILL (a grace period too short).
    expect(stopped["ExitCode"] == 0, f"{victim['Name']} was killed, not stopped: {stopped}")

    def registered_without_victim() -> list[str] | None:
        ids = [w["worker_id"] for w in grpcurl(port, "ortserve.v1.Scheduler/GetBudget", {})[0]["workers"]]
        return None if gone in ids else ids

    left = wait_for(f"{gone} to leave GetBudget", registered_without_victim, 3 * LEASE_TTL_S + 30)
    summary["worker_stop_to_expiry_s"] = round(time.monotonic() - t0, 1)
    expect(len(left) == 1, left)
    say(f"{gone} expired {summary['worker_stop_to_expiry_s']:.0f} s after `stop`; left: {left}")


def down(cluster: Cluster, summary: dict) -> None:
    say("down -v")
    cluster.compose("down", "-v", "--remove-orphans", timeout_s=300)
    leftovers = {
        "containers": [c["Name"] for c in cluster.containers(all_states=True)],
        "networks": [n for n in cluster.engine("network", "ls", "--format", "{{.Name}}").stdout.split()
                     if n.startswith(PROJECT)],
        "volumes": [v for v in cluster.engine("volume", "ls", "--format", "{{.Name}}").stdout.split()
                    if v.startswith(PROJECT)],
    }
    summary["left_after_down"] = leftovers
    if any(leftovers.values()):
        raise RuntimeError(f"`down -v` left {leftovers}")


if __name__ == "__main__":
    main()
