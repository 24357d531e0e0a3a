"""The LM head only at the read positions (runtime/last_logits.py): the same logits as the
graph the folder holds, in every runner entry point, and an honest refusal where the edit
does not apply."""

from __future__ import annotations

import os
import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from tests.models import prepared_model_dir
from tests.unit.worker_service.runtime.test_ort_rows import (
    CHUNK_TOKENS,
    alone,
    drive,
    mixed_plans,
    session_for,
)
from worker_service.core.sequence import TERMINAL, SequenceRequest, TokenDelta
from worker_service.engine.config import EngineConfig
from worker_service.engine.engine import Engine
from worker_service.runtime.kv_arena import KVArena
from worker_service.runtime.last_logits import (
    EXTERNAL_FOLDER_KEY,
    LOGITS_POSITIONS,
    edited_graph,
    gather_logits_rows,
)
from worker_service.runtime.model import load_model_spec
from worker_service.runtime.ort_rows import OrtRows


def gathered_session(spec, next_ids: bool = False) -> ort.InferenceSession:
    graph, folder, note = edited_graph(spec.model_file, spec.logits_name, next_ids=next_ids)
    assert graph is not None, note
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.add_session_config_entry(EXTERNAL_FOLDER_KEY, str(folder))
    return ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def tiny():
    spec = load_model_spec(prepared_model_dir("tiny-llama"))
    return spec, session_for(spec), gathered_session(spec)


def test_the_edited_graph_takes_positions_and_gives_one_row_per_sequence(tiny):
    spec, plain, gathered = tiny
    assert LOGITS_POSITIONS not in {i.name for i in plain.get_inputs()}
    assert LOGITS_POSITIONS in {i.name for i in gathered.get_inputs()}
    runner = OrtRows(gathered, spec, KVArena(spec, 2, 2**30), max_chunk_tokens=CHUNK_TOKENS)
    assert runner.gathers


def test_gathered_logits_equal_the_full_graphs_with_joins_leaves_and_a_cancel(tiny):
    # Teacher-forced plans: every logits row of the batched, chunked run on the edited
    # graph against the same plan alone on the graph the folder holds.
    spec, plain, gathered = tiny
    plans = mixed_plans(np.random.default_rng(5), spec.vocab_size, forced=True)
    tokens, logits, (largest, _, beside) = drive(gathered, spec, plans, max_rows=6)
    assert largest >= 5 and beside >= 4
    for i, plan in enumerate(plans):
        solo_tokens, solo_logits = alone(plain, spec, plan)
        assert tokens[i] == solo_tokens[:len(tokens[i])]
        for step, (got, want) in enumerate(zip(logits[i], solo_logits, strict=False)):
            np.testing.assert_allclose(got, want, atol=1e-4, err_msg=f"seq {i} token {step}")


def test_batched_first_chunks_read_each_rows_own_last_position(tiny):
    spec, plain, gathered = tiny
    chunks = [[5, 9, 13, 2, 7], [3] * 9, [11, 12]]
    out = {}
    for name, session in (("plain", plain), ("gathered", gathered)):
        arena = KVArena(spec, 4, 2**30)
        for _ in chunks:
            arena.allocate(16)  # room for the padded width (9)
        runner = OrtRows(session, spec, arena, max_chunk_tokens=64)
        out[name] = runner.prefill_first(0, chunks).copy()
    assert out["gathered"].shape == (3, spec.vocab_size)
    np.testing.assert_allclose(out["gathered"], out["plain"], atol=1e-4)


def greedy_tokens(model_dir, prompts, new_tokens, **config) -> dict[str, list[int]]:
    engine = Engine(EngineConfig(model_dir=model_dir, intra_op_threads=2,
                                 kv_capacity_bytes=2**28, **config))
    tokens: dict[str, list[int]] = {}
    ended: list = []
    done = threading.Event()

    def on_event(event) -> None:
        if isinstance(event, TokenDelta):
            tokens.setdefault(event.sequence_id, []).extend(event.token_ids)
        elif isinstance(event, TERMINAL):
            ended.append(event)
            if len(ended) == len(prompts):
                done.set()

    try:
        for i, prompt in enumerate(prompts):
            engine.submit(SequenceRequest(sequence_id=f"s{i}", prompt_ids=tuple(prompt),
                                          max_new_tokens=new_tokens), on_event)
        assert done.wait(300)
    finally:
        engine.close()
    return tokens


@pytest.mark.parametrize("layout", ["arena", "static"])
def test_the_engine_gives_the_same_tokens_with_and_without_the_edit(layout):
    model_dir = prepared_model_dir("tiny-llama")
    prompts = [[(7 * i + j) % 400 + 3 for j in range(5 + 9 * i)] for i in range(4)]
    edited = greedy_tokens(model_dir, prompts, 6, kv_layout=layout)
    unedited = greedy_tokens(model_dir, prompts, 6, kv_layout=layout, last_position_logits=False)
    assert edited == unedited and all(len(t) == 6 for t in edited.values())


def test_a_folder_of_symlinks_is_read_where_its_files_are(tmp_path):
    # ORT resolves symlinks and refuses weights outside the folder it was given.
    source = prepared_model_dir("tiny-llama")
    for item in source.iterdir():
        os.symlink(item, tmp_path / item.name)
    spec = load_model_spec(tmp_path)
    graph, folder, note = edited_graph(spec.model_file, spec.logits_name)
    assert graph is not None, note
    assert folder == source.resolve()
    gathered_session(spec)  # loads


def test_a_graph_whose_logits_no_matmul_makes_is_left_as_it_is():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 4])
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", "s", 4])
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["logits"])], "g", [x], [logits]))
    before = model.SerializeToString()
    assert "no MatMul produces 'logits'" in gather_logits_rows(model, "logits")
    assert model.SerializeToString() == before


def test_an_lm_head_input_with_other_readers_is_left_as_it_is():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 4])
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", "s", 4])
    other = helper.make_tensor_value_info("other", TensorProto.FLOAT, ["b", "s", 4])
    weight = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], np.eye(4, dtype=np.float32).ravel())
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("MatMul", ["h", "w"], ["logits"]),
         helper.make_node("Neg", ["h"], ["other"])], "g", [x], [logits, other], [weight]))
    assert "other readers" in gather_logits_rows(model, "logits")
    assert LOGITS_POSITIONS not in {i.name for i in model.graph.input}
    onnx.checker.check_model(model)
