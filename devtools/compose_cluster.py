"""One compose project seen from outside: the documented commands, grpcurl, health, `down`.

The pieces devtools/compose_test.py drives its scenarios with; nothing here
knows what a scenario checks.
"""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

from devtools.container_engine import ContainerEngine, HealthcheckRunner, say

ROOT = Path(__file__).resolve().parent.parent
GRPCURL = Path(sys.executable).parent / "grpcurl"


# Where each tested block is written: the README keeps the one compose example a
# newcomer runs; the TLS variant lives with the rest of the compose reference.
DOCUMENTED_IN = {"compose-commands": "README.md", "compose-tls-commands": "docs/operations/compose.md"}


def documented_commands(marker: str) -> list[list[str]]:
    """The block after `<!-- marker -->` in its page (DOCUMENTED_IN): its `docker ...`
    lines as argv lists."""
    page = DOCUMENTED_IN[marker]
    text = (ROOT / page).read_text()
    block = re.search(rf"<!-- {marker} -->\s*```(?:bash|sh)?\n(.*?)```", text, re.S)
    if block is None:
        raise RuntimeError(f"{page} lost its {marker} block")
    return [shlex.split(line.split("#", 1)[0]) for line in block.group(1).splitlines()
            if line.startswith("docker ")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def grpcurl(port: int, method: str, body: dict | None = None, tls: tuple[str, ...] = ("-plaintext",),
            check: bool = True) -> list[dict] | subprocess.CompletedProcess:
    """One call through the published port: the JSON documents it printed (`list`: the
    service names), or with check=False the finished process, to read a refusal."""
    argv = [str(GRPCURL), *tls, "-max-time", "300"]
    if body is not None:
        argv += ["-d", json.dumps(body)]
    argv += [f"127.0.0.1:{port}", method]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=320)
    if not check:
        return result
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
    """A compose project started by one documented `... up ...` command."""

    def __init__(self, engine: ContainerEngine, project: str, up_command: list[str],
                 env: dict[str, str]):
        self.engine, self.project = engine, project
        self.env = {**engine.env, **env, "COMPOSE_PROJECT_NAME": project}
        self.up_command = up_command
        # between `docker compose` and `up`: the files and profiles; after it, its options
        at = up_command.index("up")
        self.prefix, self.up_options = up_command[2:at], up_command[at + 1:]
        self._healthchecks: HealthcheckRunner | None = None

    def compose(self, *args: str, timeout_s: float = 900) -> subprocess.CompletedProcess:
        result = subprocess.run([*self.engine.compose, *self.prefix, *args], env=self.env,
                                cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
        if result.returncode != 0:
            raise RuntimeError(f"compose {' '.join(args)} failed:\n{result.stderr[-4000:]}")
        return result

    def up(self, healthy: dict[str, int], timeout_s: float = 300) -> float:
        """The documented command, detached; waits until `healthy` (service -> how many
        containers) holds. A run killed before its `down` left the project behind: it
        is taken down first. Returns the seconds from `up` to healthy."""
        self.compose("down", "-v", "--remove-orphans", timeout_s=300)
        self._healthchecks = HealthcheckRunner(self.engine, self.project).start_if_needed()
        say(f"{' '.join(self.up_command)} -d")
        t0 = time.monotonic()
        self.compose("up", "-d", *self.up_options)
        for service, count in healthy.items():
            wait_for(f"{count} healthy {service} container(s)", lambda s=service, n=count: len(
                [c for c in self.containers(s) if self.health(c) == "healthy"]) == n, timeout_s)
        return round(time.monotonic() - t0, 1)

    def containers(self, service: str | None = None, all_states: bool = False) -> list[dict]:
        # IDs only: `ps --format json` differs between Docker and podman
        args = ["ps", "--format", "{{.ID}}",
                "--filter", f"label=com.docker.compose.project={self.project}"]
        if service:
            args += ["--filter", f"label=com.docker.compose.service={service}"]
        if all_states:
            args.append("--all")
        return [self.engine.inspect(ref) for ref in self.engine(*args).stdout.split()]

    @staticmethod
    def health(container: dict) -> str:
        state = container["State"]
        return (state.get("Health") or state.get("Healthcheck") or {}).get("Status", "none")

    def logs(self) -> str:
        try:
            return self.compose("logs", "--no-color", timeout_s=120).stdout[-8000:]
        except (RuntimeError, subprocess.TimeoutExpired) as error:
            return f"(no logs: {error})"

    def down(self) -> dict[str, list[str]]:
        """`down -v`; what of the project is left (nothing, or it raises)."""
        if self._healthchecks is not None:
            self._healthchecks.stop()
        say(f"down -v ({self.project})")
        self.compose("down", "-v", "--remove-orphans", timeout_s=300)
        def names(kind: str) -> list[str]:  # compose names them <project>_<name>
            listed = self.engine(kind, "ls", "--format", "{{.Name}}").stdout.split()
            return [n for n in listed if n.startswith(f"{self.project}_")]

        leftovers = {"containers": [c["Name"] for c in self.containers(all_states=True)],
                     "networks": names("network"), "volumes": names("volume")}
        if any(leftovers.values()):
            raise RuntimeError(f"`down -v` left {leftovers}")
        return leftovers
