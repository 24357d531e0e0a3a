"""The GPU proof, one call on a lent GPU machine: every result as JSON in one folder.

  python3 -m devtools.gpu.proof                      (on the device; $OUT is the folder)
  python -m devtools.gpu.proof --dry-run --out DIR   (anywhere: CPU, the tiny model)

On the device, in order of priority, each step a process with its own timeout and the whole
run stopping by --deadline-s (540 s: a device call may last 600):
  install     the bundle (make gpu-bundle's .gpu-b, and the part the stage call left in
              /tmp/stage) into --site, put first on PYTHONPATH: onnxruntime-gpu shadows the
              image's CPU onnxruntime
  env         GPU, driver, versions, a CUDA smoke test (retried with the nvidia-* wheels'
              lib folders on LD_LIBRARY_PATH when it fails without)
  build-*     random-weight fp16 `-e cuda` folders at the 135M and 1.2B shapes (shapes/), in
              the background while the first steps run
  cuda_check-smol, peers-smol, served-smol, cuda_check-b1, peers-b1
              `python -m worker_service.cuda_check` (its JSON kept as it prints it; a nonzero
              exit is recorded, not fatal); onnxruntime-genai's Generator and og.Engine at
              1 / 8 / 32 streams; scheduler + `--device cuda` worker + gateway asked plain,
              streamed and through the CLI
What comes back ($OUT, at most 8 files): proof.json (every step's outcome, the environment,
the install, the bundle's manifest), smol.json and b1.json (cuda_check, peers), served.json,
logs.txt (the tail of every step's log and the services' logs).

--dry-run: the same steps on the CPU with this Python and a built model folder (--model-dir,
default the tiny model of `make tiny-model`) standing for the shapes; install and build are
skipped (they need the bundle and a GPU image), cuda_check gets --dry-run, the worker
--device cpu, the peers --cpu (in --genai-python, where onnxruntime_genai imports).
tests/e2e/operations/test_gpu_proof_e2e.py runs it. Exit 0 when the run completed (the
steps' outcomes are in proof.json), 3 when the staged part is missing (run the stage call
again, then this at once). Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from devtools.gpu import install, manifest, steps

ROOT = Path(__file__).resolve().parents[2]
SHAPES = {"smol": ROOT / "devtools" / "gpu" / "shapes" / "smollm2-135m.json",
          "b1": ROOT / "devtools" / "gpu" / "shapes" / "llama-1.2b.json"}
DEADLINE_S = 540.0
# Planned seconds per step (the deadline shortens the later ones).
PLANNED_S = {"install": 90, "env": 45, "build": 300, "cuda_check": 150, "served": 100,
             "peers": 60}
BUILD_GRACE_S = 60  # a build is waited for no later than this before the deadline
# cuda_check stops its checks by its own --deadline-s and prints its JSON: it gets its step's
# timeout less this (its watchdog's grace and closing its engines), so the step's timeout
# never cuts its JSON off.
CUDA_CHECK_MARGIN_S = 30.0
LOG_TAIL_BYTES = 40_000


def say(message: str) -> None:
    print(f"gpu-proof: {message}", file=sys.stderr, flush=True)


@dataclass
class Proof:
    """The run's record: proof.json, rewritten after every step."""

    out: Path
    work: Path
    deadline: steps.Deadline
    dry_run: bool
    record: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.work / "logs").mkdir(parents=True, exist_ok=True)
        self.record = {"started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "dry_run": self.dry_run, "deadline_s": self.deadline.budget_s,
                       "python": sys.version.split()[0], "steps": []}

    @property
    def logs(self) -> Path:
        return self.work / "logs"

    def note(self, outcome: steps.StepOutcome, **extra) -> steps.StepOutcome:
        self.record["steps"].append({**outcome.to_json(), **extra,
                                     "at_s": round(self.deadline.elapsed_s(), 1)})
        say(f"{outcome.name}: {outcome.status}"
            f"{f' (exit {outcome.exit_code})' if outcome.exit_code not in (None, 0) else ''} "
            f"in {outcome.seconds} s{f'; {outcome.note}' if outcome.note else ''}; "
            f"{self.deadline.left_s():.0f} s left")
        self.save()
        return outcome

    def skip(self, name: str, why: str) -> None:
        self.note(steps.StepOutcome(name, "skipped", note=why))

    def save(self) -> None:
        write_json(self.out / "proof.json", self.record)

    def merge(self, file: str, key: str, value) -> None:
        """Set key in $OUT/file's JSON object (a run cut short keeps what it has)."""
        path = self.out / file
        data = read_json(path) if path.exists() else {}
        data[key] = value
        write_json(path, data)


def write_json(path: Path, data) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)


def read_json(path: Path):
    """The JSON in path, or what it holds as text when it is not JSON (kept, never lost)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        text = path.read_text(errors="replace") if path.exists() else ""
        return {"unreadable": f"{type(error).__name__}: {error}", "text_tail": text[-3000:]}


def run_json_step(proof: Proof, name: str, argv: list[str], planned_s: float, env: dict,
                  result: Path, stdout_is_result: bool = False):
    """Run a step that leaves a JSON result (in `result`, or on its stdout); returns
    (outcome, the parsed result or None)."""
    result.unlink(missing_ok=True)
    outcome = steps.run(name, argv, planned_s, proof.deadline, proof.logs, env,
                        stdout_path=result if stdout_is_result else None, cwd=ROOT)
    parsed = read_json(result) if result.exists() and result.stat().st_size else None
    proof.note(outcome)
    return outcome, parsed


def project_env(site: Path | None) -> dict[str, str]:
    """This process's environment with the bundle's site (if any) and the working tree first
    on PYTHONPATH, offline, unbuffered."""
    paths = ([str(site)] if site else []) + [str(ROOT), str(ROOT / "clients" / "python")]
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "PYTHONUNBUFFERED": "1",
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def install_step(proof: Proof, args, env: dict) -> int | None:
    """The bundle into args.site; the exit code to leave with when the stage is missing."""
    result = proof.work / "install.json"
    argv = [sys.executable, "-m", "devtools.gpu.install", "--bundle", str(args.bundle),
            "--site", str(args.site), "--result", str(result)]
    for stage in args.stage or []:
        argv += ["--stage", str(stage)]
    outcome, parsed = run_json_step(proof, "install", argv, PLANNED_S["install"], env, result)
    proof.record["install"] = parsed
    if outcome.exit_code == install.STAGE_MISSING:
        say("STAGE MISSING: " + "; ".join((parsed or {}).get("stage_missing", [])))
        proof.save()
        return install.STAGE_MISSING
    with_manifest = args.bundle / manifest.MANIFEST
    if with_manifest.exists():
        proof.record["bundle"] = read_json(with_manifest)
    return None


def env_step(proof: Proof, env: dict) -> dict:
    """Probe the environment; on the device, retry the smoke test with the CUDA wheels' lib
    folders on LD_LIBRARY_PATH. Returns the environment the later steps run in."""
    result = proof.work / "env.json"
    argv = [sys.executable, "-m", "devtools.gpu.probe_env", "--result", str(result)]
    if proof.dry_run:
        argv.append("--no-cuda")
    outcome, parsed = run_json_step(proof, "env", argv, PLANNED_S["env"], env, result)
    proof.record["env"] = parsed
    if outcome.status == "ok" or proof.dry_run:
        return env
    # ORT's preload_dlls looks for the CUDA libraries beside its own package (the site) and on
    # the loader's path; the image's copies are in its nvidia-* wheels' lib folders.
    try:
        dirs = subprocess.run([sys.executable, "-m", "devtools.gpu.probe_env",
                               "--nvidia-lib-dirs"], capture_output=True, text=True, env=env,
                              cwd=ROOT, timeout=30).stdout.strip()
    except subprocess.TimeoutExpired:
        dirs = ""
    if not dirs:
        return env
    retried = {**env, "LD_LIBRARY_PATH": os.pathsep.join(
        filter(None, [dirs, env.get("LD_LIBRARY_PATH", "")]))}
    outcome, parsed = run_json_step(proof, "env-retry", argv, PLANNED_S["env"], retried, result)
    proof.record["env_retry"] = parsed
    proof.record["ld_library_path_added"] = dirs
    return retried if outcome.status == "ok" else env


def start_builds(proof: Proof, args, env: dict) -> dict[str, steps.Running | steps.StepOutcome]:
    """Both shapes' builds in the background, each on half the cores."""
    half = str(max(1, (os.cpu_count() or 2) // 2))
    started = {}
    for name, shape in SHAPES.items():
        argv = [sys.executable, "-m", "devtools.gpu.build_model", "--shape", str(shape),
                "--tokenizer-dir", str(args.bundle / "tok"), "--out",
                str(proof.work / f"{name}-cuda")]
        started[name] = steps.start(f"build-{name}", argv, PLANNED_S["build"], proof.deadline,
                                    proof.logs, {**env, "OMP_NUM_THREADS": half}, cwd=ROOT)
    return started


def wait_build(proof: Proof, build: steps.Running | steps.StepOutcome) -> bool:
    if isinstance(build, steps.Running):
        end = proof.deadline.start + proof.deadline.budget_s - BUILD_GRACE_S
        build = build.wait(end)
    proof.note(build)
    return build.status == "ok"


def cuda_check_deadline_s(step_timeout_s: float | None) -> float:
    """cuda_check's --deadline-s inside a step of this timeout (None: the step will not
    start; its planned share stands)."""
    timeout = PLANNED_S["cuda_check"] if step_timeout_s is None else step_timeout_s
    return max(10.0, timeout - CUDA_CHECK_MARGIN_S)


def cuda_check(proof: Proof, name: str, model_dir: Path, env: dict, extra: list[str]) -> None:
    result = proof.work / f"cuda_check-{name}.json"
    deadline_s = cuda_check_deadline_s(proof.deadline.timeout_for(PLANNED_S["cuda_check"]))
    argv = [sys.executable, "-m", "worker_service.cuda_check", "--model-dir", str(model_dir),
            "--deadline-s", f"{deadline_s:.0f}", *extra]
    outcome, parsed = run_json_step(proof, f"cuda_check-{name}", argv, PLANNED_S["cuda_check"],
                                    env, result, stdout_is_result=True)
    # cuda_check's JSON stays as it printed it: this proof judges nothing inside it.
    proof.merge(f"{name}.json", "cuda_check", {"exit": outcome.exit_code,
                                               "status": outcome.status, "json": parsed})


def served(proof: Proof, name: str, model_dir: Path, env: dict, device: str) -> None:
    result = proof.work / f"served-{name}.json"
    argv = [sys.executable, "-m", "devtools.gpu.served", "--model-dir", str(model_dir),
            "--device", device, "--result", str(result), "--log-dir",
            str(proof.logs / f"served-{name}")]
    outcome, parsed = run_json_step(proof, f"served-{name}", argv, PLANNED_S["served"], env,
                                    result)
    proof.merge("served.json", name, {"status": outcome.status, "exit": outcome.exit_code,
                                      "result": parsed})


def peers(proof: Proof, name: str, model_dir: Path, env: dict, python: str, dry_run: bool) -> None:
    result = proof.work / f"peers-{name}.json"
    argv = [python, "-m", "devtools.gpu.peers", "--model-dir", str(model_dir), "--result",
            str(result)]
    argv += ["--cpu", "--loads", "1,2", "--new-tokens", "8"] if dry_run else \
        ["--loads", "1,8,32", "--new-tokens", "128"]
    outcome, parsed = run_json_step(proof, f"peers-{name}", argv, PLANNED_S["peers"], env,
                                    result)
    proof.merge(f"{name}.json", "peers", {"status": outcome.status, "exit": outcome.exit_code,
                                          "json": parsed})


def collect_logs(proof: Proof) -> None:
    """Every log's tail in one file ($OUT takes at most 8 files back)."""
    with open(proof.out / "logs.txt", "w") as out:
        for log in sorted(p for p in proof.logs.rglob("*") if p.is_file()):
            data = log.read_bytes()
            out.write(f"===== {log.relative_to(proof.logs)} ({len(data)} bytes; the last "
                      f"{min(len(data), LOG_TAIL_BYTES)})\n")
            out.write(data[-LOG_TAIL_BYTES:].decode(errors="replace") + "\n")


def run(args) -> int:
    deadline = steps.Deadline(args.deadline_s)
    proof = Proof(args.out, args.work, deadline, args.dry_run)
    say(f"{'DRY RUN on the CPU' if args.dry_run else 'on the device'}; results in {args.out}; "
        f"every step stops by {args.deadline_s:.0f} s")
    try:
        return run_steps(proof, args)
    finally:
        proof.record["finished_s"] = round(deadline.elapsed_s(), 1)
        proof.record["summary"] = {s["name"]: s["status"] for s in proof.record["steps"]}
        proof.save()
        collect_logs(proof)
        say(f"done in {deadline.elapsed_s():.0f} s: {proof.record['summary']}")


def run_steps(proof: Proof, args) -> int:
    device = "cpu" if args.dry_run else "cuda"
    check_flags = ["--dry-run"] if args.dry_run else []
    if args.dry_run:
        env = project_env(None)
        proof.skip("install", "dry run: the bundle's onnxruntime-gpu and wheels are for the "
                   "device; this Python's packages serve")
    else:
        env = project_env(args.site)
        stage_missing = install_step(proof, args, env)
        if stage_missing is not None:
            return stage_missing
    env = env_step(proof, env)
    if args.dry_run:
        for name in SHAPES:
            proof.skip(f"build-{name}", "dry run: the model folder given stands for the shapes")
        models = {"tiny": args.model_dir}
        builds = {}
    else:
        models = {name: proof.work / f"{name}-cuda" for name in SHAPES}
        builds = start_builds(proof, args, env)
    first, *rest = list(models)
    genai_python = args.genai_python or sys.executable
    # The 135M shape whole first (the check, the peer's bar, a served request), then the
    # 1.2B shape, whose build ran beside them.
    ready = {first: args.dry_run or wait_build(proof, builds[first])}
    if ready[first]:
        cuda_check(proof, first, models[first], env, check_flags)
        peers(proof, first, models[first], env, genai_python, args.dry_run)
        served(proof, first, models[first], env, device)
    for name in rest:
        ready[name] = wait_build(proof, builds[name])
        if ready[name]:
            cuda_check(proof, name, models[name], env, check_flags + ["--tokens", "16"])
            peers(proof, name, models[name], env, genai_python, args.dry_run)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.gpu.proof",
                                     description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="docs/operations/gpu-proof.md has the two calls")
    parser.add_argument("--out", type=Path, default=os.environ.get("OUT"),
                        help="the results folder (default: $OUT, which the device tool sets)")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--deadline-s", type=float, default=DEADLINE_S)
    parser.add_argument("--bundle", type=Path, default=ROOT / ".gpu-b")
    parser.add_argument("--stage", type=Path, action="append",
                        help="where the stage call left its part (default /tmp/stage, .gpu-a)")
    parser.add_argument("--site", type=Path, default=Path("/tmp/gpu-proof-site"))
    parser.add_argument("--work", type=Path, default=None,
                        help="models and logs (default: /tmp/gpu-proof, or OUT/../work in a "
                             "dry run)")
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="dry run: the model folder (default: the tiny model)")
    parser.add_argument("--genai-python", default=None,
                        help="the Python that runs the peers (default: this one)")
    args = parser.parse_args(argv)
    if args.out is None:
        parser.error("--out (or $OUT) must name the results folder")
    args.out = Path(args.out)
    if args.deadline_s <= steps.RESERVE_S + steps.MIN_STEP_S:
        parser.error(f"--deadline-s {args.deadline_s:g} leaves no step time; at least "
                     f"{steps.RESERVE_S + steps.MIN_STEP_S:g}")
    if args.work is None:
        args.work = args.out.parent / (args.out.name + "-work") if args.dry_run \
            else Path("/tmp/gpu-proof")
    if args.dry_run:
        cache = Path(os.environ.get("ORTSERVE_MODEL_CACHE", Path.home() / ".cache" / "ortserve"))
        args.model_dir = args.model_dir or cache / "models" / "tiny-llama"
        if not (args.model_dir / "genai_config.json").exists():
            parser.error(f"--model-dir {args.model_dir} holds no genai_config.json: run "
                         "`make tiny-model`, or name a built model folder")
    shutil.rmtree(args.work / "logs", ignore_errors=True)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
