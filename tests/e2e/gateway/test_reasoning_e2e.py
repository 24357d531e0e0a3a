"""End to end with the openai and anthropic clients: a reasoning model's answers split
into reasoning and answer, streamed and not, with its reasoning tokens counted, in chat
(reasoning_content), Responses (reasoning items) and Messages (thinking blocks).

The model is the tiny random one in a folder made here with a Qwen3-style chat
template: its generation prompt opens <think> (closes it at once under
enable_thinking false) and it reads reasoning_effort. A random model never writes
</think> by itself, so the requests force an output that closes the reasoning with a
regex (vLLM's structured_outputs, through extra_body): the gateway's parser still sees
only the model's real tokens, the tag split over several of them, and a second gateway
with --reasoning-parser none shows the raw text the split must add up to.
"""

from __future__ import annotations

import anthropic
import pytest

from devtools.cluster import LocalCluster, model_cache, stop_service
from tests.e2e.gateway.test_gateway_e2e import openai_client, start_gateway, wait_reserved_zero

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

MODEL = "tiny-think"
TEMPLATE = (
    "{% for message in messages %}{% set content = message['content'] %}"
    "{% if message['role'] == 'assistant' and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1].lstrip('\\n') %}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if reasoning_effort is defined %}{{ 'Effort: ' + reasoning_effort + '\\n' }}{% endif %}"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{% else %}{{ '<think>\\n' }}{% endif %}{% endif %}"
)
MESSAGES = [{"role": "user", "content": "Think, then answer."}]
# The forced output: reasoning, the closing tag (several tokens), the answer. The reasoning
# is long enough to outlast the start of a stream: the tokens the tiny model makes before
# the gateway first reads leave together (a reader behind gets what piled up in one chunk,
# types.proto's stream_interval_ms), and only after that does each token leave alone.
SPLIT = {"structured_outputs": {"regex": "[a-z]{40,60}</think>\n\n[a-z]{4,10}"}}
SPLIT_MAX_TOKENS = 120  # room for all of it


@pytest.fixture(scope="module")
def think(tmp_path_factory):
    tiny = model_cache() / "models" / "tiny-llama"
    if not (tiny / "genai_config.json").exists():
        pytest.fail(f"the tiny model is not prepared at {tiny}: run `make tiny-model`")
    folder = tmp_path_factory.mktemp("models") / MODEL
    folder.mkdir()
    for name in ("genai_config.json", "model.onnx", "model.onnx.data", "tokenizer.json",
                 "tokenizer_config.json"):
        (folder / name).symlink_to(tiny / name)
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    cluster = LocalCluster(model_dir=folder, workers=1, threads=1, kv_capacities=["8MiB"],
                           log_dir=tmp_path_factory.mktemp("logs-reasoning")).start()
    yield cluster
    cluster.stop()


# One token per chunk (the gateway's default coalesces the tokens of 20 ms into one event),
# so the streamed splits below are token by token; the reasoning count is the worker's,
# exact at any chunking (chunky_gateway).
PER_TOKEN = ("--stream-interval-ms", "0")


@pytest.fixture(scope="module")
def gateway(think, tmp_path_factory):
    service = start_gateway(tmp_path_factory, think.address, PER_TOKEN)
    yield service
    stop_service(service)


@pytest.fixture(scope="module")
def chunky_gateway(think, tmp_path_factory):
    # Two-second chunks: the forced output leaves in a few chunks, one of them crossing the
    # closing tag (reasoning tokens, the tag, answer tokens together).
    service = start_gateway(tmp_path_factory, think.address, ("--stream-interval-ms", "2000"))
    yield service
    stop_service(service)


@pytest.fixture(scope="module")
def raw_gateway(think, tmp_path_factory):
    service = start_gateway(tmp_path_factory, think.address,
                            ("--reasoning-parser", "none", *PER_TOKEN))
    yield service
    stop_service(service)


def create(gateway, **kw):
    return openai_client(gateway).chat.completions.create(
        model=MODEL, messages=MESSAGES, temperature=0, **kw)


def raw_split(raw_gateway) -> tuple[str, int]:
    """The unsplit text of the forced output (from a --reasoning-parser none gateway) and
    its tokens up to the one that completes the closing tag: the reasoning tokens the
    worker counts (Finished.usage.reasoning_tokens), however the tokens are chunked."""
    raw = create(raw_gateway, max_tokens=SPLIT_MAX_TOKENS, logprobs=True, extra_body=SPLIT)
    raw_text = raw.choices[0].message.content
    assert "</think>" in raw_text and raw.model_extra["ortserve"]["finished"]["constraint"][
        "satisfied"]
    seen = b""
    for i, token in enumerate(raw.choices[0].logprobs.content):
        seen += bytes(token.bytes)
        if b"</think>" in seen:
            return raw_text, i + 1
    raise AssertionError(f"no closing tag in {raw_text!r}")


def test_reasoning_is_split_from_the_answer_and_counted(gateway, raw_gateway, think):
    raw = create(raw_gateway, max_tokens=SPLIT_MAX_TOKENS, extra_body=SPLIT)
    raw_text, closing = raw_split(raw_gateway)
    answer = create(gateway, max_tokens=SPLIT_MAX_TOKENS, extra_body=SPLIT)
    message = answer.choices[0].message
    reasoning = message.model_extra["reasoning_content"]
    assert reasoning and message.content and "think>" not in reasoning + message.content
    assert raw_text == reasoning + "</think>\n\n" + message.content
    assert answer.model_extra["ortserve"]["reasoning_format"] == "think"
    details = answer.usage.completion_tokens_details
    assert answer.usage.completion_tokens == raw.usage.completion_tokens
    assert details.reasoning_tokens == closing < answer.usage.completion_tokens
    assert wait_reserved_zero(think.address) == 0


def test_streamed_reasoning_comes_apart_and_first(gateway):
    whole = create(gateway, max_tokens=SPLIT_MAX_TOKENS, extra_body=SPLIT).choices[0].message
    chunks = list(create(gateway, max_tokens=SPLIT_MAX_TOKENS, stream=True, extra_body=SPLIT,
                         stream_options={"include_usage": True}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    thoughts = [d.model_extra.get("reasoning_content") for d in deltas]
    texts = [d.content for d in deltas]
    assert not any(t and c for t, c in zip(thoughts, texts, strict=True))  # never both
    last_thought = max(i for i, t in enumerate(thoughts) if t)
    assert all(not c for c in texts[:last_thought])  # the answer only after the reasoning
    assert "".join(t or "" for t in thoughts) == whole.model_extra["reasoning_content"]
    assert "".join(c or "" for c in texts) == whole.content
    assert len([t for t in thoughts if t]) > 1  # it streamed, not one block at the end
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens > 0


def test_a_chunk_across_the_closing_tag_counts_only_its_reasoning_tokens(chunky_gateway,
                                                                        raw_gateway):
    # Counted per chunk (the gateway's way before the worker counted), a chunk that holds
    # the end of the reasoning and the start of the answer counted whole, as reasoning.
    _, closing = raw_split(raw_gateway)
    chunks = list(create(chunky_gateway, max_tokens=SPLIT_MAX_TOKENS, stream=True,
                         extra_body=SPLIT, stream_options={"include_usage": True}))
    texts = [c.choices[0].delta.content for c in chunks if c.choices]
    assert any(texts)  # the answer came, and after the reasoning in the same chunk or later
    usage = chunks[-1].usage
    assert usage.completion_tokens_details.reasoning_tokens == closing < usage.completion_tokens
    answer = create(chunky_gateway, max_tokens=SPLIT_MAX_TOKENS, extra_body=SPLIT)
    assert answer.usage.completion_tokens_details.reasoning_tokens == closing
    response = respond(chunky_gateway, store=False)
    assert response.usage.output_tokens_details.reasoning_tokens == closing
    assert response.usage.output_tokens > closing


def test_reasoning_tokens_count_toward_the_cap_like_any_other(gateway):
    answer = create(gateway, max_tokens=5)  # the open reasoning never closes in 5 tokens
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage.completion_tokens == 5
    assert answer.usage.completion_tokens_details.reasoning_tokens == 5
    assert answer.choices[0].message.model_extra["reasoning_content"]
    assert not answer.choices[0].message.content
    assert answer.model_extra["ortserve"]["max_new_tokens"] == 5


def test_enable_thinking_false_reaches_the_template_and_the_answer_is_content(gateway):
    answer = create(gateway, max_tokens=20, extra_body={
        "chat_template_kwargs": {"enable_thinking": False},
        "structured_outputs": {"regex": "[a-z]{4,10}"}})
    message = answer.choices[0].message
    assert message.content and message.model_extra.get("reasoning_content") is None
    assert answer.usage.completion_tokens_details.reasoning_tokens == 0


def test_reasoning_effort_reaches_a_template_that_reads_it(gateway):
    low = create(gateway, max_tokens=3, reasoning_effort="low")
    none = create(gateway, max_tokens=3)
    # The template writes "Effort: low" into the prompt: the prompt is longer by those tokens.
    assert low.usage.prompt_tokens > none.usage.prompt_tokens


def test_a_template_variable_the_template_does_not_read_is_accepted_and_named(gateway):
    # As vLLM and SGLang take it (issue 52): it changes nothing, and the answer says so.
    answer = openai_client(gateway).chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, temperature=0, max_tokens=3,
        extra_body={"chat_template_kwargs": {"thinking_budget": 9}})
    assert answer.headers["x-ortserve-template-kwargs-unread"] == "thinking_budget"
    assert answer.parse().model_extra["ortserve"]["template_kwargs_unread"] == ["thinking_budget"]


# -- Responses: reasoning items -------------------------------------------------------


def respond(gateway, **kw):
    return openai_client(gateway).responses.create(
        model=MODEL, input=MESSAGES[0]["content"], temperature=0, max_output_tokens=SPLIT_MAX_TOKENS,
        extra_body=SPLIT, **kw)


def test_a_response_has_a_reasoning_item_before_its_message(gateway, raw_gateway, think):
    raw_text, closing = raw_split(raw_gateway)
    for store in (False, True):  # a plain Generate both (stored: its prefix kept)
        response = respond(gateway, store=store)
        assert [item.type for item in response.output] == ["reasoning", "message"]
        reasoning = response.output[0]
        assert reasoning.summary == [] and [c.type for c in reasoning.content] == [
            "reasoning_text"]
        thought = reasoning.content[0].text
        assert thought and response.output_text and "think>" not in thought + response.output_text
        assert raw_text == thought + "</think>\n\n" + response.output_text
        details = response.usage.output_tokens_details
        assert details.reasoning_tokens == closing < response.usage.output_tokens
        assert response.model_extra["ortserve"]["session"]["kept"] is False
    openai_client(gateway).responses.delete(response.id)
    assert wait_reserved_zero(think.address) == 0


def test_a_streamed_response_streams_reasoning_first_then_text(gateway, raw_gateway):
    raw_text, _ = raw_split(raw_gateway)
    events = list(respond(gateway, stream=True, store=False))
    kinds = [e.type for e in events]
    thoughts = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    texts = [e.delta for e in events if e.type == "response.output_text.delta"]
    # It streamed, not one block at the end: reasoning deltas before the first text delta
    # (a loaded machine may coalesce the thoughts' tokens into one chunk: a count says nothing).
    assert thoughts and texts
    assert max(i for i, k in enumerate(kinds) if k == "response.reasoning_text.delta") < \
        min(i for i, k in enumerate(kinds) if k == "response.output_text.delta")
    assert raw_text == "".join(thoughts) + "</think>\n\n" + "".join(texts)
    done = events[-1]
    assert done.type == "response.completed"
    assert [item.type for item in done.response.output] == ["reasoning", "message"]
    assert done.response.output[0].content[0].text == "".join(thoughts)
    assert done.response.usage.output_tokens_details.reasoning_tokens > 0


# -- Messages: thinking blocks --------------------------------------------------------


def message(gateway, **kw):
    kw["extra_body"] = {"temperature": 0, **kw.get("extra_body", SPLIT)}
    kw.setdefault("max_tokens", SPLIT_MAX_TOKENS)
    return anthropic.Anthropic(base_url=f"http://{gateway.address}", api_key="unused",
                               timeout=120).messages.create(model=MODEL, messages=MESSAGES, **kw)


def test_a_message_has_a_thinking_block_before_its_text(gateway, raw_gateway, think):
    raw_text, _ = raw_split(raw_gateway)
    answer = message(gateway)
    assert [b.type for b in answer.content] == ["thinking", "text"]
    thinking, text = answer.content[0].thinking, answer.content[1].text
    assert thinking and text and "think>" not in thinking + text
    assert raw_text == thinking + "</think>\n\n" + text
    assert answer.stop_reason == "end_turn"
    assert wait_reserved_zero(think.address) == 0


def test_a_streamed_message_streams_thinking_deltas_then_text(gateway, raw_gateway):
    raw_text, _ = raw_split(raw_gateway)
    events = list(message(gateway, stream=True))
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    thoughts = [d.thinking for d in deltas if d.type == "thinking_delta"]
    texts = [d.text for d in deltas if d.type == "text_delta"]
    assert len(thoughts) > 1 and texts
    assert [d.type for d in deltas] == ["thinking_delta"] * len(thoughts) + [
        "text_delta"] * len(texts)
    assert raw_text == "".join(thoughts) + "</think>\n\n" + "".join(texts)
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert starts == ["thinking", "text"]


def test_thinking_disabled_reaches_the_template_and_enabled_says_what_the_budget_is(gateway):
    off = message(gateway, max_tokens=20, thinking={"type": "disabled"},
                  extra_body={"structured_outputs": {"regex": "[a-z]{4,10}"}})
    assert [b.type for b in off.content] == ["text"] and off.content[0].text
    on = message(gateway, thinking={"type": "enabled", "budget_tokens": 30})
    assert [b.type for b in on.content] == ["thinking", "text"]
    note = on.model_extra["ortserve"]["resolved"]["thinking.budget_tokens"]
    assert "not a separate limit" in note and f"max_tokens ({SPLIT_MAX_TOKENS})" in note


def test_thinking_enabled_is_refused_where_it_cannot_be_honoured(raw_gateway, think):
    with pytest.raises(anthropic.BadRequestError) as info:
        message(raw_gateway, thinking={"type": "enabled", "budget_tokens": 30})
    assert info.value.body["error"]["message"].startswith("thinking: ")
    assert "--reasoning-parser none" in info.value.body["error"]["message"]
    assert wait_reserved_zero(think.address) == 0
