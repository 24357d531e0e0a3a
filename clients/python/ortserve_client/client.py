"""A blocking client over a gRPC channel to the scheduler."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import grpc

from ortserve.v1 import scheduler_pb2, scheduler_pb2_grpc, types_pb2

from .errors import GenerationFailed, from_rpc_error
from .types import (
    Admission,
    BudgetCap,
    GenerateResult,
    TextChunk,
    sampling_dict,
    timings_from_pb,
    usage_from_pb,
)

DEFAULT_ADDRESS = "127.0.0.1:50051"


def build_request(
    prompt: str | Sequence[int] | Sequence[tuple[str, str]] | None = None,
    *,
    chat: Sequence[tuple[str, str]] | None = None,
    max_new_tokens: int | None = None,
    min_new_tokens: int = 0,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    repetition_penalty: float | None = None,
    stop: Sequence[str] = (),
    strict: bool = False,
    request_id: str = "",
) -> types_pb2.GenerateRequest:
    """A GenerateRequest: `prompt` is text or token ids; `chat` is (role, content) turns."""
    req = types_pb2.GenerateRequest(request_id=request_id, min_new_tokens=min_new_tokens,
                                    stop=list(stop))
    if chat is not None:
        req.chat.messages.extend(types_pb2.ChatMessage(role=r, content=c) for r, c in chat)
    elif isinstance(prompt, str):
        req.text = prompt
    elif prompt is not None:
        req.token_ids.ids.extend(prompt)
    if max_new_tokens is not None:
        req.max_new_tokens = max_new_tokens
    for name, value in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p),
                        ("seed", seed), ("repetition_penalty", repetition_penalty)):
        if value is not None:
            setattr(req.sampling, name, value)
    if strict:
        req.cap_policy = types_pb2.CAP_POLICY_STRICT
    return req


class GenerationStream:
    """Iterate for TextChunks. `.admission` (and `.budget_cap`) are set before the
    first chunk is yielded; `.result` once the stream has ended."""

    def __init__(self, call, on_admission=None) -> None:
        self._call = call
        self._on_admission = on_admission  # called with the Admission, before any chunk
        self.admission: Admission | None = None
        self.result: GenerateResult | None = None
        self._text: list[str] = []
        self._ids: list[int] = []

    @property
    def budget_cap(self) -> BudgetCap | None:
        return self.admission.budget_cap if self.admission else None

    def cancel(self) -> None:
        self._call.cancel()

    def __iter__(self) -> Iterator[TextChunk]:
        try:
            for event in self._call:
                kind = event.WhichOneof("event")
                if kind == "admission":
                    self.admission = Admission.from_pb(event.admission)
                    if self._on_admission is not None:
                        self._on_admission(self.admission)
                elif kind == "chunk":
                    self._text.append(event.chunk.text)
                    self._ids.extend(event.chunk.token_ids)
                    yield TextChunk(event.chunk.text, tuple(event.chunk.token_ids))
                elif kind == "finished":
                    self.result = self._result(event.finished)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        if self.result is None:
            raise GenerationFailed(grpc.StatusCode.UNKNOWN, "the stream ended without a Finished event")

    def _result(self, f: types_pb2.Finished) -> GenerateResult:
        if self.admission is None:
            raise GenerationFailed(grpc.StatusCode.UNKNOWN, "Finished arrived before an Admission")
        return GenerateResult(
            text="".join(self._text), token_ids=tuple(self._ids),
            finish_reason=types_pb2.FinishReason.Name(f.finish_reason),
            stop_sequence=f.stop_sequence,
            budget_cap=BudgetCap.from_pb(f.budget_cap) if f.HasField("budget_cap") else None,
            usage=usage_from_pb(f.usage), timings=timings_from_pb(f.timings),
            admission=self.admission, worker_id=f.worker_id,
            execution_provider=f.execution_provider, sampling=sampling_dict(f.sampling),
        )


class Client:
    def __init__(self, address: str = DEFAULT_ADDRESS, timeout_s: float | None = None) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(address)
        self._stub = scheduler_pb2_grpc.SchedulerStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def stream(self, prompt=None, *, on_admission=None, **kw) -> GenerationStream:
        """Start a generation; see build_request for the arguments. `on_admission(adm)`
        runs when the Admission arrives, before the first chunk."""
        call = self._stub.Generate(build_request(prompt, **kw), timeout=self.timeout_s)
        return GenerationStream(call, on_admission)

    def generate(self, prompt=None, **kw) -> GenerateResult:
        stream = self.stream(prompt, **kw)
        for _ in stream:
            pass
        return stream.result

    def admit(self, prompt=None, *, dry_run: bool = True, **kw) -> Admission:
        try:
            pb = self._stub.Admit(scheduler_pb2.AdmitRequest(request=build_request(prompt, **kw),
                                                             dry_run=dry_run), timeout=self.timeout_s)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        return Admission.from_pb(pb)

    def release(self, lease_id: str) -> int:
        try:
            return self._stub.Release(scheduler_pb2.ReleaseRequest(lease_id=lease_id),
                                      timeout=self.timeout_s).freed_bytes
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None

    def budget(self, include_leases: bool = False) -> scheduler_pb2.Budget:
        try:
            return self._stub.GetBudget(scheduler_pb2.GetBudgetRequest(include_leases=include_leases),
                                        timeout=self.timeout_s)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
