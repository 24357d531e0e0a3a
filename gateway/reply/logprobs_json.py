"""TokenLogprob messages -> OpenAI's logprobs JSON (pure: no HTTP, no grpc).

Chat: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}`.
Completions (the legacy shape): `{"tokens", "token_logprobs", "top_logprobs",
"text_offset"}`, where `top_logprobs` maps each alternative's text to its
logprob (the chosen token included, as vLLM does; tokens of equal text
collapse, a limit of the legacy shape) and `text_offset` is the character
offset at which each token starts in the choice's text.

One entry per generated token, an ending EOS included (usage counts it too).
JSON has no -inf: a token the sampler could not choose reports -9999.0 (vLLM's
convention).
"""

from __future__ import annotations

import codecs
import math
from collections.abc import Iterable

from gateway.request.translate import Kind
from ortserve.v1 import types_pb2

LOGPROB_FLOOR = -9999.0


def _finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else LOGPROB_FLOOR


def chat_entry(pb: types_pb2.TokenLogprob) -> dict:
    """One token of chat's `logprobs.content`."""
    return {"token": pb.token, "logprob": _finite(pb.logprob), "bytes": list(pb.token_bytes),
            "top_logprobs": [{"token": t.token, "logprob": _finite(t.logprob),
                              "bytes": list(t.token_bytes)} for t in pb.top_logprobs]}


class ChoiceLogprobs:
    """One choice's logprobs as its chunks arrive: `take` shapes what is pending (a
    streamed chunk's), `whole` everything (a non-streamed answer)."""

    def __init__(self, kind: Kind) -> None:
        self.kind = kind
        self._entries: list[tuple[types_pb2.TokenLogprob, int]] = []  # (entry, text offset)
        self._pending = 0  # entries at the end not yet sent
        # Completions' text_offset: characters of the output before each token, counted
        # as the bytes arrive (a token inside a character starts where that character does).
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._chars = 0

    def add(self, entries: Iterable[types_pb2.TokenLogprob]) -> None:
        for pb in entries:
            self._entries.append((pb, self._chars))
            self._chars += len(self._decoder.decode(pb.token_bytes))
            self._pending += 1

    def take(self) -> dict | None:
        """The pending entries in the response's shape, or None when there are none."""
        if not self._pending:
            return None
        pending = self._entries[len(self._entries) - self._pending:]
        self._pending = 0
        return self._shape(pending)

    def whole(self) -> dict:
        self._pending = 0
        return self._shape(self._entries)

    def _shape(self, entries: list[tuple[types_pb2.TokenLogprob, int]]) -> dict:
        if self.kind == "chat":
            return {"content": [chat_entry(pb) for pb, _ in entries]}
        top = []
        for pb, _ in entries:
            alternatives = {t.token: _finite(t.logprob) for t in pb.top_logprobs}
            alternatives.setdefault(pb.token, _finite(pb.logprob))
            top.append(alternatives)
        return {"tokens": [pb.token for pb, _ in entries],
                "token_logprobs": [_finite(pb.logprob) for pb, _ in entries],
                "top_logprobs": top, "text_offset": [offset for _, offset in entries]}
