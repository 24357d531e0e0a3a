"""The token path's small pieces: queued tokens merge into one delta; a relayed chunk
frame is recognised and its tokens counted from its bytes."""

from __future__ import annotations

from ortserve.rpc.relay_frames import (
    ADMISSION_TAG,
    CHUNK_TAG,
    FINISHED_TAG,
    chunk_fields,
    chunk_tokens,
)
from ortserve.v1 import types_pb2
from worker_service.core.logprobs import TokenLogprobs
from worker_service.core.sequence import Cancelled, TokenDelta
from worker_service.engine.event_mailbox import coalesced


def test_consecutive_token_deltas_merge_and_a_terminal_event_stays_last():
    events = [TokenDelta("s", (1,), "a"), TokenDelta("s", (2,), ""), TokenDelta("s", (3,), "bc"),
              Cancelled("s", 3)]
    assert coalesced(events) == [TokenDelta("s", (1, 2, 3), "abc"), Cancelled("s", 3)]
    assert coalesced([TokenDelta("s", (7,), "x")]) == [TokenDelta("s", (7,), "x")]
    assert coalesced([]) == []


def test_merged_token_deltas_keep_one_logprob_entry_per_token_in_order():
    # Found merging the token path with log-probabilities: a merge that dropped them would
    # send a chunk of 3 tokens with no entries at all.
    lp = [TokenLogprobs(token_id=i, logprob=-float(i), top=()) for i in (1, 2, 3)]
    events = [TokenDelta("s", (1,), "a", (lp[0],)), TokenDelta("s", (2, 3), "b", tuple(lp[1:]))]
    (merged,) = coalesced(events)
    assert merged.token_ids == (1, 2, 3) and merged.logprobs == tuple(lp)


def test_a_frame_first_byte_names_its_event_and_chunk_tokens_are_counted_from_bytes():
    def frame(**kw) -> bytes:
        return types_pb2.GenerateEvent(**kw).SerializeToString()

    assert frame(admission=types_pb2.Admission(request_id="r"))[0] == ADMISSION_TAG
    assert frame(finished=types_pb2.Finished())[0] == FINISHED_TAG
    for ids in ([], [0], [5, 127, 128, 16_383, 16_384, 2**32 - 1], list(range(0, 50_000, 97))):
        chunk = frame(chunk=types_pb2.TokenChunk(token_ids=ids, text="é" * 300))
        assert chunk[0] == CHUNK_TAG
        assert chunk_tokens(chunk) == len(ids)



def test_a_chunk_frame_the_relay_cannot_read_counts_no_tokens_and_is_not_misread():
    frame = types_pb2.GenerateEvent(chunk=types_pb2.TokenChunk(token_ids=[1, 2], text="ab")
                                    ).SerializeToString()
    assert chunk_fields(frame) == (bytes([1, 2]), b"ab")
    odd = bytes([CHUNK_TAG, frame[1] + 2]) + frame[2:] + bytes([3 << 3 | 0, 1])  # field 3
    assert chunk_fields(odd) is None and chunk_tokens(odd) == 0


def test_batched_greedy_picks_each_rows_first_maximum_as_the_per_row_argmax_does():
    import numpy as np

    from worker_service.core.sampling import (
        Sampler,
        SamplingConfig,
        greedy_choice,
        greedy_tokens,
        plain_greedy,
    )

    vocab = 97
    rng = np.random.default_rng(0)
    owner = rng.standard_normal(6 * vocab).astype(np.float32)
    owner[2 * vocab + 5] = owner[2 * vocab + 9] = 50.0  # a tie: the first one wins
    batch = owner.reshape(6, vocab)
    rows = [batch[b] for b in (4, 0, 2, 5)]  # a subset, out of order: one view spans them
    assert greedy_tokens(rows, vocab) == [int(np.argmax(r)) for r in rows]
    assert greedy_tokens(rows, vocab)[2] == 5
    # A padded vocabulary, rows from different buffers, one row: the per-row path, same answer.
    assert greedy_tokens(rows, vocab - 3) == [int(np.argmax(r[:vocab - 3])) for r in rows]
    loose = [rng.standard_normal(vocab).astype(np.float32) for _ in range(3)]
    assert greedy_tokens(loose, vocab) == [int(np.argmax(r)) for r in loose]
    assert greedy_tokens(rows[:1], vocab) == [int(np.argmax(rows[0]))]
    # Only the samplers whose choice IS the raw argmax take the fast path.
    assert plain_greedy(Sampler(SamplingConfig(), vocab))
    assert not plain_greedy(Sampler(SamplingConfig(temperature=0.7), vocab))
    assert not plain_greedy(Sampler(SamplingConfig(repetition_penalty=1.2), vocab))
    # A suppressed token (EOS before min_new_tokens): the argmax stands unless it is one.
    suppressed = Sampler(SamplingConfig(), vocab)
    suppressed.suppress([3, 5])
    assert plain_greedy(suppressed)
    for row in [*rows, *loose]:
        token = greedy_tokens([row], vocab)[0]
        choice = greedy_choice(suppressed, token)
        assert choice == (None if token in (3, 5) else token)
        if choice is not None:
            assert choice == suppressed(row, [])
    assert greedy_choice(suppressed, greedy_tokens([batch[2]], vocab)[0]) is None  # 5 wins there
    assert suppressed(batch[2], []) == 9  # the sampler's own choice: the tie's other token
    for sampler_rows in (rows, loose):
        assert greedy_tokens(sampler_rows, vocab) == [Sampler(SamplingConfig(), vocab)(r, [])
                                                      for r in sampler_rows]


def test_a_stream_interval_holds_tokens_between_chunks_but_never_the_first_or_the_end():
    import asyncio
    from types import SimpleNamespace

    from worker_service.core.sequence import Completed, FinishReason
    from worker_service.lease_lifecycle import LeaseStream

    def stream(interval_s: float) -> LeaseStream:
        lifecycle = SimpleNamespace(worker_id="w")
        return LeaseStream(lifecycle, types_pb2.Lease(lease_id="l"),
                           SimpleNamespace(request_id="r"), stream_interval_s=interval_s)

    done = Completed(sequence_id="s", finish_reason=FinishReason.LENGTH, stop_sequence="",
                     prompt_tokens=1, generated_tokens=6, max_new_tokens=6, queue_ms=0,
                     prefill_ms=0, ttft_ms=0, decode_ms=0, decode_tokens_per_s=0, total_ms=0,
                     seed=None, text="abcdef", token_ids=tuple(range(6)))

    async def run(interval_s: float) -> list[tuple[float, object]]:
        s = stream(interval_s)
        loop = asyncio.get_running_loop()
        start = loop.time()

        async def engine():  # a token every 10 ms, then the end right after the last
            for i in range(6):
                s._arrived(TokenDelta("s", (i,), "abcdef"[i]))
                await asyncio.sleep(0.01)
            s._arrived(done)

        task = asyncio.ensure_future(engine())
        out = [(loop.time() - start, e) async for e in s.events()]
        await task
        return out

    held = asyncio.run(run(10.0))  # far longer than the whole stream
    assert held[0][1] == TokenDelta("s", (0,), "a") and held[0][0] < 1.0  # the first: at once
    assert held[1][1] == TokenDelta("s", (1, 2, 3, 4, 5), "bcdef")  # the rest: one chunk
    assert held[2][1] is done and held[-1][0] < 5.0  # the end cut the 10 s hold short
    free = asyncio.run(run(0.0))
    assert [e for _, e in free if isinstance(e, TokenDelta)] == [
        TokenDelta("s", (i,), "abcdef"[i]) for i in range(6)]  # a reader keeping up: each alone


def test_a_reader_cancelled_holding_the_end_closes_at_once_and_releases_once():
    """The consumer is cancelled after reading a token of a batch that also held the
    Completed event: close() must not wait for a terminal event that was taken and
    dropped (it held the lease for CANCEL_WAIT_S, 30 s); the KV is already freed."""
    import asyncio
    from types import SimpleNamespace

    from worker_service.core.sequence import Completed, FinishReason
    from worker_service.lease_lifecycle import LeaseStream

    released: list[str] = []

    async def release(lease_id: str, *ended) -> int:  # ended: how it ended
        released.append(lease_id)
        return 0

    lifecycle = SimpleNamespace(worker_id="w", _live={}, orphaned=set(),
                                link=SimpleNamespace(release=release))
    done = Completed(sequence_id="s", finish_reason=FinishReason.LENGTH, stop_sequence="",
                     prompt_tokens=1, generated_tokens=1, max_new_tokens=1, queue_ms=0,
                     prefill_ms=0, ttft_ms=0, decode_ms=0, decode_tokens_per_s=0, total_ms=0,
                     seed=None, text="a", token_ids=(0,))
    cancels: list[bool] = []

    async def scenario() -> float:
        s = LeaseStream(lifecycle, types_pb2.Lease(lease_id="l"), SimpleNamespace(request_id="r"))
        s._handle = SimpleNamespace(cancel=lambda: cancels.append(True))
        s._arrived(TokenDelta("s", (0,), "a"))
        s._arrived(done)  # both queued: the reader takes them as one batch
        events = s.events()
        assert await events.__anext__() == TokenDelta("s", (0,), "a")
        await events.aclose()  # the client went away holding the batch's rest
        start = asyncio.get_running_loop().time()
        await asyncio.wait_for(s.close(), 5)
        return asyncio.get_running_loop().time() - start

    assert asyncio.run(scenario()) < 1.0
    assert released == ["l"] and cancels == []  # nothing left to cancel: it had ended
