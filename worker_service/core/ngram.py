"""Prompt-lookup drafting: propose the next tokens by finding the sequence's own tail
earlier in it (prompt and output), no second model.

Output that copies from its input (quoting, editing, extraction, JSON that
repeats keys) continues the way an earlier occurrence of its last few tokens
did. The proposer matches the last n tokens (longest n first, `max_ngram`
down to `min_ngram`) against every earlier position and proposes what
followed the most recent match. An index of n-gram -> where it last ended is
kept up to date as tokens arrive, so a proposal costs O(n + k), not a scan of
the sequence (the approach of the "prompt lookup decoding" method that
transformers' `prompt_lookup_num_tokens` and vLLM's n-gram proposer use; the
index is ours).

`AdaptiveDraft` sizes each sequence's next proposal from how its recent ones
fared, and proposes nothing for a while when they keep failing.

Pure Python: no ORT, no grpc.
"""

from __future__ import annotations

from collections.abc import Sequence


class NgramProposer:
    """One sequence's n-gram index over its tokens; `propose` reads the tail.

    The index maps each n-gram (n in [min_ngram, max_ngram]) to the position just
    after its most recent occurrence that ends before the sequence's last token,
    so the tail itself is never its own match.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"n-gram sizes need 1 <= min_ngram <= max_ngram, got "
                             f"{min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self._ends: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # n-grams ending at positions < this are in the index

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to `k` tokens that followed the latest earlier occurrence of the longest
        matching tail of `tokens`; [] when no tail of min_ngram or more tokens recurs.

        `tokens` must only grow between calls (prompt + output: it does).
        """
        length = len(tokens)
        if k < 1 or length < self.min_ngram + 1:
            return []
        self._index_up_to(tokens, length)
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            start = self._ends.get(tuple(tokens[length - n:]))
            if start is not None:
                return list(tokens[start:min(start + k, length)])
        return []

    def _index_up_to(self, tokens: Sequence[int], end: int) -> None:
        """Index the n-grams whose exclusive end is in [self._indexed, end): `end` is the
        tail's own end, so the tail is never indexed before it is matched."""
        for stop in range(max(self._indexed, 1), end):
            for n in range(self.min_ngram, min(self.max_ngram, stop) + 1):
                self._ends[tuple(tokens[stop - n:stop])] = stop
        self._indexed = max(self._indexed, end)


class AdaptiveDraft:
    """How many tokens one sequence proposes next, from how its recent proposals fared.

    A proposal wholly accepted grows the next by `grow` (to `max_k`); a partly
    accepted one sets it to what was accepted plus one (the length that would
    have been right, and one more to probe); one with nothing accepted counts a
    miss, and `misses_to_pause` misses in a row pause proposals for
    `pause_steps` steps, doubling each time it happens again (up to
    `max_pause_steps`), so a sequence whose output does not copy stops paying
    for verification. Any accepted token resets the misses and the pause length.
    """

    def __init__(self, max_k: int = 8, start_k: int = 4, grow: int = 2,
                 misses_to_pause: int = 3, pause_steps: int = 8,
                 max_pause_steps: int = 128) -> None:
        if not 1 <= start_k <= max_k:
            raise ValueError(f"need 1 <= start_k <= max_k, got {start_k}, {max_k}")
        self.max_k = max_k
        self.k = start_k
        self.grow = grow
        self.misses_to_pause = misses_to_pause
        self.first_pause_steps = pause_steps
        self.max_pause_steps = max_pause_steps
        self._pause_steps = pause_steps
        self._misses = 0
        self._paused = 0  # steps left without proposals
        # The mean accepted tokens per verification, recent ones weighing most: what the
        # engine's cost rule expects the next one to gain.
        self.expected_accepted = float(start_k) / 2

    def next_k(self) -> int:
        """The size of this step's proposal (0: propose nothing); one call per step."""
        if self._paused:
            self._paused -= 1
            return 0
        return self.k

    def record(self, proposed: int, accepted: int) -> None:
        """A verification of `proposed` tokens kept the first `accepted` of them."""
        if not 0 <= accepted <= proposed or proposed < 1:
            raise ValueError(f"accepted {accepted} of {proposed} proposed tokens")
        self.expected_accepted += 0.3 * (accepted - self.expected_accepted)
        if accepted == proposed:
            self.k = min(self.max_k, self.k + self.grow)
        else:
            self.k = max(1, min(self.max_k, accepted + 1))
        if accepted:
            self._misses = 0
            self._pause_steps = self.first_pause_steps
            return
        self._misses += 1
        if self._misses >= self.misses_to_pause:
            self._paused = self._pause_steps
            self._pause_steps = min(self.max_pause_steps, self._pause_steps * 2)
            self._misses = 0
            self.k = 1


class Drafter:
    """One sequence's drafting: its n-gram index, its adaptive size and its counts."""

    def __init__(self, max_k: int = 8, max_ngram: int = 3, min_ngram: int = 2) -> None:
        # min_ngram 2: a one-token match (a common word, a space) predicts little in
        # free text, and every failed proposal costs a verification run.
        self.proposer = NgramProposer(max_ngram, min_ngram)
        self.size = AdaptiveDraft(max_k=max_k, start_k=min(4, max_k))
        self.proposed_tokens = 0  # tokens proposed and verified
        self.accepted_tokens = 0  # of those, the ones the output kept

    def propose(self, tokens: Sequence[int], room_tokens: int) -> list[int]:
        """This step's proposal: at most the adaptive size and `room_tokens` (what the
        sequence may still write), [] for none."""
        k = min(self.size.next_k(), room_tokens)
        return self.proposer.propose(tokens, k) if k > 0 else []

    def record(self, proposed: int, accepted: int) -> None:
        """The verification of a `proposed`-token proposal kept `accepted` of them."""
        self.size.record(proposed, accepted)
        self.proposed_tokens += proposed
        self.accepted_tokens += accepted
