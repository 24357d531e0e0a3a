"""The engine against a plain ONNX Runtime loop, and its static shared KV buffers."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from tests.models import prepared_model_dir
from worker_service.core.errors import ModelLoadError
from worker_service.core.sampling import Sampler, SamplingConfig
from worker_service.core.sequence import FinishReason, SequenceRequest
from worker_service.engine.config import EngineConfig
from worker_service.engine.engine import Engine
from worker_service.runtime.kv_pool import StaticSharedKV
from worker_service.runtime.model import ModelSpec, load_model_spec

FRANCE = "What is the capital of France? Answer in one sentence."


def plain_session(spec: ModelSpec) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(spec.model_file), options, providers=["CPUExecutionProvider"])


def reference_generate(spec: ModelSpec, session: ort.InferenceSession, prompt_ids: list[int],
                       new_tokens: int, sampler: Sampler) -> list[int]:
    """The textbook loop: feed every present back as the next past (a growing cache)."""
    names = [o.name for o in session.get_outputs()]
    empty = np.zeros((1, spec.kv_heads, 0, spec.head_dim), dtype=spec.kv_dtype)
    layers = range(spec.num_layers)
    past = {fmt.format(i=i): empty for i in layers
            for fmt in (spec.past_key_name, spec.past_value_name)}
    history, out, step_ids, total = list(prompt_ids), [], list(prompt_ids), 0
    for _ in range(new_tokens):
        total += len(step_ids)
        feeds = {"input_ids": np.array([step_ids], dtype=np.int64),
                 "attention_mask": np.ones((1, total), dtype=np.int64), **past}
        result = dict(zip(names, session.run(None, feeds), strict=True))
        for i in layers:
            past[spec.past_key_name.format(i=i)] = result[spec.present_key_name.format(i=i)]
            past[spec.past_value_name.format(i=i)] = result[spec.present_value_name.format(i=i)]
        token = sampler(result["logits"][0, -1], history)
        out.append(token)
        history.append(token)
        step_ids = [token]
    return out


@pytest.fixture(scope="module")
def tiny_engine(tiny_dir):
    with Engine(EngineConfig(model_dir=tiny_dir, intra_op_threads=2)) as engine:
        yield engine


def test_spec_is_read_from_the_folder(tiny_engine):
    spec = tiny_engine.spec
    assert (spec.num_layers, spec.kv_heads, spec.head_dim) == (2, 2, 16)
    assert spec.bytes_per_token == 2 * 2 * 2 * 16 * 4
    assert spec.kv_dtype == np.float32 and 2 in spec.eos_token_ids
    assert tiny_engine.provider == "CPUExecutionProvider" and tiny_engine.device == "cpu"
    assert tiny_engine.intra_op_threads == 2


def test_config_that_disagrees_with_the_graph_is_refused(tiny_dir, tmp_path):
    for name in ("model.onnx", "model.onnx.data", "tokenizer.json"):
        (tmp_path / name).symlink_to(tiny_dir / name)
    config = (tiny_dir / "genai_config.json").read_text()
    (tmp_path / "genai_config.json").write_text(
        config.replace('"num_hidden_layers": 2', '"num_hidden_layers": 3'))
    with pytest.raises(ModelLoadError, match="says 3 layers but the graph has 2"):
        load_model_spec(tmp_path)
    with pytest.raises(ModelLoadError, match="genai_config.json not found"):
        load_model_spec(tmp_path / "nowhere")


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=1.0, seed=11)],
                         ids=["greedy", "sampled"])
def test_engine_tokens_equal_a_growing_cache_reference_loop(tiny_engine, sampling):
    # Sampling at temperature 1 on the random tiny model draws from the whole
    # vocabulary, so any difference in logits (a wrong cache) shows in the tokens.
    spec = tiny_engine.spec
    prompt = tiny_engine.tokenizer.encode_chat([("user", FRANCE)])
    expected = reference_generate(spec, plain_session(spec), prompt, 40,
                                  Sampler(sampling, spec.vocab_size))
    done = tiny_engine.generate(SequenceRequest("ref", tuple(prompt), 40, sampling=sampling))
    assert list(done.token_ids) == expected
    assert done.finish_reason is FinishReason.LENGTH and done.generated_tokens == 40
    if not sampling.greedy:
        assert len(set(expected)) > 20


def test_prompt_prefilled_in_chunks_gives_the_same_tokens(tiny_dir, tiny_engine):
    prompt = tuple(tiny_engine.tokenizer.encode_chat([("user", FRANCE)]))
    req = SequenceRequest("chunks", prompt, 24, sampling=SamplingConfig(temperature=1.0, seed=3))
    whole = tiny_engine.generate(req)
    with Engine(EngineConfig(model_dir=tiny_dir, intra_op_threads=2,
                             prefill_chunk_tokens=5)) as chunked:
        assert len(prompt) > 5 * 3
        assert chunked.generate(req).token_ids == whole.token_ids


def test_static_buffer_is_written_in_place_and_matches_the_growing_cache(tiny_engine):
    spec = tiny_engine.spec
    session = plain_session(spec)
    prompt = tiny_engine.tokenizer.encode("The static cache is shared between past and present.")
    n = len(prompt)
    # Growing cache: presents of the prompt.
    empty = np.zeros((1, spec.kv_heads, 0, spec.head_dim), dtype=spec.kv_dtype)
    feeds = {"input_ids": np.array([prompt], dtype=np.int64),
             "attention_mask": np.ones((1, n), dtype=np.int64)}
    feeds |= {fmt.format(i=i): empty for i in range(spec.num_layers)
              for fmt in (spec.past_key_name, spec.past_value_name)}
    names = [o.name for o in session.get_outputs()]
    grown = dict(zip(names, session.run(None, feeds), strict=True))
    # Static cache: one buffer of 64 positions bound as both past and present.
    buffer = StaticSharedKV(spec).allocate(64)
    binding = session.io_binding()
    buffer.bind(binding)
    binding.bind_cpu_input("input_ids", feeds["input_ids"])
    binding.bind_cpu_input("attention_mask", feeds["attention_mask"])
    binding.bind_output("logits", "cpu")
    session.run_with_iobinding(binding)
    # get_outputs() follows the binding order: the buffer's presents (layer by layer, key
    # then value), then logits.
    presents = [fmt.format(i=i) for i in range(spec.num_layers)
                for fmt in (spec.present_key_name, spec.present_value_name)]
    bound_outputs = dict(zip([*presents, "logits"], binding.get_outputs(), strict=True))
    for present_name in presents:
        value = bound_outputs[present_name]
        assert value.shape() == [1, spec.kv_heads, 64, spec.head_dim]
        np.testing.assert_allclose(value.numpy()[:, :, :n], grown[present_name], atol=1e-5)
    np.testing.assert_allclose(bound_outputs["logits"].numpy(), grown["logits"], atol=1e-4)
    # The next token over the same buffer: its past is what the first run wrote as present
    # (no copy, no new tensor), so it matches the growing cache's next step.
    next_id = int(np.argmax(grown["logits"][0, -1]))
    step_feeds = {"input_ids": np.array([[next_id]], dtype=np.int64),
                  "attention_mask": np.ones((1, n + 1), dtype=np.int64)}
    step_feeds |= {fmt.format(i=i): grown[present.format(i=i)] for i in range(spec.num_layers)
                   for fmt, present in ((spec.past_key_name, spec.present_key_name),
                                        (spec.past_value_name, spec.present_value_name))}
    grown_step = dict(zip(names, session.run(None, step_feeds), strict=True))
    step = session.io_binding()
    buffer.bind(step)
    step.bind_cpu_input("input_ids", step_feeds["input_ids"])
    step.bind_cpu_input("attention_mask", step_feeds["attention_mask"])
    step.bind_output("logits", "cpu")
    session.run_with_iobinding(step)
    step_outputs = dict(zip([*presents, "logits"], step.get_outputs(), strict=True))
    for present_name in presents:
        # ORT wrote into the very buffer bound as past, both runs.
        assert step_outputs[present_name].data_ptr() == bound_outputs[present_name].data_ptr()
    np.testing.assert_allclose(step_outputs["logits"].numpy(), grown_step["logits"], atol=1e-4)
    buffer.free()


def test_timings_are_consistent(tiny_engine):
    done = tiny_engine.generate(SequenceRequest("timing", (1, 2, 3), 16))
    assert done.queue_ms >= 0 and done.prefill_ms > 0 and done.decode_ms > 0
    assert done.ttft_ms >= done.prefill_ms
    assert done.total_ms >= done.ttft_ms + done.decode_ms - 1e-6
    assert done.decode_tokens_per_s == pytest.approx(15 / (done.decode_ms / 1e3))
    assert done.seed is None


@pytest.mark.slow
def test_smollm2_fp32_greedy_equals_reference_and_answers_paris():
    model_dir = prepared_model_dir("smollm2-135m-instruct-fp32")
    with Engine(EngineConfig(model_dir=model_dir, intra_op_threads=2)) as engine:
        spec = engine.spec
        prompt = engine.tokenizer.encode_chat([("user", FRANCE)])
        expected = reference_generate(spec, plain_session(spec), prompt, 32,
                                      Sampler(SamplingConfig(), spec.vocab_size))
        done = engine.generate(SequenceRequest("paris", tuple(prompt), 32))
    assert list(done.token_ids) == expected[: done.generated_tokens]
    assert done.finish_reason in (FinishReason.EOS, FinishReason.LENGTH)
    assert "Paris" in done.text


def test_info_node_placement_is_ort_s_own_and_all_cpu_on_cpu(tiny_engine):
    placement = tiny_engine.nodes_by_provider
    assert set(placement) == {"CPUExecutionProvider"} and placement["CPUExecutionProvider"] > 10


def test_more_sequences_than_arena_rows_wait_for_a_row_and_all_complete(tiny_dir):
    """Submitted together, 7 sequences on an arena of 3 rows: the ones without a row wait
    in the queue (their KV was charged; a row frees as others finish), never fail."""
    import threading

    from worker_service.core.sequence import Completed

    with Engine(EngineConfig(model_dir=tiny_dir, intra_op_threads=2, max_batch_rows=3)) as engine:
        assert engine.max_batch_rows == 3
        prompts = [tuple(engine.tokenizer.encode(f"Story number {i} begins")) for i in range(7)]
        alone = [engine.generate(SequenceRequest(f"alone-{i}", p, 12, min_new_tokens=12)).token_ids
                 for i, p in enumerate(prompts)]
        ends: dict[int, object] = {}
        done = threading.Event()

        def on_event(i: int):
            def record(event) -> None:
                if isinstance(event, Completed) or type(event).__name__ in ("Failed", "Cancelled"):
                    ends[i] = event
                    if len(ends) == len(prompts):
                        done.set()
            return record

        for i, p in enumerate(prompts):
            engine.submit(SequenceRequest(f"together-{i}", p, 12, min_new_tokens=12), on_event(i))
        assert done.wait(60)
        assert [type(ends[i]).__name__ for i in range(7)] == ["Completed"] * 7, ends
        assert [ends[i].token_ids for i in range(7)] == alone
        assert engine.runner.largest_batch <= 3
