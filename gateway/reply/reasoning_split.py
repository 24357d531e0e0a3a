"""One chat choice's output split into reasoning and answer, with its reasoning tokens
counted (pure: no HTTP, no grpc). The parser is ortserve/output/reasoning.py's; which family,
and whether the output starts inside the reasoning, the Admission says (the worker that
counted the prompt read its model's chat template and the rendered prompt's end).

The count reported is the worker's where it sent one (Finished.usage.reasoning_tokens:
it sees each token's bytes, so it is exact however tokens were chunked). Else, from an
older worker, reasoning tokens are counted per chunk here: a chunk's tokens are reasoning
when the output was inside the reasoning as it began or it opened or continued it (the
chunk that closes the block counts as reasoning, tags included). A chunk of several tokens
(the gateway read behind the worker, or --stream-interval-ms) that crosses the closing tag
is then counted whole, as reasoning: an over-count by the answer tokens in it.
"""

from __future__ import annotations

from ortserve.output.reasoning import ReasoningParser
from ortserve.v1 import types_pb2

MODES = ("auto", "none")  # --reasoning-parser: the template's family, or never split


class ChoiceReasoning:
    def __init__(self, family: str, opens_reasoning: bool) -> None:
        self._parser = ReasoningParser(family, opens_reasoning)
        self.tokens = 0  # reasoning tokens so far

    @classmethod
    def for_choice(cls, kind: str, adm: types_pb2.Admission, mode: str = "auto"
                   ) -> ChoiceReasoning | None:
        """A splitter for a chat choice whose model's template writes reasoning; else None."""
        if kind != "chat" or mode == "none" or not adm.reasoning_format:
            return None
        return cls(adm.reasoning_format, adm.prompt_opens_reasoning)

    def feed(self, text: str, n_tokens: int) -> tuple[str, str]:
        """A chunk's text and token count -> (reasoning delta, content delta)."""
        was_inside, was_ended = self._parser.in_reasoning, self._parser.ended_reasoning
        reasoning, content = self._parser.feed(text)
        # Inside before or after, or it opened and closed the block at once ("<think></think>").
        if was_inside or reasoning or self._parser.in_reasoning or \
                (self._parser.ended_reasoning and not was_ended):
            self.tokens += n_tokens
        return reasoning, content

    def close(self) -> tuple[str, str]:
        return self._parser.close()

    def finished(self, usage: types_pb2.Usage) -> None:
        """The output's Finished usage: the worker's exact count replaces the per-chunk one
        where it sent one."""
        if usage.HasField("reasoning_tokens"):
            self.tokens = usage.reasoning_tokens

    @property
    def reasoning(self) -> str:
        return self._parser.reasoning
