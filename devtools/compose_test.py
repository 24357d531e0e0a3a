"""`make compose-test`: compose.yaml in real containers, driven from outside as a user would.

  .venv/bin/python -m devtools.compose_test   (make compose-test)

Runs the documented compose commands (the README's compose-commands block and
docs/operations/compose.md's compose-tls-commands block; `docker` becomes this machine's engine, see
devtools/container_engine.py) and checks the clusters only through their
published ports:

1. Builds the scheduler and cpu images and checks what each promises
   (HEALTHCHECK as compose's, a non-root user with a writable home, ONNX
   Runtime only in the worker).
2. The cpu profile with two workers, the model volume seeded from the host
   cache: grpcurl lists the services (reflection) and generates; a request for
   more tokens than a worker's 32 MiB KV budget holds is CAPPED before the
   first token and in the result; GetBudget shows both workers and nothing
   reserved afterwards; the gateway lists the model and answers a chat
   completion; one worker container is stopped (it must drain and exit 0) and
   leaves GetBudget (it deregisters at the end of its drain).
3. The same with compose.tls.yaml and one worker: certificates and an API key
   made for the run, TLS on every channel, mutual TLS to the worker, health
   checks over TLS; grpcurl with the CA lists without a key, is refused
   GetBudget without one, generates with it; the gateway dials the scheduler
   over TLS and answers a caller with the key, refuses one without.
After each, `down -v` must leave no container, network or volume of the
project. Progress goes to stderr; stdout gets one JSON summary.

Exit status: 0 passed; 1 failed; 77 (the automake "skipped" code) when this
machine cannot run containers at all (container_engine.EngineUnavailable),
which .ci/run reports as a skip rather than a failure of ortserve.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import ssl
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from devtools.compose_cluster import (
    ROOT,
    Cluster,
    documented_commands,
    expect,
    free_port,
    grpcurl,
    wait_for,
)
from devtools.container_engine import (
    ContainerEngine,
    EngineUnavailable,
    base_image,
    open_engine,
    say,
    smoke_test,
)

PROJECT = "ortserve-compose-test"
# Small enough that a long request is capped: 32 MiB is ~700 tokens of SmolLM2-135M fp32.
WORKER_KV_CAPACITY = "32MiB"
LEASE_TTL_S = 10  # compose.yaml's ORTSERVE_SCHEDULER_LEASE_TTL_S
API_KEY = "generate-compose-test-0123456789"
FRANCE = "What is the capital of France? Answer in one sentence."
IMAGE_UID = 10001  # the Dockerfile's service user
# pip's words for "no connection at all" (never for a wrong pin or a broken Dockerfile)
NO_NETWORK = ("Failed to establish a new connection", "Temporary failure in name resolution",
              "Network is unreachable", "ProxyError", "CERTIFICATE_VERIFY_FAILED")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.parse_args(argv)
    t_start = time.monotonic()
    summary: dict = {"project": PROJECT}
    try:
        engine = open_engine()
        try:
            run_all(engine, summary)
        finally:
            engine.close()
    except EngineUnavailable as error:
        say(f"SKIPPED: {error}")
        sys.exit(77)
    summary["total_s"] = round(time.monotonic() - t_start, 1)
    say(f"passed in {summary['total_s']:.0f} s")
    print(json.dumps(summary, indent=2))


def run_all(engine: ContainerEngine, summary: dict) -> None:
    summary["engine"] = {"cli": engine.cli, "compose": " ".join(engine.compose),
                         "healthchecks_run_by": "engine" if engine.runs_healthchecks
                         else "devtools.container_engine.HealthcheckRunner (no systemd)"}
    build_images(engine, summary)
    run_cluster(engine, "compose-commands", PROJECT, {}, {"worker-cpu": 2},
                check_plain_cluster, summary.setdefault("plain", {}))
    with tempfile.TemporaryDirectory(prefix="ortserve-secrets-") as secrets:
        make_secrets(Path(secrets))
        run_cluster(engine, "compose-tls-commands", f"{PROJECT}-tls",
                    {"ORTSERVE_SECRETS_DIR": secrets,
                     "ORTSERVE_WORKER_ADVERTISE_ADDRESS": "worker-cpu:50052"},
                    {"worker-cpu": 1}, functools.partial(check_tls_cluster, secrets=secrets),
                    summary.setdefault("tls", {}))


def build_images(engine: ContainerEngine, summary: dict) -> None:
    """The README's `docker build` lines on this machine's base, with the version labels."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    revision = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True).stdout.strip() or "unknown"
    builds = [c for c in documented_commands("compose-commands") if c[:2] == ["docker", "build"]]
    expect(builds, "README compose-commands has no docker build line")
    base = base_image(engine)
    smoke_test(engine, base)
    summary["base_image"] = base
    images: dict[str, dict] = {}
    for argv in builds:
        tag = argv[argv.index("-t") + 1]
        say(f"building {tag} on {base} (expected: 1-3 min the first time, seconds when cached)")
        t0 = time.monotonic()
        try:
            engine(*argv[1:2], *engine.build_flags, "--build-arg", f"BASE={base}",
                   "--build-arg", f"ORTSERVE_VERSION={version}",
                   "--build-arg", f"ORTSERVE_REVISION={revision}", *argv[2:], timeout_s=1800)
        except RuntimeError as error:
            # pip inside the build could not connect at all: the machine, not the Dockerfile
            if any(marker in str(error) for marker in NO_NETWORK):
                raise EngineUnavailable(f"building {tag}: containers here cannot reach the "
                                        f"package registry: {error}") from error
            raise
        labels = engine.inspect(tag, kind="image")["Config"].get("Labels") or {}
        images[tag] = {"build_s": round(time.monotonic() - t0, 1),
                       "size_mb": round(engine.image_size_bytes(tag) / 1e6),
                       "version_label": labels.get("org.opencontainers.image.version")}
        expect(images[tag]["version_label"] == version,
               f"{tag}: version label {images[tag]['version_label']!r}, want {version}")
    summary["images"] = images
    # Rebuilds leave the previous ortserve images untagged; drop those (only ours).
    engine("image", "prune", "-f", "--filter", "label=org.opencontainers.image.title=ortserve",
           check=False)
    check_images(engine)


def run_cluster(engine: ContainerEngine, marker: str, project: str, env: dict[str, str],
                workers: dict[str, int], check, summary: dict) -> None:
    """Bring up the documented block's one `compose ... up` command, run `check` through the
    published ports, then `down -v` (always), which must leave nothing."""
    ups = [c for c in documented_commands(marker) if c[:2] == ["docker", "compose"] and "up" in c]
    expect(len(ups) == 1, f"{marker}: want one docker compose ... up line, got {ups}")
    port, gateway_port = free_port(), free_port()
    cluster = Cluster(engine, project, ups[0], {
        **env, "ORTSERVE_PORT": str(port), "ORTSERVE_GATEWAY_PORT": str(gateway_port),
        "ORTSERVE_WORKER_KV_CAPACITY": WORKER_KV_CAPACITY,
        "ORTSERVE_MODEL_CACHE": os.environ.get("ORTSERVE_MODEL_CACHE",
                                               str(Path.home() / ".cache" / "ortserve"))})
    try:
        summary["up_to_healthy_s"] = cluster.up({"scheduler": 1, "gateway": 1, **workers})
        say(f"all healthy after {summary['up_to_healthy_s']:.0f} s (scheduler on 127.0.0.1:{port}, "
            f"gateway on :{gateway_port})")
        check(cluster, port, gateway_port, summary)
    except Exception:
        say("failed; the project's logs:\n" + cluster.logs())
        raise
    finally:
        summary["left_after_down"] = cluster.down()


def make_secrets(folder: Path) -> None:
    """compose.tls.yaml's files: a CA, the scheduler's certificate (the names it is dialed
    by: `scheduler`, and 127.0.0.1 for its health check and the published port), the
    worker's (`worker-cpu`, its advertised name, and 127.0.0.1), and keys.txt. Readable by
    the images' user, as docs/operations/compose.md asks of a real secrets folder."""
    from tests.certs import make_certs  # trustme: a dev dependency, like this whole module

    make_certs(folder, scheduler_hosts=("scheduler", "127.0.0.1", "localhost"),
               worker_hosts=("worker-cpu", "127.0.0.1"),
               gateway_hosts=("gateway", "127.0.0.1", "localhost"))
    (folder / "keys.txt").write_text(f"generate:{API_KEY}\n")
    for path in [folder, *folder.iterdir()]:
        if os.geteuid() == 0:
            os.chown(path, IMAGE_UID, IMAGE_UID)
        else:  # cannot give it away: world-readable, in a folder only this run knows
            path.chmod(0o755 if path.is_dir() else 0o644)


def check_images(engine: ContainerEngine) -> None:
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


def check_plain_cluster(cluster: Cluster, port: int, gateway_port: int, summary: dict) -> None:
    """Two workers, no TLS: reflection, a generation, a cap, the gateway, a stopped worker."""
    services = {d["service"] for d in grpcurl(port, "list")}
    expect({"ortserve.v1.Scheduler", "grpc.health.v1.Health"} <= services, services)
    def budget_with_two_workers() -> dict | None:
        budget = grpcurl(port, "ortserve.v1.Scheduler/GetBudget", {})[0]
        return budget if len(budget.get("workers", [])) == 2 else None

    budget = wait_for("both workers in GetBudget", budget_with_two_workers, 120)
    summary["workers"] = [w["worker_id"] for w in budget["workers"]]
    say(f"GetBudget: workers {summary['workers']}")

    question = {"chat": {"messages": [{"role": "user", "content": FRANCE}]}}
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
    completion = gateway_chat(gateway_port)
    expect("Paris" in completion["choices"][0]["message"]["content"], completion)
    say(f"gateway: {completion['choices'][0]['message']['content']!r}")
    budget = grpcurl(port, "ortserve.v1.Scheduler/GetBudget", {})[0]
    # every stream released its lease (grpcurl omits zero fields; the capacity shows the names match)
    expect(int(budget["total_capacity_bytes"]) == 2 * int(worker["capacity_bytes"]), budget)
    expect(int(budget.get("total_reserved_bytes", 0)) == 0 and not budget.get("total_leases"), budget)

    # Stop one worker container: it drains, deregisters and exits (were it killed, its
    # registration would expire after the lease TTL instead: the wait allows for both).
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
    say(f"{gone} left GetBudget {summary['worker_stop_to_expiry_s']:.0f} s after `stop`; "
        f"left: {left}")


def check_tls_cluster(cluster: Cluster, port: int, gateway_port: int, summary: dict,
                      secrets: str) -> None:
    """compose.tls.yaml: TLS everywhere, keys required, the gateway over TLS."""
    tls = ("-cacert", os.path.join(secrets, "ca.pem"))
    key = ("-H", f"authorization: Bearer {API_KEY}")
    services = {d["service"] for d in grpcurl(port, "list", tls=tls)}  # reflection: no key
    expect("ortserve.v1.Scheduler" in services, services)
    refused = grpcurl(port, "ortserve.v1.Scheduler/GetBudget", {}, tls=tls, check=False)
    expect(refused.returncode != 0 and "Unauthenticated" in refused.stderr, refused.stderr)
    plaintext = grpcurl(port, "list", check=False)
    expect(plaintext.returncode != 0, f"a plaintext call got through: {plaintext.stdout}")
    budget = grpcurl(port, "ortserve.v1.Scheduler/GetBudget", {}, tls=tls + key)[0]
    expect([w["address"] for w in budget.get("workers", [])] == ["worker-cpu:50052"], budget)
    events = grpcurl(port, "ortserve.v1.Scheduler/Generate",
                     {"chat": {"messages": [{"role": "user", "content": FRANCE}]},
                      "max_new_tokens": 24}, tls=tls + key)
    text = "".join(e["chunk"].get("text", "") for e in events if "chunk" in e)
    expect("Paris" in text and "finished" in events[-1], events)
    say(f"TLS Generate (grpcurl -cacert, with the key): {text!r}")
    summary["generation"] = text

    # The gateway serves HTTPS with gateway.pem; a caller trusts ca.pem.
    https = ssl.create_default_context(cafile=os.path.join(secrets, "ca.pem"))
    health = json.load(urllib.request.urlopen(f"https://127.0.0.1:{gateway_port}/health",
                                              timeout=10, context=https))
    expect(health.get("tls") is True and health.get("status") == "ok", health)
    completion = gateway_chat(gateway_port, API_KEY, https)
    expect("Paris" in completion["choices"][0]["message"]["content"], completion)
    say(f"TLS gateway (HTTPS, with the key): {completion['choices'][0]['message']['content']!r}")
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{gateway_port}/health", timeout=10)
        raise AssertionError("the TLS gateway answered plain HTTP")
    except urllib.error.HTTPError as error:
        raise AssertionError(f"the TLS gateway answered plain HTTP {error.code}") from None
    except (urllib.error.URLError, ConnectionError):
        pass  # refused: no TLS handshake
    try:
        gateway_chat(gateway_port, "not-the-key", https)
        raise AssertionError("the gateway answered a caller with a wrong key")
    except urllib.error.HTTPError as error:
        expect(error.code == 401, f"a wrong key got HTTP {error.code}, want 401")


def gateway_chat(gateway_port: int, api_key: str | None = None,
                 https: ssl.SSLContext | None = None) -> dict:
    """One chat completion through the gateway's published port (greedy, 24 tokens); over
    HTTPS with `https` (the context trusting the gateway's CA)."""
    base = f"{'https' if https else 'http'}://127.0.0.1:{gateway_port}"
    models = json.load(urllib.request.urlopen(urllib.request.Request(
        f"{base}/v1/models",
        headers={"authorization": f"Bearer {api_key}"} if api_key else {}), timeout=10,
        context=https))
    expect(models["data"], models)
    request = urllib.request.Request(
        f"{base}/v1/chat/completions",
        headers={"content-type": "application/json",
                 **({"authorization": f"Bearer {api_key}"} if api_key else {})},
        data=json.dumps({"model": models["data"][0]["id"], "max_tokens": 24, "temperature": 0,
                         "messages": [{"role": "user", "content": FRANCE}]}).encode())
    return json.load(urllib.request.urlopen(request, timeout=120, context=https))


if __name__ == "__main__":
    main()
