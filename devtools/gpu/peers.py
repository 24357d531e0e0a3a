"""The peer on the same folder: onnxruntime-genai's Generator and its og.Engine, by load.

  python -m devtools.gpu.peers --model-dir DIR --result F [--loads 1,8,32] [--new-tokens 128]
                               [--cpu]

Generator: one batch of `load` copies of the prompt, greedy, exactly new_tokens each; decode
tokens/s counts the steps after the first token (bench/peers/genai_peer.py's window).
Engine (continuous batching, where the installed genai has og.Engine): `load` requests
submitted at once, greedy, exactly new_tokens each; tokens/s over the whole wall time and
over the window after every request's first token. The Engine is tried with paged dynamic
batching (genai_config's engine.dynamic_batching, max_batch_size = the largest load) and,
where that is refused, as the static Engine (its batch bound is then in the JSON).
Imports only numpy and onnxruntime_genai (and, on CUDA, onnxruntime to preload the CUDA
libraries): it runs in whatever Python has the peer. Results are
written to F after every load (a run cut short keeps what it has). --cpu: the CPU provider.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

PROMPT = "Write a long story about a dragon."  # cuda_check's decode_speed prompt


def say(message: str) -> None:
    print(f"peers: {message}", file=sys.stderr, flush=True)


def with_config(model_dir: Path, change) -> Path:
    """A folder of links to model_dir whose genai_config.json is `change`d."""
    out = Path(tempfile.mkdtemp(prefix="genai-peer-"))
    for item in model_dir.iterdir():
        if item.name != "genai_config.json":
            os.symlink(item.resolve(), out / item.name)
    config = json.loads((model_dir / "genai_config.json").read_text())
    change(config)
    (out / "genai_config.json").write_text(json.dumps(config))
    return out


def load_model(og, folder: Path, cpu: bool):
    config = og.Config(str(folder))
    if cpu:
        config.clear_providers()
    return og.Model(config)


def generator_rate(og, np, model, ids, load: int, new_tokens: int) -> dict:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + new_tokens,
                              min_length=len(ids) + new_tokens, batch_size=load,
                              do_sample=False)
    generator = og.Generator(model, params)
    t0 = time.perf_counter()
    generator.append_tokens(np.tile(ids, (load, 1)))
    generator.generate_next_token()  # samples the prefill's logits: the first token
    first = time.perf_counter()
    steps = 0
    while not generator.is_done():
        generator.generate_next_token()
        steps += 1
    end = time.perf_counter()
    return {"decode_tokens_per_s": round(load * steps / (end - first), 1),
            "ttft_ms": round((first - t0) * 1e3, 1), "decode_steps": steps}


def engine_rate(og, np, engine, ids, load: int, new_tokens: int) -> dict:
    buffer = engine.create_event_buffer(max(256, 4 * load))
    requests = []
    t0 = time.perf_counter()
    for _ in range(load):
        request = engine.create_request()
        options = og.TurnOptions(request)
        options.set_max_generated_tokens(new_tokens)
        options.set_min_generated_tokens(new_tokens)
        options.set_do_sample(False)
        request.begin_turn(ids, options)
        requests.append(request)
    firsts: dict[int, float] = {}
    tokens, finished, failed = 0, 0, []
    while engine.has_pending_requests():
        for event in engine.run(buffer):
            flags = event.flags
            if flags & og.EngineEventFlags.TOKEN:
                tokens += 1
                # pybind11 hands back the same Python object for a request still held
                firsts.setdefault(id(event.request), time.perf_counter())
            if flags & og.EngineEventFlags.FAILED:
                failed.append(str(event.error_code))
            if flags & og.EngineEventFlags.TURN_FINISHED:
                finished += 1
    end = time.perf_counter()
    for request in requests:
        request.close()
    last_first = max(firsts.values()) if firsts else end
    after = tokens - len(firsts)
    return {"tokens_per_s": round(tokens / (end - t0), 1),
            "decode_tokens_per_s_after_all_first": round(after / (end - last_first), 1)
            if end > last_first and after > 0 else None,
            "ttft_ms_last": round((last_first - t0) * 1e3, 1), "tokens": tokens,
            "requests_with_a_token": len(firsts),
            "finished": finished, "failed": failed[:5]}


def preload_cuda_libraries() -> None:
    """onnxruntime-gpu's preload_dlls: genai's CUDA provider finds the CUDA 13 libraries of the
    image's nvidia-* wheels only once ORT has loaded them (what the worker does too)."""
    import contextlib
    import io

    import onnxruntime as ort

    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(Exception):
        ort.preload_dlls()


def run(model_dir: Path, loads: list[int], new_tokens: int, cpu: bool, write) -> dict:
    import numpy as np

    if not cpu:
        preload_cuda_libraries()
    import onnxruntime_genai as og

    out: dict = {"genai_version": og.__version__, "model_dir": str(model_dir),
                 "provider": "cpu" if cpu else "cuda", "new_tokens": new_tokens,
                 "loads": loads, "generator": {}, "engine": {}}
    model = load_model(og, model_dir, cpu)
    tokenizer = og.Tokenizer(model)
    ids = np.array(tokenizer.encode(PROMPT), dtype=np.int32)
    out["prompt_tokens"] = int(len(ids))
    generator_rate(og, np, model, ids, 1, 4)  # warm-up, discarded
    for load in loads:
        try:
            out["generator"][str(load)] = generator_rate(og, np, model, ids, load, new_tokens)
        except Exception as error:  # noqa: BLE001 - genai may refuse a batch: record it
            out["generator"][str(load)] = {"error": f"{type(error).__name__}: {error}"[:500]}
        say(f"Generator load {load}: {out['generator'][str(load)]}")
        write(out)
    if not hasattr(og, "Engine"):
        out["engine"] = {"skipped": f"onnxruntime-genai {og.__version__} has no og.Engine"}
        return out
    engine, how = None, []
    if not cpu:  # paged dynamic batching needs the CUDA provider's paged KV cache
        folder = with_config(model_dir, lambda c: c.setdefault("engine", {}).update(
            {"dynamic_batching": {"max_batch_size": max(loads)}}))
        try:
            engine = og.Engine(load_model(og, folder, cpu))
            how.append("dynamic_batching")
        except Exception as error:  # noqa: BLE001 - recorded, then the static Engine
            how.append(f"dynamic_batching refused: {type(error).__name__}: {error}"[:400])
    if engine is None:
        engine = og.Engine(model)
        how.append("static")
    caps = engine.get_capabilities()
    out["engine"] = {"mode": how, "configured_max_batch_size": caps.configured_max_batch_size,
                     "max_request_length": caps.max_request_length,
                     "max_scheduled_tokens": caps.max_scheduled_tokens}
    engine_rate(og, np, engine, ids, 1, 4)  # warm-up, discarded
    for load in loads:
        try:
            out["engine"][str(load)] = engine_rate(og, np, engine, ids, load, new_tokens)
        except Exception as error:  # noqa: BLE001
            out["engine"][str(load)] = {"error": f"{type(error).__name__}: {error}"[:500]}
        say(f"Engine load {load}: {out['engine'][str(load)]}")
        write(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.gpu.peers",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--loads", default="1,8,32")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--cpu", action="store_true")
    args = parser.parse_args(argv)

    def write(out: dict) -> None:
        args.result.write_text(json.dumps(out, indent=1))

    try:
        import onnxruntime_genai  # noqa: F401
    except ImportError as error:
        write({"skipped": f"onnxruntime_genai is not importable in {sys.executable}: {error}"})
        return 0
    try:
        out = run(args.model_dir, [int(x) for x in args.loads.split(",")], args.new_tokens,
                  args.cpu, write)
    except Exception as error:  # noqa: BLE001 - the reason is the result
        write({"error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()})
        return 1
    write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
