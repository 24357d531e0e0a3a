"""Choosing the next token from logits: greedy or seeded sampling, every parameter honoured."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ortserve.rules import request_rules
from worker_service.core import speculative
from worker_service.core.logprobs import TokenLogprobs, token_logprobs


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling parameters; None means unset. Unset or 0 temperature is greedy decoding."""

    temperature: float | None = None
    top_k: int | None = None  # None or 0: no limit
    top_p: float | None = None  # None or 1: no limit
    seed: int | None = None  # None: a fresh random seed, reported back
    repetition_penalty: float | None = None  # None or 1: no penalty
    presence_penalty: float | None = None  # None or 0: none; over this request's output
    frequency_penalty: float | None = None  # None or 0: none; over this request's output
    min_p: float | None = None  # None or 0: no limit
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), sorted by id

    @property
    def greedy(self) -> bool:
        return self.temperature is None or self.temperature == 0

    @property
    def counts_output(self) -> bool:
        """Presence or frequency penalty set: the sampler counts what it chose."""
        return bool(self.presence_penalty) or bool(self.frequency_penalty)

    def validate(self) -> None:
        """Raise InvalidField(field="sampling.<name>") for a value that would be ignored or is
        bad: the one rule (ortserve.rules.request_rules.sampling), which the scheduler also applies."""
        request_rules.sampling(self.temperature, self.top_k, self.top_p, self.seed,
                               self.repetition_penalty, self.presence_penalty,
                               self.frequency_penalty, self.min_p, dict(self.logit_bias))


class Sampler:
    """One sequence's token chooser; holds its random generator, so one per sequence.

    Order: the suppressed tokens (min_new_tokens' EOS) masked; the repetition
    penalty over prompt + output (CTRL: a positive logit is divided by the
    penalty, a negative one multiplied); the presence and frequency penalties
    over this sequence's own output (OpenAI's: logit - frequency x count -
    presence x [count > 0]); logit_bias added. Then argmax when greedy, else
    temperature, top_k, top_p, min_p and a draw from numpy's PCG64 seeded with
    `.seed`. Log-probabilities (when asked) are taken after the temperature
    (1 under greedy), before top_k/top_p/min_p truncate: the distribution the
    request's own parameters shaped, not the truncation's renormalised one.
    """

    def __init__(self, config: SamplingConfig, vocab_size: int) -> None:
        # NOTE: not validated again here: the config is a SequenceRequest's, which was.
        self.config = config
        self.vocab_size = vocab_size
        # The resolved seed is reported back so a sampled answer can be reproduced.
        self.seed: int | None = None
        self._rng: np.random.Generator | None = None
        if not config.greedy:
            self.seed = config.seed if config.seed is not None else secrets.randbits(63)
            self._rng = np.random.Generator(np.random.PCG64(self.seed))
        self._suppressed = np.zeros(0, dtype=np.int64)
        # Penalties and bias make the plain-argmax fast path wrong: decided once.
        self._adjusts = bool(config.logit_bias) or config.counts_output or (
            config.repetition_penalty is not None and config.repetition_penalty != 1)
        self._bias_ids = np.array([t for t, _ in config.logit_bias], dtype=np.int64)
        self._bias_values = np.array([b for _, b in config.logit_bias], dtype=np.float64)
        self._output_counts: dict[int, int] = {}  # token -> times chosen, when counts_output

    def suppress(self, token_ids: Sequence[int]) -> None:
        """Never choose these tokens until `suppress([])` (the engine uses it for min_new_tokens)."""
        self._suppressed = np.asarray(list(token_ids), dtype=np.int64)

    def __call__(self, logits: np.ndarray, history: Sequence[int],
                 allowed: np.ndarray | None = None, draft: int | None = None) -> int:
        """Choose the next token from 1-D logits; `history` is prompt + output so far."""
        return self.choose(logits, history, allowed=allowed, draft=draft)[0]

    def choose(self, logits: np.ndarray, history: Sequence[int],
               top_logprobs: int | None = None,
               allowed: np.ndarray | None = None,
               draft: int | None = None) -> tuple[int, TokenLogprobs | None]:
        """The next token and, when `top_logprobs` is not None, its log-probability and the
        `top_logprobs` most likely alternatives (worker_service.core.logprobs).

        `allowed` (a bool array over the vocabulary: an output constraint's mask) removes
        every other token first, so greedy, temperature, top_k, top_p and min_p choose
        among the allowed tokens only (and log-probabilities are over them).

        `draft` (a proposed token, speculative decoding): when sampling, the token is
        drawn by the speculative rejection rule (core/speculative.py), which keeps
        the draft with its own probability and otherwise draws from the rest, so the
        token is distributed exactly as without a draft; the draft was accepted
        exactly when the returned token equals it. Greedy ignores it (the argmax is
        the argmax).
        """
        if (self._rng is None and not self._suppressed.size and not self._adjusts
                and top_logprobs is None):
            # Plain greedy: argmax needs no copy (float32 -> float64 is exact and monotonic,
            # so the first maximum is the same one): the common decode path, once per row.
            if allowed is None:
                return int(np.argmax(logits[: self.vocab_size])), None
            return _masked_argmax(logits[: self.vocab_size], allowed), None
        # float64 throughout: float32 softmax over ~50k entries loses the tail mass.
        scores = np.array(logits[: self.vocab_size], dtype=np.float64)
        if allowed is not None:
            scores[~allowed[: scores.size]] = -np.inf
        if self._suppressed.size:
            scores[self._suppressed] = -np.inf
            if allowed is not None and not np.isfinite(scores).any():
                # The constraint allows only what min_new_tokens suppresses (EOS): the
                # constraint wins, or there would be no token at all.
                scores[self._suppressed] = np.where(allowed[self._suppressed],
                                                    logits[self._suppressed], -np.inf)
        self._adjust(scores, history)
        if self._rng is None:
            token = int(np.argmax(scores))
        else:
            assert self.config.temperature
            scores /= self.config.temperature
            token = self._draw(scores, draft)
        if self.config.counts_output:
            self._output_counts[token] = self._output_counts.get(token, 0) + 1
        if top_logprobs is None:
            return token, None
        return token, token_logprobs(scores, token, top_logprobs)

    def _adjust(self, scores: np.ndarray, history: Sequence[int]) -> None:
        """The penalties and logit_bias, in place, before anything chooses."""
        config = self.config
        penalty = config.repetition_penalty
        if penalty is not None and penalty != 1:
            apply_repetition_penalty(scores, history, penalty)
        if self._output_counts:
            apply_presence_frequency(scores, self._output_counts, config.presence_penalty or 0.0,
                                     config.frequency_penalty or 0.0)
        if self._bias_ids.size:
            scores[self._bias_ids] += self._bias_values

    def _draw(self, scores: np.ndarray, draft: int | None = None) -> int:
        """A draw from `scores` (temperature applied) after top_k, top_p and min_p.

        By inverse CDF over the candidates in token-id order (in likelihood order under
        top_p), one uniform from the sequence's own generator per token; with a
        `draft`, by the rejection rule over the same candidates (one or two uniforms).
        """
        assert self._rng is not None
        config = self.config
        top_k = config.top_k or 0
        candidates: np.ndarray | None = None  # None: the whole vocabulary, in id order
        if 0 < top_k < scores.size:
            candidates = np.sort(np.argpartition(scores, -top_k)[-top_k:])
            scores = scores[candidates]
        if config.min_p:
            # p >= min_p x p_max  <=>  score >= max score + log(min_p): no softmax needed,
            # and the most likely token always passes.
            kept = np.flatnonzero(scores >= scores.max() + np.log(config.min_p))
            candidates = kept if candidates is None else candidates[kept]
            scores = scores[kept]
        weights = _weights(scores)
        if config.top_p is not None and config.top_p < 1:
            order = _nucleus(scores, weights, config.top_p)
            candidates = order if candidates is None else candidates[order]
            weights = weights[order]
        if draft is None:
            index = _pick(weights, self._rng.random())
        else:
            index = speculative.accept_point_draft(weights, _index_of(candidates, draft,
                                                                      weights.size),
                                                   self._rng.random, _pick)
        return int(index if candidates is None else candidates[index])




def _index_of(candidates: np.ndarray | None, token: int, size: int) -> int | None:
    """`token`'s index among the candidates (None: the whole vocabulary), None if absent."""
    if candidates is None:
        return token if 0 <= token < size else None
    found = np.flatnonzero(candidates == token)
    return int(found[0]) if found.size else None


def _masked_argmax(logits: np.ndarray, allowed: np.ndarray) -> int:
    """The first maximum among the allowed tokens (ties break by token id, as argmax's)."""
    ids = np.flatnonzero(allowed[: logits.size])
    if ids.size == 0:
        raise ValueError("the constraint allows no token")
    return int(ids[np.argmax(logits[ids])])


def apply_presence_frequency(scores: np.ndarray, counts: dict[int, int], presence: float,
                             frequency: float) -> None:
    """OpenAI's presence and frequency penalties, in place: each token generated `c` > 0
    times loses `frequency x c + presence` from its logit."""
    ids = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
    times = np.fromiter(counts.values(), dtype=np.float64, count=len(counts))
    scores[ids] -= frequency * times + presence


def apply_repetition_penalty(scores: np.ndarray, history: Sequence[int], penalty: float) -> None:
    """CTRL repetition penalty, in place: each token seen once or more in `history` has its
    logit divided by `penalty` when positive and multiplied by it otherwise."""
    if not len(history):
        return
    seen = np.unique(np.asarray(history, dtype=np.int64))
    seen = seen[(seen >= 0) & (seen < scores.size)]
    picked = scores[seen]
    scores[seen] = np.where(picked > 0, picked / penalty, picked * penalty)


def plain_greedy(sampler: Sampler) -> bool:
    """True when `sampler` is greedy with nothing that moves the logits (no repetition,
    presence or frequency penalty, no logit_bias): it picks the argmax of the raw logits
    unless that token is suppressed (`greedy_choice`), so `greedy_tokens` may choose for
    it, with the same result."""
    return sampler._rng is None and not sampler._adjusts


def suppresses(sampler: Sampler) -> bool:
    """True while `sampler` has suppressed tokens (min_new_tokens' EOS): a raw argmax may
    name one, and then the sampler must choose from the logits (`greedy_choice`)."""
    return bool(sampler._suppressed.size)


def greedy_choice(sampler: Sampler, token: int) -> int | None:
    """`token` (the raw logits' first maximum) when `sampler` would choose it, else None:
    a suppressed token (EOS before min_new_tokens) is not, and the sampler must choose.

    NOTE: when the first maximum is not suppressed, it is also the first maximum of the
    logits with the suppressed tokens at -inf: the sampler's own answer, without its
    float64 copy of the row (the costliest thing a greedy token does under min_new_tokens).
    """
    if sampler._suppressed.size and (sampler._suppressed == token).any():
        return None
    return token


def greedy_tokens(rows: Sequence[np.ndarray], vocab_size: int) -> list[int]:
    """The first maximum of each 1-D logits row among its first `vocab_size` entries
    (`Sampler`'s plain greedy choice, the same token), in ONE numpy call when the rows are
    rows of one C-contiguous buffer (the batched decode's [rows, vocab] output, as views);
    else one call per row.

    NOTE: one argmax over the batch saves numpy's per-call overhead, not the scan: about
    a third of the per-row cost at 32 rows x 49,152 entries.
    """
    block = _rows_block(rows)
    if block is None or block[0].shape[1] != vocab_size:
        # NOTE: a [:, :vocab_size] slice of the block is strided: numpy's argmax along it is
        # slower than a call per row (padded vocabularies take this path).
        return [int(np.argmax(row[:vocab_size])) for row in rows]
    view, index = block
    return np.argmax(view, axis=1)[index].tolist()


def _rows_block(rows: Sequence[np.ndarray]) -> tuple[np.ndarray, list[int]] | None:
    """A 2-D view spanning `rows` in their buffer and each row's index in it; None when the
    rows are not equal-length contiguous views at a whole-row stride in one owner array."""
    if len(rows) < 2:
        return None  # one row: one call either way
    first = rows[0]
    owner = first.base
    width, item = first.size, first.itemsize
    if (owner is None or not isinstance(owner, np.ndarray) or not owner.flags.c_contiguous
            or first.ndim != 1):
        return None
    stride = width * item
    start = owner.ctypes.data
    offsets = []
    for row in rows:
        if (row.base is not owner or row.ndim != 1 or row.size != width or row.dtype != first.dtype
                or row.strides != (item,)):
            return None
        offset = row.ctypes.data - start
        if offset % stride:
            return None
        offsets.append(offset // stride)
    low = min(offsets)
    count = max(offsets) - low + 1
    view = np.ndarray((count, width), dtype=first.dtype, buffer=owner, offset=low * stride,
                      strides=(stride, item))
    return view, [o - low for o in offsets]


# NOTE: the costs that shaped the three helpers below, on the 49,152-entry row (2-core EPYC,
# numpy 2.4): a stable argsort of the row 5.4 ms, a float64 exp 250 us and cumsum 190 us;
# a float32 exp 78 us, a float64 sum 13 us. A temperature draw cost 1.46 ms and a top_p
# draw 6.8 ms per token before them (the worker's largest cost outside ORT when sampling).
_PICK_BLOCK = 256


def _weights(scores: np.ndarray) -> np.ndarray:
    """exp(score - max score), float32: unnormalised probabilities (the max's is 1).

    float32 for the exp only: every term is in [0, 1] after the shift, each exact to
    ~1e-7; every sum over them is taken in float64, which keeps the tail's mass.
    """
    weights = np.empty(scores.size, dtype=np.float32)
    np.subtract(scores, scores.max(), out=weights, casting="same_kind")
    return np.exp(weights, out=weights)


def _nucleus(scores: np.ndarray, weights: np.ndarray, top_p: float) -> np.ndarray:
    """Indices of the smallest most-likely prefix whose mass reaches `top_p`, most likely
    first, ties by index (the order a stable sort of the whole row gives).

    Sorts only a top slice found by argpartition (O(V)), widened until its mass reaches
    top_p; a flat distribution ends in a sort of the whole row, as before.
    """
    need = top_p * float(weights.sum(dtype=np.float64))
    k = 64
    while True:
        if k >= scores.size:
            picked = np.arange(scores.size)
        else:
            kth = scores[np.argpartition(scores, -k)[-k]]
            picked = np.flatnonzero(scores >= kth)  # ties with the k-th included, ids ascending
        if picked.size == scores.size or weights[picked].sum(dtype=np.float64) >= need:
            break
        k *= 4
    order = picked[np.argsort(-scores[picked], kind="stable")]
    cumulative = np.cumsum(weights[order], dtype=np.float64)
    # The most likely token always stays.
    return order[:int(np.searchsorted(cumulative, need, side="left")) + 1]


def _pick(weights: np.ndarray, uniform: float) -> int:
    """The index where `uniform` x total falls in the weights' running sum: index i with
    probability weights[i] / total; a zero weight is never picked.

    A long row by blocks: block sums, the block the target falls in, the running sum
    inside it (two short cumsums instead of one over the row).
    """
    size = weights.size
    if size <= 4 * _PICK_BLOCK:
        cumulative = np.cumsum(weights, dtype=np.float64)
        index = int(np.searchsorted(cumulative, uniform * cumulative[-1], side="right"))
        return _last_positive(weights, 0, size) if index >= size else index
    full = size - size % _PICK_BLOCK
    sums = weights[:full].reshape(-1, _PICK_BLOCK).sum(axis=1, dtype=np.float64)
    if full < size:
        sums = np.append(sums, weights[full:].sum(dtype=np.float64))
    edges = np.cumsum(sums)
    target = uniform * edges[-1]
    block = min(int(np.searchsorted(edges, target, side="right")), sums.size - 1)
    start = block * _PICK_BLOCK
    stop = min(start + _PICK_BLOCK, size)
    inside = np.cumsum(weights[start:stop], dtype=np.float64)
    index = int(np.searchsorted(inside, target - (edges[block - 1] if block else 0.0),
                                side="right"))
    # Past the block's end only by rounding: its last token that can be picked.
    return _last_positive(weights, start, stop) if index >= stop - start else start + index


def _last_positive(weights: np.ndarray, start: int, stop: int) -> int:
    nonzero = np.flatnonzero(weights[start:stop])
    return start + int(nonzero[-1]) if nonzero.size else stop - 1
