"""A container engine to build ortserve's images and run compose.yaml: Docker, or podman.

Docker (a daemon that answers `docker info`) is used as it is, with `docker
compose` (or a standalone `docker-compose`). Without it, podman, set up for a
machine with no systemd and no Docker Hub access (this project's CI machines):

- `podman system service` serves the Docker API on a socket under STATE_DIR,
  and docker-compose talks to it (podman-compose 1.0 has no `--profile`);
- podman schedules health checks with systemd timers; without systemd they
  never run and `depends_on: service_healthy` waits forever, so
  `HealthcheckRunner` runs `podman healthcheck run` on each container at the
  compose interval instead (what the timer would do);
- containers.conf sets `default_ulimits = []`: podman's default raises
  RLIMIT_NOFILE above what an unprivileged sandbox allows, and every
  container start fails;
- builds use `--format docker` (the OCI format drops HEALTHCHECK) and mount
  the host's CA bundle over the image's for RUN steps, so pip works behind a
  TLS-inspecting proxy whose CA only the host trusts;
- the base image, when python:3.11-slim-bookworm is not present locally, is
  Debian 12 made with debootstrap (python3, python3-venv, ca-certificates):
  the Dockerfile accepts any Debian-based Python 3.11 base.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

STATE_DIR = Path(os.environ.get("ORTSERVE_ENGINE_STATE", "/tmp/ortserve-engine"))
DEFAULT_BASE = "python:3.11-slim-bookworm"
DEBOOTSTRAP_BASE = "localhost/ortserve-base:bookworm"
HEALTHCHECK_INTERVAL_S = 5.0  # compose.yaml's interval


class EngineUnavailable(RuntimeError):
    """This machine cannot run containers (no engine, no way to install one, or a
    container cannot start): a fact about the machine, not about ortserve."""


def say(message: str) -> None:
    print(f"compose-test: {message}", file=sys.stderr, flush=True)


def run(argv: list[str], *, env: dict[str, str] | None = None, check: bool = True,
        timeout_s: float = 600) -> subprocess.CompletedProcess:
    """Run a command; on failure raise with its output (the part that says why)."""
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s)
    if check and result.returncode != 0:
        detail = (result.stderr or result.stdout or "").strip()[-4000:]
        raise RuntimeError(f"`{' '.join(argv)}` failed (exit {result.returncode})\n{detail}")
    return result


@dataclass
class ContainerEngine:
    cli: str                       # "docker" or "podman"
    compose: list[str]             # the compose command, before its arguments
    env: dict[str, str]            # the environment every engine and compose call gets
    build_flags: list[str] = field(default_factory=list)
    runs_healthchecks: bool = True  # False: a HealthcheckRunner must run them
    _service: subprocess.Popen | None = None

    def __call__(self, *args: str, check: bool = True, timeout_s: float = 600
                 ) -> subprocess.CompletedProcess:
        return run([self.cli, *args], env=self.env, check=check, timeout_s=timeout_s)

    def image_exists(self, image: str) -> bool:
        return self("image", "inspect", image, check=False).returncode == 0

    def inspect(self, ref: str, kind: str = "container") -> dict:
        return json.loads(self(kind, "inspect", ref).stdout)[0]

    def image_size_bytes(self, image: str) -> int:
        return int(self("image", "inspect", "--format", "{{.Size}}", image).stdout.strip())

    def close(self) -> None:
        if self._service is not None:
            self._service.terminate()
            self._service.wait(timeout=30)


def _docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0


def _apt_install(*packages: str) -> None:
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise EngineUnavailable(f"{', '.join(packages)} missing; install them (Debian: apt-get "
                                f"install {' '.join(packages)}) or run with Docker")
    say(f"installing {', '.join(packages)} with apt-get (expected: about a minute)")
    try:
        run(["apt-get", "update", "-qq"], timeout_s=600)
        run(["apt-get", "install", "-y", "-qq", *packages],
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, timeout_s=900)
    except RuntimeError as error:
        raise EngineUnavailable(str(error)) from error


def _compose_command(env: dict[str, str], plugin_first: bool) -> list[str]:
    """`docker compose` (the plugin) or a standalone docker-compose, installed if neither is."""
    plugin = shutil.which("docker") is not None and subprocess.run(
        ["docker", "compose", "version"], env=env, capture_output=True).returncode == 0
    if plugin and plugin_first:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if plugin:
        return ["docker", "compose"]
    _apt_install("docker-compose")
    return ["docker-compose"]


def open_engine() -> ContainerEngine:
    """Docker when a daemon answers, else podman behind its Docker API socket."""
    if _docker_answers():
        env = dict(os.environ)
        return ContainerEngine("docker", _compose_command(env, plugin_first=True), env)
    if shutil.which("podman") is None:
        _apt_install("podman")
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    conf = STATE_DIR / "containers.conf"
    conf.write_text("[containers]\ndefault_ulimits = []\n")
    socket = STATE_DIR / "podman.sock"
    socket.unlink(missing_ok=True)
    env = {**os.environ, "CONTAINERS_CONF": str(conf), "DOCKER_HOST": f"unix://{socket}"}
    log = open(STATE_DIR / "podman-service.log", "ab")  # noqa: SIM115 - lives as long as the service
    service = subprocess.Popen(["podman", "system", "service", "--time=0", f"unix://{socket}"],
                               env=env, stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + 30
    while not socket.exists():
        if service.poll() is not None or time.monotonic() > deadline:
            raise EngineUnavailable(f"podman system service did not start; see {log.name}")
        time.sleep(0.1)
    build_flags = ["--format", "docker"]
    if Path("/etc/ssl/certs").is_dir():
        build_flags += ["-v", "/etc/ssl/certs:/etc/ssl/certs:ro"]
    # the standalone one first: the plugin talks to podman's socket only through the docker CLI
    return ContainerEngine("podman", _compose_command(env, plugin_first=False), env, build_flags,
                  runs_healthchecks=Path("/run/systemd/system").is_dir(), _service=service)


def base_image(engine: ContainerEngine) -> str:
    """ORTSERVE_IMAGE_BASE; else python:3.11-slim-bookworm (Docker pulls it); else, for
    podman without it locally, a debootstrapped Debian 12 (made once, then reused)."""
    chosen = os.environ.get("ORTSERVE_IMAGE_BASE")
    if chosen:
        return chosen
    if engine.cli == "docker" or engine.image_exists(DEFAULT_BASE):
        return DEFAULT_BASE
    if engine.image_exists(DEBOOTSTRAP_BASE):
        return DEBOOTSTRAP_BASE
    if shutil.which("debootstrap") is None:
        _apt_install("debootstrap")
    rootfs = STATE_DIR / "rootfs"
    shutil.rmtree(rootfs, ignore_errors=True)
    say(f"making the base image {DEBOOTSTRAP_BASE} with debootstrap (expected: about a minute)")
    mirror = [os.environ["ORTSERVE_DEBIAN_MIRROR"]] if os.environ.get("ORTSERVE_DEBIAN_MIRROR") else []
    try:
        run(["debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates",
             "bookworm", str(rootfs), *mirror], timeout_s=1200)
    except RuntimeError as error:
        raise EngineUnavailable(f"no base image: {error}") from error
    # What slim images drop too: apt's package cache and lists, docs, man pages and
    # translations (140 of 275 MB); nothing at run time reads them.
    for junk in ("var/cache/apt", "var/lib/apt/lists", "usr/share/doc", "usr/share/man",
                 "usr/share/locale", "usr/share/info"):
        shutil.rmtree(rootfs / junk, ignore_errors=True)
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    imported = subprocess.run([engine.cli, "import", "-", DEBOOTSTRAP_BASE], env=engine.env,
                              stdin=tar.stdout, capture_output=True, text=True, timeout=600)
    if tar.wait() != 0 or imported.returncode != 0:
        raise RuntimeError(f"importing {rootfs} as {DEBOOTSTRAP_BASE} failed: {imported.stderr}")
    shutil.rmtree(rootfs, ignore_errors=True)
    return DEBOOTSTRAP_BASE


def smoke_test(engine: ContainerEngine, image: str) -> None:
    """One container started from `image`, or EngineUnavailable saying why not."""
    try:
        engine("run", "--rm", image, "python3", "-c", "print('ok')", timeout_s=120)
    except RuntimeError as error:
        raise EngineUnavailable(f"{engine.cli} cannot start a container here: {error}") from error


class HealthcheckRunner(threading.Thread):
    """Runs each running container's health check of one compose project, every interval.

    Stands in for the systemd timers podman uses; a no-op where the engine runs them."""

    def __init__(self, engine: ContainerEngine, project: str,
                 interval_s: float = HEALTHCHECK_INTERVAL_S):
        super().__init__(daemon=True, name="healthchecks")
        self._engine, self._project, self._interval_s = engine, project, interval_s
        self._stop = threading.Event()

    def run(self) -> None:
        while not self._stop.wait(self._interval_s):
            listed = self._engine("ps", "--filter", f"label=com.docker.compose.project={self._project}",
                                  "--format", "{{.Names}}", check=False, timeout_s=60)
            for name in listed.stdout.split():
                self._engine("healthcheck", "run", name, check=False, timeout_s=60)

    def start_if_needed(self) -> HealthcheckRunner:
        if not self._engine.runs_healthchecks:
            self.start()
        return self

    def stop(self) -> None:
        self._stop.set()
