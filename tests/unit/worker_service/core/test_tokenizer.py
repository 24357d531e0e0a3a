"""Tokenizer, chat template, incremental detokenization and stop-sequence hold-back."""

from __future__ import annotations

import functools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.models import prepared_model_dir
from worker_service.core.errors import InvalidWorkerField
from worker_service.core.tokenizer import IncrementalDetokenizer, StopTextStream, Tokenizer

MULTIBYTE = "héllo wörld 日本語 🙂 — ça va? 𝄞"


@functools.cache
def load_tiny_tokenizer() -> Tokenizer:
    return Tokenizer(prepared_model_dir("tiny-llama"))


@pytest.fixture(scope="module")
def tiny_tokenizer() -> Tokenizer:
    return load_tiny_tokenizer()


def stream_deltas(tok: Tokenizer, ids: list[int], prompt_ids: list[int] | None = None) -> list[str]:
    detok = IncrementalDetokenizer(tok, prompt_ids)
    return [detok.push(i) for i in ids] + [detok.flush()]


def test_encode_adds_no_special_tokens_and_round_trips(tiny_tokenizer):
    ids = tiny_tokenizer.encode("Hello world")
    assert tiny_tokenizer.decode(ids) == "Hello world"
    assert tiny_tokenizer.encode("") == []


def test_chat_template_renders_turns_with_a_generation_prompt(tiny_tokenizer):
    text = tiny_tokenizer.render_chat([("user", "What is 2+2?")])
    assert "What is 2+2?" in text
    assert text.rstrip().endswith("assistant")  # SmolLM2: "<|im_start|>assistant\n"
    ids = tiny_tokenizer.encode_chat([("user", "What is 2+2?")])
    assert tiny_tokenizer.decode(ids, skip_special_tokens=False) == text


def test_deltas_never_split_a_character_and_concatenate_to_the_decode(tiny_tokenizer):
    ids = tiny_tokenizer.encode(MULTIBYTE)
    deltas = stream_deltas(tiny_tokenizer, ids)
    assert "".join(deltas) == tiny_tokenizer.decode(ids) == MULTIBYTE
    assert not any("\ufffd" in d for d in deltas)
    # The test means something only if some token is a partial character on its own.
    assert any("\ufffd" in tiny_tokenizer.decode([i]) for i in ids)
    assert "" in deltas[:-1]


def test_prompt_context_does_not_leak_into_deltas(tiny_tokenizer):
    prompt = tiny_tokenizer.encode_chat([("user", "Say something")])
    ids = tiny_tokenizer.encode(" " + MULTIBYTE)
    deltas = stream_deltas(tiny_tokenizer, ids, prompt)
    assert "".join(deltas) == tiny_tokenizer.decode(ids)


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_deltas_concatenate_to_the_decode_for_any_text(text):
    tok = load_tiny_tokenizer()
    ids = tok.encode(text)
    deltas = stream_deltas(tok, ids)
    assert "".join(deltas) == tok.decode(ids)
    if "\ufffd" not in tok.decode(ids):  # the tokenizer cannot encode a few unassigned code points
        assert not any("\ufffd" in d for d in deltas)


def push_all(stream: StopTextStream, ids: list[int], **kw) -> list[str]:
    out = [stream.push(i, **kw) for i in ids[:-1]]
    if stream.stop_sequence:
        return out
    return [*out, stream.push(ids[-1], final=True, **kw)]


def test_stop_sequence_and_what_follows_are_never_emitted(tiny_tokenizer):
    ids = tiny_tokenizer.encode("The answer is Paris. END of answer, more text")
    stream = StopTextStream(tiny_tokenizer, None, ["END"])
    deltas = []
    for i in ids:
        deltas.append(stream.push(i))
        if stream.stop_sequence:
            break
    assert stream.stop_sequence == "END"
    assert "".join(deltas) == stream.text == "The answer is Paris. "


def test_text_that_may_begin_a_stop_sequence_is_held_back(tiny_tokenizer):
    stream = StopTextStream(tiny_tokenizer, None, ["<stop here>"])
    emitted = "".join(stream.push(i) for i in tiny_tokenizer.encode("abc <stop"))
    assert emitted == "abc "  # "<stop" may still become "<stop here>"
    emitted += "".join(push_all(stream, tiny_tokenizer.encode(" there")))
    assert stream.stop_sequence == ""
    assert emitted == stream.text == "abc <stop there"


def test_earliest_of_several_stop_sequences_wins(tiny_tokenizer):
    stream = StopTextStream(tiny_tokenizer, None, ["world", "lo"])
    out = "".join(push_all(stream, tiny_tokenizer.encode("hello world")))
    assert (stream.stop_sequence, out, stream.text) == ("lo", "hel", "hel")


def test_stop_sequences_before_min_new_tokens_do_not_count(tiny_tokenizer):
    ids = tiny_tokenizer.encode("a END b END c")
    stream = StopTextStream(tiny_tokenizer, None, ["END"])
    first = tiny_tokenizer.encode("a END")
    out = [stream.push(i, stops_armed=False) for i in first]
    rest = ids[len(first):]
    assert tiny_tokenizer.decode(first + rest) == "a END b END c"
    out += [stream.push(i) for i in rest]  # pushes after the match add nothing
    assert stream.stop_sequence == "END"
    assert "".join(out) == stream.text == "a END b "


@settings(max_examples=300, deadline=None)
@given(ids=st.lists(st.one_of(st.integers(0, 49151), st.integers(0, 300)), max_size=16),
       prompt=st.lists(st.integers(0, 49151), max_size=8))
def test_deltas_concatenate_to_the_decode_for_any_ids(ids, prompt):
    # Any ids at all: lone UTF-8 continuation bytes, special tokens, prompts that end
    # inside a character. Small ids are byte-level pieces, the likeliest to split a character.
    tok = load_tiny_tokenizer()
    assert "".join(stream_deltas(tok, ids, prompt)) == tok.decode(ids)


def test_stop_text_stream_output_equals_the_decode_without_stops(tiny_tokenizer):
    ids = tiny_tokenizer.encode(MULTIBYTE)
    stream = StopTextStream(tiny_tokenizer, tiny_tokenizer.encode("prompt"), ())
    assert "".join(push_all(stream, ids)) == stream.text == MULTIBYTE


def template_folder(tmp_path, template: str, **config) -> Tokenizer:
    """The tiny model's tokenizer with another chat template."""
    src = prepared_model_dir("tiny-llama")
    (tmp_path / "tokenizer.json").write_bytes((src / "tokenizer.json").read_bytes())
    base = json.loads((src / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**base, **config}))
    (tmp_path / "chat_template.jinja").write_text(template)
    return Tokenizer(tmp_path)


def test_chat_template_may_use_loop_controls_and_the_generation_tag(tmp_path):
    tok = template_folder(tmp_path, (
        "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
        "{% if loop.index > 3 %}{% break %}{% endif %}"
        "{% generation %}[{{ m.role }}:{{ m.content }}]{% endgeneration %}{% endfor %}"))
    text = tok.render_chat([("system", "s"), ("user", "a"), ("assistant", "b"), ("user", "c")])
    assert text == "[user:a][assistant:b]"


def test_chat_template_sees_the_variables_transformers_passes(tmp_path):
    tok = template_folder(tmp_path, (
        "{{ unk_token }}|{{ pad_token }}|{{ bos_token }}|{{ tools is none }}|"
        "{{ documents is none }}|{{ add_generation_prompt }}|"
        "{{ messages[0] | tojson(indent=1, sort_keys=True) }}|{{ '<&>' | tojson }}|"
        "{% set ns = namespace(n=1) %}{{ ns.n }}|{{ dict(a=1) | tojson }}"))
    text = tok.render_chat([("user", "é")])
    assert text == ('<|endoftext|>|<|im_end|>|<|im_start|>|True|True|True|'
                    '{\n "content": "é",\n "role": "user"\n}|"<&>"|1|{"a": 1}')


def test_chat_template_namespaces_refuse_underscore_attributes(tmp_path):
    tok = template_folder(tmp_path, "{% set ns = namespace(_x=1) %}{{ ns._x }}")
    with pytest.raises(InvalidWorkerField) as info:
        tok.render_chat([("user", "x")])
    assert "underscore" in str(info.value)


class FailingStreamTokenizer(Tokenizer):
    """A tokenizer whose DecodeStream refuses every other step (its invalid-prefix error)."""

    def decode_stream(self, prefix_ids=()):
        step, calls = super().decode_stream(prefix_ids), [0]

        def flaky(token_id):
            calls[0] += 1
            if calls[0] % 2 == 0:
                raise Exception("DecodeStream: invalid prefix")
            return step(token_id)
        return flaky


def test_a_decode_stream_error_falls_back_to_window_decoding():
    tok = FailingStreamTokenizer(prepared_model_dir("tiny-llama"))
    ids = tok.encode("plain words " + MULTIBYTE)
    deltas = stream_deltas(tok, ids, tok.encode("context"))
    assert "".join(deltas) == tok.decode(ids)


def test_token_bytes_are_exact_and_join_to_the_text(tiny_tokenizer):
    # The logprobs' `bytes`: a piece of a multi-byte character is its own bytes, and the
    # pieces of a text join to exactly its UTF-8.
    ids = tiny_tokenizer.encode(MULTIBYTE)
    pieces = [tiny_tokenizer.token_bytes(i) for i in ids]
    assert b"".join(pieces) == MULTIBYTE.encode()
    assert any(not _decodes(p) for p in pieces)  # some piece splits a character


def test_token_bytes_of_a_special_token_is_its_content(tiny_tokenizer):
    eos = tiny_tokenizer.eos_token
    (eos_id,) = tiny_tokenizer._tok.encode(eos, add_special_tokens=False).ids
    assert tiny_tokenizer.token_bytes(eos_id) == eos.encode()
    assert tiny_tokenizer.token_bytes(10**7) == b""  # beyond the tokenizer's vocabulary


def _decodes(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True
