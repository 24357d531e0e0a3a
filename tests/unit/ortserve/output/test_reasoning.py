"""The reasoning parser: text deltas in, (reasoning, content) deltas out, at any split."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ortserve.output.reasoning import (
    ReasoningParser,
    family_of_template,
    prompt_opens_reasoning,
)

CASES = [
    # (output, opens_reasoning, reasoning, content)
    ("<think>\nplan it\n</think>\n\nThe answer.", False, "\nplan it\n", "The answer."),
    ("  <think>a</think>b", False, "a", "b"),
    ("plan it</think>\n\nThe answer.", True, "plan it", "The answer."),
    ("no tags at all", False, "", "no tags at all"),
    ("still thinking when cut", True, "still thinking when cut", ""),
    ("<think>cut inside </thi", False, "cut inside </thi", ""),
    ("<thin", False, "", "<thin"),  # a cut tag is text
    ("x <think>late</think>", False, "", "x <think>late</think>"),  # tags only at the start
    ("a</think></think>b", True, "a", "</think>b"),
]


def run(chunks, opens):
    parser = ReasoningParser("think", opens)
    parts = [parser.feed(c) for c in chunks] + [parser.close()]
    return "".join(r for r, _ in parts), "".join(c for _, c in parts)


@pytest.mark.parametrize("output, opens, reasoning, content", CASES)
def test_whole_and_char_by_char(output, opens, reasoning, content):
    assert run([output], opens) == (reasoning, content)
    assert run(list(output), opens) == (reasoning, content)


@given(st.sampled_from(CASES), st.lists(st.integers(0, 60), max_size=8))
def test_any_split_gives_the_same_parts(case, cuts):
    output, opens, reasoning, content = case
    points = sorted({min(c, len(output)) for c in cuts})
    chunks = [output[a:b] for a, b in zip([0, *points], [*points, len(output)], strict=True)]
    assert run(chunks, opens) == (reasoning, content)


def test_no_tag_text_leaks_while_a_tag_is_undecided():
    parser = ReasoningParser("think", opens_reasoning=True)
    assert parser.feed("abc</th") == ("abc", "")
    assert parser.in_reasoning
    assert parser.feed("ink>\n") == ("", "")
    assert parser.ended_reasoning and parser.feed("Hi") == ("", "Hi")


def test_family_and_open_prompt():
    assert family_of_template("{{ '<think>' }}...{{ '</think>' }}") == "think"
    assert family_of_template("{{ messages }}") == ""
    assert prompt_opens_reasoning("think", "<|assistant|>\n<think>\n")
    assert not prompt_opens_reasoning("think", "<|assistant|>\n<think>\n\n</think>\n\n")
    assert not prompt_opens_reasoning("think", "<|assistant|>\n")
    assert not prompt_opens_reasoning("", "<think>")
    with pytest.raises(ValueError):
        ReasoningParser("pythonic")


def test_reasoning_tokens_are_the_chunks_inside_the_block():
    from gateway.reply.reasoning_split import ChoiceReasoning

    opened = ChoiceReasoning("think", opens_reasoning=True)
    for chunk in ("plan", " more", "</", "think", ">", "\n\n", "Hi"):
        opened.feed(chunk, 1)
    assert opened.tokens == 5  # up to the token that completes the closing tag
    plain = ChoiceReasoning("think", opens_reasoning=False)
    for chunk in ("no", " tags"):
        plain.feed(chunk, 1)
    assert plain.tokens == 0
    at_once = ChoiceReasoning("think", opens_reasoning=False)
    at_once.feed("<think></think>", 2)
    at_once.feed("answer", 1)
    assert at_once.tokens == 2


def test_the_workers_count_ends_with_the_token_that_completes_the_closing_tag():
    from ortserve.output.reasoning import ReasoningTokenCounter

    # The prompt opened the reasoning; the tag comes over three tokens, the last of them
    # with the answer's first bytes in it.
    counter = ReasoningTokenCounter("think", opens_reasoning=True)
    for piece in [b"hmm", b" yes", b"</", b"thi", b"nk>\n\nThe", b" answer", b"."]:
        counter.push(piece)
    assert counter.tokens == 5
    # The model opens it itself (whitespace before the tag is not reasoning), and a block
    # opened and closed in one token is one token.
    counter = ReasoningTokenCounter("think")
    for piece in [b"\n", b"<th", b"ink>", b"ok", b"</think>", b"Hi"]:
        counter.push(piece)
    assert counter.tokens == 4
    counter = ReasoningTokenCounter("think")
    for piece in [b"<think></think>", b"Hi"]:
        counter.push(piece)
    assert counter.tokens == 1
    # No block: an answer from the first token has no reasoning; one never closed is all.
    counter = ReasoningTokenCounter("think")
    for piece in [b"Hi", b"<think>", b"x"]:
        counter.push(piece)
    assert counter.tokens == 0
    counter = ReasoningTokenCounter("think", opens_reasoning=True)
    for piece in [b"a", b"b", b"</thin"]:
        counter.push(piece)
    assert counter.tokens == 3


def test_the_gateway_reports_the_workers_count_over_its_own_per_chunk_one():
    from gateway.reply.reasoning_split import ChoiceReasoning
    from ortserve.v1 import types_pb2

    split = ChoiceReasoning("think", opens_reasoning=True)
    split.feed("hmm", 1)
    split.feed(" yes</think>\n\nThe answer.", 6)  # one chunk: 3 reasoning tokens, 3 answer
    assert split.tokens == 7  # per chunk: the crossing chunk counted whole
    split.finished(types_pb2.Usage(generated_tokens=7))  # an older worker: no count sent
    assert split.tokens == 7
    split.finished(types_pb2.Usage(generated_tokens=7, reasoning_tokens=4))
    assert split.tokens == 4
