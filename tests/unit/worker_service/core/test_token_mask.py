"""Output constraints: the vocabulary-free check, the matcher over the real SmolLM2
tokenizer (tiny-llama carries it), masks, the sampler under a mask, a sequence's end."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ortserve.output.constraint_grammar import ConstraintSpec, check
from ortserve.rules import request_rules
from ortserve.status.errors import InvalidField
from ortserve.v1 import types_pb2
from worker_service.core.sampling import Sampler, SamplingConfig
from worker_service.core.sequence import FinishReason, Sequence, SequenceRequest
from worker_service.core.step_scheduler import PrefillChunk, StepPlan
from worker_service.core.token_mask import ConstraintCompiler, MaskBatch, step_constraints
from worker_service.core.tokenizer import Tokenizer

EOS = 2
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20},
    "role": {"enum": ["admin", "user"]},
    "tags": {"type": "array", "items": {"type": "integer"}},
    "home": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    "required": ["name", "role", "tags", "home"], "additionalProperties": False}
ADA = '{"name":"Ada","role":"admin","tags":[1,2],"home":{"city":"London"}}'


@pytest.fixture(scope="module")
def tokenizer(tiny_dir) -> Tokenizer:
    return Tokenizer(tiny_dir)


@pytest.fixture(scope="module")
def compiler(tokenizer) -> ConstraintCompiler:
    return ConstraintCompiler(tokenizer.to_json, tokenizer.vocab_size, (EOS,))


def schema(value: dict) -> ConstraintSpec:
    return ConstraintSpec("json_schema", json.dumps(value))


# -- the rule both edges apply (no vocabulary) ------------------------------------------


@pytest.mark.parametrize("spec,field,words", [
    (ConstraintSpec("json_schema", '{"type": "nope"}'), "constraint.json_schema", "Invalid type"),
    (ConstraintSpec("json_schema", "{not json"), "constraint.json_schema", "is not JSON"),
    (ConstraintSpec("json_schema", "[1, 2]"), "constraint.json_schema", "not a schema"),
    (ConstraintSpec("json_schema", ""), "constraint.json_schema", "is empty"),
    (ConstraintSpec("regex", "a(b"), "constraint.regex", "unclosed group"),
    (ConstraintSpec("grammar", "start: missing_rule"), "constraint.grammar", "unknown name"),
])
def test_a_constraint_the_library_cannot_compile_names_the_field_and_the_reason(spec, field, words):
    with pytest.raises(InvalidField) as err:
        check(spec)
    assert err.value.field == field and words in str(err.value)
    assert "llguidance" in str(err.value) or "JSON" in str(err.value) or "empty" in str(err.value)


def test_request_rules_read_the_proto_constraint_and_refuse_an_empty_or_false_one():
    req = types_pb2.GenerateRequest(text="hi")
    assert request_rules.constraint_spec(req) is None
    req.constraint.SetInParent()
    with pytest.raises(InvalidField, match="set but empty"):
        request_rules.generate_request(req)
    req.constraint.json_object = False
    with pytest.raises(InvalidField) as err:
        request_rules.generate_request(req)
    assert err.value.field == "constraint.json_object"
    req.constraint.regex = "a("
    with pytest.raises(InvalidField) as err:
        request_rules.generate_request(req, prefix="request.")
    assert err.value.field == "request.constraint.regex"
    req.constraint.json_schema = json.dumps(PERSON)
    request_rules.generate_request(req)
    assert request_rules.constraint_spec(req) == schema(PERSON)


def test_a_sequence_request_applies_the_same_rule():
    with pytest.raises(InvalidField) as err:
        SequenceRequest("s", (1, 2), 8, constraint=ConstraintSpec("regex", "(("))
    assert err.value.field == "constraint.regex"


# -- the matcher over the real vocabulary -------------------------------------------------


def test_a_whole_valid_output_walks_the_mask_and_completes(compiler, tokenizer):
    c = compiler.compile(schema(PERSON))
    ids = tokenizer.encode(ADA)
    for token in ids:
        allowed = c.allowed()
        assert allowed[token], tokenizer.decode([token])
        assert not allowed[EOS]  # EOS only where the output is whole
        c.advance(token)
    assert c.complete and c.satisfied


def test_the_mask_refuses_what_breaks_the_schema(compiler, tokenizer):
    c = compiler.compile(schema(PERSON))
    assert not c.allowed()[tokenizer.encode("[")[0]]
    assert c.allowed().sum() < 10  # an object with "name" first: hardly any choice
    for token in tokenizer.encode('{"name":"Ada","role":"'):
        c.advance(token)
    allowed = c.allowed()
    assert allowed[tokenizer.encode("admin")[0]] or allowed[tokenizer.encode("ad")[0]]
    assert not allowed[tokenizer.encode("guest")[0]]


def test_eos_is_allowed_once_an_extendable_match_is_whole(compiler, tokenizer):
    c = compiler.compile(ConstraintSpec("regex", "a+"))
    c.advance(tokenizer.encode("a")[0])
    assert c.satisfied and not c.complete and c.allowed()[EOS]
    c.advance(EOS)
    assert c.complete


def test_compiled_matchers_are_cached_but_each_request_gets_its_own_state(compiler, tokenizer):
    first = compiler.compile(schema(PERSON))
    second = compiler.compile(schema(PERSON))
    opening = tokenizer.encode(ADA)[0]
    first.advance(opening)
    assert not first.allowed()[opening]
    assert second.allowed()[opening]  # second is still at the start


@pytest.mark.parametrize("overlap", [False, True])
def test_the_batched_masks_equal_the_one_by_one_masks(compiler, overlap):
    specs = [schema(PERSON), ConstraintSpec("json_object"), ConstraintSpec("regex", "[0-9]{3}")]
    one_by_one = [compiler.compile(s) for s in specs]
    batch = [compiler.compile(s) for s in specs]
    masks = MaskBatch(compiler.vocab_size, overlap=overlap)
    for _ in range(3):  # the first steps of each, in lockstep
        masks.start(batch)()
        for c, alone in zip(batch, one_by_one, strict=True):
            assert c.has_mask and np.array_equal(c.allowed(), alone.allowed())
            token = int(np.flatnonzero(alone.allowed())[0])
            c.advance(token)
            alone.advance(token)
    masks.close()


def test_step_constraints_are_the_rows_that_sample_after_the_run(compiler):
    class Seq:
        def __init__(self, constraint, pending):
            self.constraint, self.num_pending_tokens = constraint, pending

    a, b = compiler.compile(schema(PERSON)), compiler.compile(ConstraintSpec("regex", "x"))
    plan = StepPlan(decodes=(Seq(a, 1), Seq(None, 1)),
                    prefills=(PrefillChunk(Seq(b, 10), 10), PrefillChunk(Seq(b, 10), 4)))
    assert step_constraints(plan) == [a, b]


# -- the sampler under a mask --------------------------------------------------------------


@pytest.mark.parametrize("config", [
    SamplingConfig(), SamplingConfig(temperature=0.8, seed=3),
    SamplingConfig(temperature=1.5, top_k=5, seed=4), SamplingConfig(temperature=1.0, top_p=0.5, seed=5),
    SamplingConfig(repetition_penalty=1.3),
])
def test_every_sampling_mode_chooses_only_allowed_tokens(config):
    rng = np.random.default_rng(0)
    allowed = np.zeros(1000, dtype=bool)
    allowed[[7, 300, 999]] = True
    sampler = Sampler(config, 1000)
    for _ in range(50):
        logits = rng.normal(size=1000).astype(np.float32)
        logits[5] = 100.0  # the unconstrained favourite is never allowed
        assert allowed[sampler(logits, [300], allowed)]


def test_greedy_under_a_mask_is_the_best_allowed_token():
    logits = np.array([5.0, 1.0, 3.0, 3.0, 0.0], dtype=np.float32)
    allowed = np.array([False, True, True, True, False])
    assert Sampler(SamplingConfig(), 5)(logits, [], allowed) == 2


def test_min_new_tokens_yields_to_a_constraint_that_allows_only_eos():
    sampler = Sampler(SamplingConfig(), 4)
    sampler.suppress([EOS])
    allowed = np.array([False, False, True, False])
    assert sampler(np.zeros(4, dtype=np.float32), [], allowed) == EOS


# -- a sequence's end ----------------------------------------------------------------------


def run_sequence(compiler, tokenizer, spec, max_new_tokens, favourite: list[int]):
    """Drive Sequence.accept with logits that favour `favourite` tokens in turn."""
    req = SequenceRequest("s", (1, 2, 3), max_new_tokens, constraint=spec)
    seq = Sequence(req, lambda e: None, tokenizer, tokenizer.vocab_size, (EOS,))
    seq.constraint = compiler.compile(spec)
    for token in favourite:
        logits = np.zeros(tokenizer.vocab_size, dtype=np.float32)
        logits[token] = 10.0
        _, _, reason, _ = seq.accept(logits)
        if reason is not None:
            return seq, reason
    raise AssertionError("the sequence never ended")


def test_a_completed_constraint_ends_the_sequence_satisfied(compiler, tokenizer):
    seq, reason = run_sequence(compiler, tokenizer, schema(PERSON), 200, tokenizer.encode(ADA))
    assert reason is FinishReason.CONSTRAINT_COMPLETE
    done = seq.completed(reason)
    assert json.loads(done.text) == json.loads(ADA)
    assert done.constraint_satisfied is True and done.constraint_reason == ""


def test_a_sequence_cut_by_its_ceiling_says_the_constraint_was_not_satisfied(compiler, tokenizer):
    seq, reason = run_sequence(compiler, tokenizer, schema(PERSON), 5, tokenizer.encode(ADA))
    assert reason is FinishReason.LENGTH
    done = seq.completed(reason)
    assert done.constraint_satisfied is False
    assert "max_new_tokens (5)" in done.constraint_reason
    assert "constraint.json_schema" in done.constraint_reason


def test_an_unconstrained_sequence_reports_no_constraint(tokenizer):
    req = SequenceRequest("s", (1, 2, 3), 1)
    seq = Sequence(req, lambda e: None, tokenizer, tokenizer.vocab_size, (EOS,))
    _, _, reason, _ = seq.accept(np.zeros(tokenizer.vocab_size, dtype=np.float32))
    assert seq.completed(reason).constraint_satisfied is None
