"""Constrained decoding in the engine with the real default model: outputs parse and validate."""

from __future__ import annotations

import json
import threading

import jsonschema
import pytest

from ortserve.output.constraint_grammar import ConstraintSpec
from tests.models import prepared_model_dir
from worker_service.core.sampling import SamplingConfig
from worker_service.core.sequence import TERMINAL, Completed, FinishReason, SequenceRequest
from worker_service.engine.config import EngineConfig
from worker_service.engine.engine import Engine

pytestmark = pytest.mark.slow

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "address": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 24},
            "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["city", "zip"],
            "additionalProperties": False},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["name", "age", "role", "address", "tags"],
    "additionalProperties": False,
}
PROMPTS = [
    "Describe a fictional person as JSON.",
    "Give me a user record for a librarian in Paris.",
    "Make up an administrator account for a company in Berlin.",
]


@pytest.fixture(scope="module")
def engine():
    model = prepared_model_dir("smollm2-135m-instruct-fp32")
    with Engine(EngineConfig(model_dir=model, kv_capacity_bytes=512 * 2**20)) as e:
        yield e


GREEDY = SamplingConfig()


def request(engine, prompt: str, spec: ConstraintSpec | None, sampling=GREEDY,
            max_new_tokens: int = 160, sequence_id: str = "s") -> SequenceRequest:
    ids = engine.tokenizer.encode_chat([("user", prompt)])
    return SequenceRequest(sequence_id, tuple(ids), max_new_tokens, sampling=sampling,
                           constraint=spec)


def run_all(engine, reqs: list[SequenceRequest]) -> list[Completed]:
    """Submit together (one batched decode) and wait for every end."""
    done: dict[str, Completed] = {}
    finished = threading.Event()

    def on_event(event):
        if isinstance(event, TERMINAL):
            done[event.sequence_id] = event
            if len(done) == len(reqs):
                finished.set()

    for req in reqs:
        engine.submit(req, on_event)
    assert finished.wait(600), "the constrained batch never finished"
    return [done[r.sequence_id] for r in reqs]


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=0.7, seed=11),
                                      SamplingConfig(temperature=1.0, top_p=0.9, top_k=40, seed=5)])
def test_constrained_outputs_validate_against_a_nested_schema(engine, sampling):
    spec = ConstraintSpec("json_schema", json.dumps(PERSON))
    reqs = [request(engine, p, spec, sampling, sequence_id=f"s{i}") for i, p in enumerate(PROMPTS)]
    for done in run_all(engine, reqs):
        assert isinstance(done, Completed)
        assert done.finish_reason is FinishReason.CONSTRAINT_COMPLETE, done.text
        assert done.constraint_satisfied is True
        jsonschema.validate(json.loads(done.text), PERSON)


def test_a_batched_constrained_row_is_the_same_as_alone_and_free_rows_are_untouched(engine):
    spec = ConstraintSpec("json_schema", json.dumps(PERSON))
    alone = engine.generate(request(engine, PROMPTS[0], spec), timeout_s=600)
    free_alone = engine.generate(request(engine, PROMPTS[1], None, max_new_tokens=24),
                                 timeout_s=600)
    together = run_all(engine, [request(engine, PROMPTS[0], spec, sequence_id="c"),
                                request(engine, PROMPTS[1], None, max_new_tokens=24,
                                        sequence_id="f")])
    assert together[0].token_ids == alone.token_ids
    assert together[1].token_ids == free_alone.token_ids
    assert together[1].constraint_satisfied is None


def test_regex_and_grammar_constraints_complete(engine):
    regex = engine.generate(request(engine, "Is the sky blue? Answer yes or no, then why.",
                                    ConstraintSpec("regex", r"(yes|no), because [a-z ]{1,40}\.")),
                            timeout_s=600)
    assert regex.finish_reason is FinishReason.CONSTRAINT_COMPLETE
    assert regex.text.startswith(("yes, because ", "no, because ")) and regex.text.endswith(".")
    lark = 'start: "The answer is " NUMBER "."\nNUMBER: /[0-9]{1,4}/'
    grammar = engine.generate(request(engine, "What is 12 times 12?",
                                      ConstraintSpec("grammar", lark)), timeout_s=600)
    assert grammar.finish_reason is FinishReason.CONSTRAINT_COMPLETE
    assert grammar.text.startswith("The answer is ") and grammar.text.endswith(".")


def test_a_ceiling_before_completion_says_the_constraint_was_not_satisfied(engine):
    done = engine.generate(request(engine, PROMPTS[0],
                                   ConstraintSpec("json_schema", json.dumps(PERSON)),
                                   max_new_tokens=6), timeout_s=600)
    assert done.finish_reason is FinishReason.LENGTH and done.generated_tokens == 6
    assert done.constraint_satisfied is False and "max_new_tokens (6)" in done.constraint_reason
