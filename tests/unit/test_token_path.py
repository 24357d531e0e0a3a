"""The token path's small pieces: queued tokens merge into one delta; a relayed chunk
frame is recognised and its tokens counted from its bytes."""

from __future__ import annotations

from ortserve.v1 import types_pb2
from scheduler_service.frames import (
    ADMISSION_TAG,
    CHUNK_TAG,
    FINISHED_TAG,
    chunk_fields,
    chunk_tokens,
)
from worker_service.core.logprobs import TokenLogprobs
from worker_service.core.sequence import Cancelled, TokenDelta
from worker_service.lease_lifecycle import coalesced


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
