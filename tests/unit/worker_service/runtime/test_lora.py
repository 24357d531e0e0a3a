"""LoRA adapters on the engine: greedy tokens equal transformers + peft on the same weights.

The model folder is `make lora-demo`'s (model_tools/lora.py): the tiny base with its
LoRA weights as graph inputs, two random peft adapters as .onnx_adapter files, and
the greedy tokens transformers + peft gave for the base and each adapter
(lora-expected.json, computed when the folder was built).
"""

from __future__ import annotations

import json
import threading

import pytest

from tests.models import prepared_model_dir
from worker_service.core.errors import InvalidWorkerField
from worker_service.core.sequence import TERMINAL, Completed, SequenceRequest
from worker_service.engine.config import EngineConfig
from worker_service.engine.engine import Engine
from worker_service.runtime.lora import AdapterNotFound
from worker_service.runtime.ort_rows import adapter_groups


@pytest.fixture(scope="module", params=["tiny-llama-lora", "tiny-llama-lora-rows"])
def lora_dir(request):
    """The shared layout (one run per adapter group) and the per-row one (every row its
    own adapter in one run: model_tools.lora --per-row)."""
    path = prepared_model_dir(request.param)
    if not (path / "lora-expected.json").is_file():
        pytest.skip(f"{path} has no lora-expected.json: run `make lora-demo`")
    return path


@pytest.fixture(scope="module")
def expected(lora_dir):
    return json.loads((lora_dir / "lora-expected.json").read_text())


@pytest.fixture(scope="module")
def engine(lora_dir):
    adapters = tuple((name, str(lora_dir / "adapters" / f"{name}.onnx_adapter"))
                     for name in ("random0", "random1"))
    with Engine(EngineConfig(model_dir=lora_dir, intra_op_threads=2, prefill_chunk_tokens=64,
                             kv_capacity_bytes=8 * 2**20, lora_adapters=adapters)) as engine:
        yield engine


def run_together(engine: Engine, requests: list[SequenceRequest]) -> dict[str, list[int]]:
    """Submit every request under the engine's lock, so one step takes them all."""
    results: dict[str, list[int]] = {}
    done = threading.Event()

    def on_event(event) -> None:
        if isinstance(event, TERMINAL):
            assert isinstance(event, Completed), event
            results[event.sequence_id] = list(event.token_ids)
            if len(results) == len(requests):
                done.set()

    with engine._cond:
        for req in requests:
            engine.submit(req, on_event)
    assert done.wait(120)
    return results


def requests_for(expected: dict, names: list[str]) -> list[SequenceRequest]:
    new = expected["new_tokens"]
    return [SequenceRequest(f"{name or 'base'}-{i}", tuple(prompt), new, adapter=name)
            for name in names for i, prompt in enumerate(expected["prompts"])]


def up_to_eos(tokens: list[int], eos: tuple[int, ...]) -> list[int]:
    """The reference greedy tokens as the engine ends them: at the first EOS, included
    (the reference runs the whole length; min_new_tokens would suppress EOS instead)."""
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[:i + 1]
    return tokens


def test_adapter_groups_are_maximal_runs():
    assert adapter_groups(None, 3) == [(0, 3, "")]
    assert adapter_groups(["a", "a", "", "b", "b"], 5) == [(0, 2, "a"), (2, 3, ""), (3, 5, "b")]


def test_each_adapter_alone_equals_transformers_and_peft(engine, expected):
    for name in ("", "random0", "random1"):
        got = run_together(engine, requests_for(expected, [name]))
        want = expected[name or "base"]
        assert [got[f"{name or 'base'}-{i}"] for i in range(len(want))] == want, name
    assert expected["random0"] != expected["base"] and expected["random1"] != expected["base"]


def test_mixed_adapters_in_one_batch_equal_each_alone(engine, expected):
    got = run_together(engine, requests_for(expected, ["random1", "", "random0"]))
    for name in ("", "random0", "random1"):
        for i, want in enumerate(expected[name or "base"]):
            assert got[f"{name or 'base'}-{i}"] == want, (name, i)


def test_rows_joining_together_decode_in_one_run_per_adapter(engine, expected):
    prompt, new = tuple(expected["prompts"][0]), expected["new_tokens"]
    names = ["random1", "", "random0", "random1", "", "random0"]
    runs_before = engine.runner.batch.runs
    got = run_together(engine, [SequenceRequest(f"j{i}", prompt, new, min_new_tokens=new,
                                                adapter=name) for i, name in enumerate(names)])
    for i, name in enumerate(names):
        assert got[f"j{i}"] == expected[name or "base"][0], (i, name)
    # Six rows, three adapters, arriving interleaved. Shared LoRA inputs: the first chunks
    # and each decode step run once per adapter (3 x 12 runs), not once per row (6 x 12).
    # Per-row inputs: the first chunks still split by adapter (3), then one run a step.
    runs = engine.runner.batch.runs - runs_before
    assert runs == (3 + (new - 1) if engine.adapters.served.per_row else 3 * new)


def test_prefix_cache_never_serves_another_adapters_blocks(engine, expected):
    long_prompt = tuple(range(100, 180))  # whole blocks, cached when the first finishes
    first = run_together(engine, [SequenceRequest("p-base", long_prompt, 8, min_new_tokens=8)])
    hits_before = engine.prefix_cache.stats.hit_tokens
    other = run_together(engine, [SequenceRequest("p-r0", long_prompt, 8, min_new_tokens=8,
                                                  adapter="random0")])
    assert engine.prefix_cache.stats.hit_tokens == hits_before  # no hit across adapters
    again = run_together(engine, [SequenceRequest("p-r0b", long_prompt, 8, min_new_tokens=8,
                                                  adapter="random0")])
    assert engine.prefix_cache.stats.hit_tokens > hits_before  # its own adapter's blocks hit
    assert again["p-r0b"] == other["p-r0"] != first["p-base"]


def test_unknown_adapter_is_not_found_listing_the_served(engine):
    with pytest.raises(AdapterNotFound) as error:
        engine.check(SequenceRequest("u", (1, 2, 3), 4, adapter="nope"))
    assert "random0, random1" in str(error.value)
    assert error.value.reason.value == "MODEL_NOT_FOUND"


def test_adapter_bytes_are_counted(engine):
    assert engine.adapters.total_bytes() == 2 * 32768


def test_a_base_without_lora_inputs_refuses_adapters(tiny_dir, lora_dir):
    path = str(lora_dir / "adapters" / "random0.onnx_adapter")
    with pytest.raises(InvalidWorkerField, match="no LoRA inputs"):
        Engine(EngineConfig(model_dir=tiny_dir, intra_op_threads=1, kv_capacity_bytes=2**20,
                            lora_adapters=(("random0", path),)))


def test_the_lora_flag_is_name_equals_path_and_repeatable():
    from worker_service.__main__ import parse_config

    config = parse_config(["--model-dir", "m", "--lora", "a=/x/a.onnx_adapter",
                           "--lora", "b=/x/b.onnx_adapter"], [])
    assert config.lora == (("a", "/x/a.onnx_adapter"), ("b", "/x/b.onnx_adapter"))
    for bad in (["--lora", "nopath"], ["--lora", "a=/p", "--lora", "a=/q"]):
        with pytest.raises(SystemExit):
            parse_config(["--model-dir", "m", *bad], [])


def test_smollm2_adapters_mixed_in_one_batch_equal_transformers_and_peft():
    """The same on SmolLM2-135M fp32 (`python -m model_tools.lora --base
    smollm2-135m-instruct`): the base and two adapters, all in one batch."""
    path = prepared_model_dir("smollm2-135m-instruct-lora")
    expected = json.loads((path / "lora-expected.json").read_text())
    adapters = tuple((name, str(path / "adapters" / f"{name}.onnx_adapter"))
                     for name in ("random0", "random1"))
    with Engine(EngineConfig(model_dir=path, intra_op_threads=2, prefill_chunk_tokens=64,
                             kv_capacity_bytes=64 * 2**20, lora_adapters=adapters)) as engine:
        got = run_together(engine, requests_for(expected, ["random1", "", "random0"]))
        eos = engine.spec.eos_token_ids
    for name in ("", "random0", "random1"):
        for i, want in enumerate(expected[name or "base"]):
            assert got[f"{name or 'base'}-{i}"] == up_to_eos(want, eos), (name, i)
    assert expected["random0"] != expected["base"] != expected["random1"]


def test_a_session_keeps_the_adapter_of_its_first_turn(engine, expected):
    prompt, new = tuple(expected["prompts"][0]), expected["new_tokens"]
    engine.open_session("lora-s")
    try:
        done = threading.Event()
        out = []

        def on_event(event) -> None:
            if isinstance(event, TERMINAL):
                out.append(event)
                done.set()

        engine.submit(SequenceRequest("t1", prompt, new, adapter="random0"), on_event,
                      session_id="lora-s")
        assert done.wait(60) and isinstance(out[0], Completed)
        assert list(out[0].token_ids) == expected["random0"][0]
        with pytest.raises(InvalidWorkerField, match="adapter 'random0'"):
            engine.submit(SequenceRequest("t2", prompt + tuple(out[0].token_ids), 4),
                          on_event, session_id="lora-s")
    finally:
        engine.close_session("lora-s")
