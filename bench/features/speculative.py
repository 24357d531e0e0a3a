"""Speculative decoding on vs off, one model folder, interleaved A/B (docs/benchmarks.md).

  .venv/bin/python -m bench.features.speculative --model int4 [--rounds 3] [--threads 2] \
      [--copy-streams 1 4] [--free-streams 1 8 16] [--copy-tokens 320] [--free-tokens 64]

Two in-process engines on the same folder, `--speculative off` and `ngram`,
take turns (the order alternating per round) so a shared machine's load hits
both alike. Workloads:
- copy: the three COPY_PROMPTS below (a 300-600 token passage the answer must
  quote or edit), greedy, each stream one of them in turn, until EOS or
  --copy-tokens;
- free: the bench's free-text prompt (bench.common.measure.PROMPT), greedy, exactly
  --free-tokens tokens (min_new_tokens, as bench.run does).
Per run: decode tokens/s in the window after every stream's first token (every
token of a multi-token event counted). Printed per workload and stream count:
the median tokens/s of each arm, the median and range of the per-round ratios
ngram/off, the acceptance, and whether the two arms' tokens were equal (greedy:
they must be). One JSON line each, then a summary line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

from bench.common.measure import PROMPT, window_rate
from devtools.cluster import model_cache
from ortserve.process.logs import configure_logging

# Three passages written for this bench (no outside text), 300-600 tokens each with
# their instructions, and an answer that must copy most of the passage.
_MEETING = (
    "Minutes of the Riverside Library Board, regular meeting. Present were the chair, the "
    "treasurer, the head librarian and four trustees; the secretary sent apologies. The "
    "chair opened the meeting at seven in the evening and asked for corrections to the "
    "minutes of the last meeting; there were none, and they were approved as written. The "
    "treasurer reported that the operating account held forty-two thousand dollars at the "
    "end of the quarter, that the roof repair fund had received a grant of eleven thousand "
    "dollars from the county, and that spending on new books was three percent under the "
    "budget. The head librarian reported that visits rose by nine percent over the same "
    "quarter last year, that the children's reading hour now runs twice a week, and that "
    "the public computers will be replaced in the spring. She asked the board to approve "
    "longer opening hours on Thursdays, from eight in the morning to nine at night, during "
    "the exam season. After discussion the board approved the longer hours for a trial of "
    "three months, to be reviewed at the June meeting. A trustee raised the condition of "
    "the parking lot, where two lamps have failed and the surface is cracked near the "
    "entrance; the chair asked the head librarian to obtain two quotes for the repair "
    "before the next meeting. The board then discussed the archive room, which has stayed "
    "closed since the leak in October. The roofer has confirmed that the repair will be "
    "finished by the end of February, after which the room will be dried, inspected and "
    "reopened to researchers by appointment. There being no further business, the chair "
    "closed the meeting at half past eight. The next meeting will be held on the second "
    "Tuesday of next month in the community room.")
_RECIPE = (
    "Winter vegetable soup, for six people. Ingredients: two tablespoons of olive oil, one "
    "large onion chopped, two carrots sliced, two sticks of celery sliced, three cloves of "
    "garlic crushed, one small squash peeled and cut into cubes, two potatoes cut into "
    "cubes, one can of chopped tomatoes, one and a half litres of vegetable stock, one "
    "teaspoon of dried thyme, one bay leaf, a handful of chopped parsley, salt and black "
    "pepper. Method: warm the oil in a large pot over a medium heat. Add the onion, the "
    "carrots and the celery and cook them gently for ten minutes, stirring now and then, "
    "until the onion is soft but not brown. Add the garlic and cook for one more minute. "
    "Add the squash, the potatoes, the tomatoes, the stock, the thyme and the bay leaf. "
    "Bring the pot to the boil, then lower the heat, cover it and let it simmer for "
    "twenty-five minutes, until the potatoes and the squash are tender when pierced with a "
    "knife. Take out the bay leaf. For a smooth soup, blend half of it and stir it back "
    "into the pot; for a chunky soup, leave it as it is. Season with salt and pepper to "
    "taste, stir in the parsley and serve hot with crusty bread. The soup keeps for three "
    "days in the fridge and for three months in the freezer; reheat it slowly and add a "
    "little water if it has become too thick. For a heartier meal, add a can of white "
    "beans, drained, ten minutes before the end, or a handful of small pasta shapes with "
    "an extra cup of stock.")
_NOTICE = (
    "Notice to all tenants of the Elm Street building. The water supply to the building "
    "will be shut off on Wednesday from nine in the morning until four in the afternoon "
    "while the plumbers replace the main valve in the basement. Please fill a few bottles "
    "of water the evening before for drinking and cooking, and do not use the washing "
    "machines in the laundry room on that day. The lift will keep working as usual, but "
    "the boiler will be turned off, so there will be no hot water until the evening. If "
    "you need to reach the basement storage rooms on Wednesday, please ask the caretaker, "
    "who will be on site all day and can be called at the number posted by the front door. "
    "Residents who depend on water for medical reasons should tell the management office "
    "by Monday, so that arrangements can be made for them. After the work, the water may "
    "look brown for a few minutes; let the cold tap run until it is clear. Any leak or "
    "loss of pressure after the work should be reported to the caretaker at once. We are "
    "sorry for the trouble and thank you for your patience. The management office is open "
    "from Monday to Friday, from nine to five, on the ground floor next to the mailboxes, "
    "and answers email within one working day. Please keep this notice until the work is "
    "done.")
COPY_PROMPTS = (
    f"Repeat the following minutes exactly, word for word, with nothing added:\n\n{_MEETING}",
    "Rewrite the following recipe for twelve people instead of six, keeping every other "
    f"word the same:\n\n{_RECIPE}",
    "Rewrite this notice, changing Wednesday to Thursday and Monday to Tuesday, and keep "
    f"everything else exactly as it is:\n\n{_NOTICE}",
)


class Arm:
    """One engine; `run` submits streams at once and times their tokens."""

    def __init__(self, model_dir: Path, threads: int, speculative: str,
                 max_logit_drift: float) -> None:
        from worker_service.engine.config import EngineConfig
        from worker_service.engine.engine import Engine

        self.name = speculative
        self.engine = Engine(EngineConfig(model_dir=model_dir, device="cpu",
                                          intra_op_threads=threads, kv_capacity_bytes=4 * 2**30,
                                          prefix_cache_bytes=0, speculative=speculative,
                                          speculative_max_logit_drift=max_logit_drift))
        if self.engine.speculative != speculative:
            raise RuntimeError(f"speculative bench: the engine runs {self.engine.speculative!r}: "
                               f"{self.engine.speculative_note}; pass --max-logit-drift "
                               f"{self.engine.verify_drift:.2g} or more to measure it anyway")
        self._serial = 0

    def run(self, prompts: list[tuple[int, ...]], max_new: int, min_new: int) -> dict:
        from worker_service.core.sequence import TERMINAL, Completed, SequenceRequest, TokenDelta

        times: dict[str, list[float]] = {}
        counts: dict[str, list[int]] = {}
        done: list = []
        finished = threading.Event()

        def on_event(event) -> None:  # the engine thread: keep it cheap
            if isinstance(event, TokenDelta):
                times[event.sequence_id].append(time.perf_counter())
                counts[event.sequence_id].append(len(event.token_ids))
            elif isinstance(event, TERMINAL):
                done.append(event)
                if len(done) == len(prompts):
                    finished.set()

        self._serial += 1
        with self.engine._cond:  # the engine thread takes them together
            for i, ids in enumerate(prompts):
                sid = f"{self.name}-{self._serial}-{i}"
                times[sid], counts[sid] = [], []
                self.engine.submit(SequenceRequest(sequence_id=sid, prompt_ids=ids,
                                                   max_new_tokens=max_new, min_new_tokens=min_new),
                                   on_event)
        if not finished.wait(1800):
            raise RuntimeError("speculative bench: streams did not finish in 1800 s")
        failed = [e for e in done if not isinstance(e, Completed)]
        if failed:
            raise RuntimeError(f"speculative bench: a sequence failed: {failed[0]}")
        ordered = sorted(done, key=lambda e: int(e.sequence_id.rsplit("-", 1)[1]))
        return {"rate": window_rate(list(times.values()), list(counts.values())),
                "tokens": [e.token_ids for e in ordered],
                "generated": sum(e.generated_tokens for e in done),
                "proposed": sum(e.draft_proposed_tokens for e in done),
                "accepted": sum(e.draft_accepted_tokens for e in done)}

    def close(self) -> None:
        self.engine.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="int4", help="int4 or fp32 (smollm2-135m-instruct-<model>)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--copy-streams", type=int, nargs="*", default=[1, 4])
    p.add_argument("--free-streams", type=int, nargs="*", default=[1, 8, 16])
    p.add_argument("--copy-tokens", type=int, default=320)
    p.add_argument("--free-tokens", type=int, default=64)
    p.add_argument("--max-logit-drift", type=float, default=1e-3,
                   help="the engine's speculative_max_logit_drift; int4's verification drift "
                        "(~0.5) turns speculation off at the default: a larger value measures "
                        "it anyway (its greedy tokens then differ: greedy_equal says so)")
    a = p.parse_args()
    configure_logging("warning")
    path = model_cache() / "models" / f"smollm2-135m-instruct-{a.model}"
    arms = [Arm(path, a.threads, mode, a.max_logit_drift) for mode in ("off", "ngram")]
    tok = arms[0].engine.tokenizer
    copy_ids = [tuple(tok.encode_chat([("user", text)])) for text in COPY_PROMPTS]
    free_ids = tuple(tok.encode(PROMPT))
    cases = [("copy", s, [copy_ids[i % 3] for i in range(s)], a.copy_tokens, 0)
             for s in a.copy_streams]
    cases += [("free", s, [free_ids] * s, a.free_tokens, a.free_tokens) for s in a.free_streams]
    print(json.dumps({"copy_prompt_tokens": [len(ids) for ids in copy_ids]}), file=sys.stderr)
    results: dict[tuple[str, int], dict[str, list]] = {
        (w, s): {"off": [], "ngram": [], "equal": [], "proposed": [], "accepted": []}
        for w, s, *_ in cases}
    loads = []
    for arm in arms:  # warm-up
        arm.run([copy_ids[0]], 8, 0)
    try:
        for r in range(a.rounds):
            loads.append(os.getloadavg()[0])
            for workload, streams, prompts, max_new, min_new in cases:
                order = arms if r % 2 == 0 else arms[::-1]
                out = {arm.name: arm.run(prompts, max_new, min_new) for arm in order}
                entry = results[(workload, streams)]
                for name in ("off", "ngram"):
                    entry[name].append(out[name]["rate"])
                entry["equal"].append(out["off"]["tokens"] == out["ngram"]["tokens"])
                entry["proposed"].append(out["ngram"]["proposed"])
                entry["accepted"].append(out["ngram"]["accepted"])
                print(f"round {r + 1}/{a.rounds} {workload}@{streams} (load {loads[-1]:.1f}): "
                      f"off {out['off']['rate']:.1f}, ngram {out['ngram']['rate']:.1f} tokens/s, "
                      f"{out['ngram']['accepted']}/{out['ngram']['proposed']} accepted, "
                      f"{out['off']['generated']} tokens", file=sys.stderr, flush=True)
    finally:
        for arm in arms:
            arm.close()
    for (workload, streams), entry in results.items():
        ratios = [x / y for x, y in zip(entry["ngram"], entry["off"], strict=True)]
        proposed, accepted = sum(entry["proposed"]), sum(entry["accepted"])
        print(json.dumps({
            "workload": workload, "streams": streams,
            "off_tokens_per_s": round(statistics.median(entry["off"]), 1),
            "ngram_tokens_per_s": round(statistics.median(entry["ngram"]), 1),
            "ratio": round(statistics.median(ratios), 3),
            "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
            "accepted_of_proposed": [accepted, proposed],
            "greedy_equal": all(entry["equal"])}))
    print(json.dumps({"model": a.model, "rounds": a.rounds, "threads": a.threads,
                      "verify_drift": arms[1].engine.verify_drift,
                      "copy_tokens": a.copy_tokens, "free_tokens": a.free_tokens,
                      "load_average_1m": [round(x, 1) for x in loads]}))


if __name__ == "__main__":
    main()
