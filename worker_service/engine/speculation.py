"""The engine's speculative step (prompt-lookup drafts): which rows propose, and what a verified row keeps.

`with_drafts` adds this step's proposals to the plan (the rows whose
verification pays, by the measured VerifyCosts); `accept_verified` applies one
verified row in the postprocess; `resolve` says at start whether speculation
runs at all. The engine calls both from its thread; the
rejection rule itself is core/speculative.py's.
"""

from __future__ import annotations

import dataclasses

import structlog

from worker_service.core.errors import InvalidWorkerField
from worker_service.core.sequence import FinishReason, Sequence, TokenDelta
from worker_service.core.speculative import VerifyCosts
from worker_service.core.step_scheduler import StepPlan
from worker_service.engine.config import EngineConfig
from worker_service.runtime.runner import Runner, SequenceStep

log = structlog.get_logger("worker_service.engine")  # the engine's lines, as before the split


def with_drafts(plan: StepPlan, costs: VerifyCosts, batch_rows: int) -> StepPlan:
    """The plan with this step's proposals: each decoding row that allows speculation
    proposes from its own tokens, within what its reservation may still write; the
    rows whose verification pays (VerifyCosts, measured) keep theirs."""
    proposals: list[tuple[float, Sequence, tuple[int, ...]]] = []
    for seq in plan.decodes:
        if seq.drafter is None:
            continue
        # The run writes positions up to len(token_ids) + len(draft) - 1: never past
        # prompt + max_new_tokens, the reservation the ledger charged.
        room = seq.req.max_tokens - len(seq.token_ids)
        draft = seq.drafter.propose(seq.token_ids, room)
        if draft and seq.constraint is not None:
            draft = draft[:seq.constraint.valid_prefix(draft)]
        if draft:
            proposals.append((seq.drafter.size.expected_accepted, seq, tuple(draft)))
    if not proposals:
        return plan
    proposals.sort(key=lambda p: -p[0])
    rows = batch_rows or len(plan.decodes)
    taken = costs.chosen(rows, [gain for gain, _, _ in proposals])
    if not taken:
        return plan
    return dataclasses.replace(plan, drafts={seq.sequence_id: draft
                                             for _, seq, draft in proposals[:taken]})


def accept_verified(step: SequenceStep, runner: Runner) -> FinishReason | None:
    """A verified proposal: the sampler takes each position's token in order, the draft
    offered at each (greedy keeps the argmax; sampling the rejection rule), until a
    token differs from the draft or the sequence ends; that token is the model's own.
    Only the positions whose tokens were kept stay in the KV. One TokenDelta."""
    seq, draft = step.seq, step.draft
    assert step.verify_logits is not None and seq.drafter is not None
    tokens: list[int] = []
    texts: list[str] = []
    logprobs = []
    accepted, finish_reason = 0, None
    for i, logits in enumerate(step.verify_logits):
        offered = draft[i] if i < len(draft) else None
        token, text, finish_reason, token_logprobs = seq.accept(logits, draft=offered)
        tokens.append(token)
        texts.append(text)
        if token_logprobs is not None:
            logprobs.append(token_logprobs)
        if token != offered or finish_reason is not None:
            accepted += token == offered
            break
        accepted += 1
    seq.drafter.record(len(draft), accepted)
    # The K/V of the last token and of the accepted proposals; the newest token is
    # pending, as after any sample.
    seq.computed(len(tokens))
    runner.keep_computed(seq)
    seq.emit(TokenDelta(seq.sequence_id, tuple(tokens), "".join(texts), tuple(logprobs)))
    return finish_reason


def resolve(config: EngineConfig, runner: Runner, kv_layout: str) -> tuple[str, float | None, str]:
    """(the speculation that runs, the verification probe's logit drift, why it is off when
    asked for): "off" where the runner verifies no drafts or verification is not exact.
    Raises InvalidWorkerField for a speculative setting that is not one."""
    if config.speculative not in ("ngram", "off"):
        raise InvalidWorkerField("speculative", f"speculative {config.speculative!r} is not one "
                             "of ngram, off")
    if config.speculative_max_tokens < 1:
        raise InvalidWorkerField("speculative_max_tokens", "speculative_max_tokens must be >= 1, "
                             f"got {config.speculative_max_tokens}")
    # Speculation where the runner verifies drafts (the arena layout) as exactly as it
    # decodes; "off" elsewhere, and Info reports what runs.
    mode = config.speculative if runner.verifies else "off"
    verify_drift: float | None = None
    note = "" if mode == config.speculative else (
        f"kv_layout {kv_layout} verifies no proposals")
    if mode != "off":
        try:
            verify_drift = runner.verify_drift()
        except Exception as exc:  # e.g. a KV capacity with no room for the probe's row
            mode = "off"
            note = f"the start-up verification probe failed ({exc})"
        if verify_drift is not None and (
                verify_drift > config.speculative_max_logit_drift):
            mode = "off"
            note = (
                f"a verification run's logits differ from single-token runs' by up to "
                f"{verify_drift:.3g} on this model (limit "
                f"{config.speculative_max_logit_drift:g}), enough to change greedy tokens: "
                "speculation is off; a model whose matmuls do not quantize activations "
                "(fp32, fp16) keeps it")
    if note:
        log.info("speculative_off", asked=config.speculative, why=note)
    return mode, verify_drift, note
