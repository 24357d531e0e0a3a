"""A seeded serving workload: what each request asks for, and when it arrives (pure).

Three mixes, each a list of `WorkItem` (prompt token ids, output tokens wanted):
- `chat`: prompts log-normal around 200 tokens (20-2,000), outputs log-normal
  around 120 (10-1,000): the shape of ShareGPT-like traffic that vLLM's
  `bench serve` and SGLang's `bench_serving` replay.
- `long`: long prompts (median 1,500, 500-3,000) and short outputs (median 80,
  10-400): summarising, retrieval-augmented questions; prefill-bound.
- `agentic`: agents that share one long system prefix (1,200 tokens) and whose
  every turn sends the whole history so far plus a new message (tool output,
  user turn), outputs short (median 60): the prefix is shared across agents and
  each turn's prompt begins with the agent's previous one.

Prompts are token ids drawn from `TOKEN_RANGE` (plain vocabulary, clear of the
special tokens), sent as OpenAI's `prompt: [ids]` so every peer sees the same
tokens whatever its tokenizer's text handling. Every chat and long prompt starts
with ids of its own (`_distinct_head`), so no two share a cached prefix. An
agentic turn's history holds the tokens it asked the server for as if they were
the previous answer (the server's real answer is not fed back: it is not known
before the run, and a seeded workload must be the same for every system), so the
prompt part of the history is the reusable prefix, as a real agent's would be.

Arrivals: `poisson_arrivals` (open loop, exponential gaps at a mean rate) or a
closed loop of N users (bench/served/load.py: each user sends its next item when
its last one ends).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

MIXES = ("chat", "long", "agentic")
# SmolLM2's vocabulary holds 49,152 ids; the first few hundred are special tokens and
# bytes. Ids from this range are ordinary word pieces in it (and in the tiny model's,
# which uses the same tokenizer).
TOKEN_RANGE = (1_000, 40_000)
AGENTIC_SYSTEM_TOKENS = 1_200


@dataclass(frozen=True)
class WorkItem:
    """One request of the workload: its prompt and the output it wants, all of it."""

    index: int
    prompt_ids: tuple[int, ...]
    output_tokens: int
    mix: str
    agent: int = -1  # agentic: which agent; -1 otherwise
    turn: int = 0  # agentic: the turn of that agent (0 first)

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)


@dataclass(frozen=True)
class LengthLaw:
    """A log-normal length with its median and spread, clipped to [low, high] tokens."""

    median: float
    sigma: float
    low: int
    high: int

    def draw(self, rng: random.Random) -> int:
        return max(self.low, min(self.high, round(rng.lognormvariate(math.log(self.median),
                                                                    self.sigma))))

    def scaled(self, factor: float) -> LengthLaw:
        """The same shape shrunk (quick runs on the tiny model): every bound times factor."""
        return LengthLaw(max(1.0, self.median * factor), self.sigma, max(1, round(self.low * factor)),
                         max(1, round(self.high * factor)))


PROMPT_LAWS = {"chat": LengthLaw(200, 1.0, 20, 2_000), "long": LengthLaw(1_500, 0.4, 500, 3_000),
               "agentic": LengthLaw(120, 0.8, 20, 600)}  # agentic: each turn's new message
OUTPUT_LAWS = {"chat": LengthLaw(120, 0.9, 10, 1_000), "long": LengthLaw(80, 0.7, 10, 400),
               "agentic": LengthLaw(60, 0.7, 10, 300)}


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(*TOKEN_RANGE) for _ in range(n)]


def _distinct_head(index: int) -> list[int]:
    # NOTE: deterministic in the index alone, so request i's first ids differ from every
    # other request's whatever the rng drew: no prefix cache can serve one from another.
    return [TOKEN_RANGE[0] + index % 997, TOKEN_RANGE[0] + 1_000 + index // 997 % 997]


def make_workload(mix: str, n: int, seed: int, scale: float = 1.0, agents: int = 8) -> list[WorkItem]:
    """n requests of `mix`, the same for a given (mix, n, seed, scale, agents). `scale`
    shrinks every length (0.1: a tenth), for quick runs; `agents` only for `agentic`."""
    if mix not in MIXES:
        raise ValueError(f"mix must be one of {', '.join(MIXES)}, not {mix!r}")
    if n < 1 or not 0 < scale <= 1 or agents < 1:
        raise ValueError(f"need n >= 1, 0 < scale <= 1 and agents >= 1 (n={n}, scale={scale}, "
                         f"agents={agents})")
    rng = random.Random(f"{mix}-{seed}")
    prompts, outputs = PROMPT_LAWS[mix].scaled(scale), OUTPUT_LAWS[mix].scaled(scale)
    if mix != "agentic":
        return [WorkItem(i, tuple(_distinct_head(i) + _ids(rng, prompts.draw(rng) - 2)),
                         outputs.draw(rng), mix) for i in range(n)]
    system = _ids(rng, max(2, round(AGENTIC_SYSTEM_TOKENS * scale)))
    histories = [list(system) for _ in range(agents)]
    items = []
    for i in range(n):
        agent, turn = i % agents, i // agents
        # A first message names its agent, so agents share the system prefix and no more.
        message = ([TOKEN_RANGE[0] + agent] if turn == 0 else []) + _ids(rng, prompts.draw(rng))
        prompt = histories[agent] + message
        wanted = outputs.draw(rng)
        items.append(WorkItem(i, tuple(prompt), wanted, mix, agent, turn))
        histories[agent] = prompt + _ids(rng, wanted)  # the answer, as the next turn sends it
    return items


def poisson_arrivals(rate_per_s: float, duration_s: float, seed: int) -> list[float]:
    """Send times (s from the start) of a Poisson process at `rate_per_s`, over `duration_s`;
    at least one (at 0) so a slow rate still measures something."""
    if rate_per_s <= 0 or duration_s <= 0:
        raise ValueError(f"rate_per_s and duration_s must be > 0 (got {rate_per_s}, {duration_s})")
    rng = random.Random(f"arrivals-{seed}")
    times, t = [], rng.expovariate(rate_per_s)
    while t < duration_s:
        times.append(t)
        t += rng.expovariate(rate_per_s)
    return times or [0.0]


def describe(items: list[WorkItem]) -> dict:
    """What the workload holds, for the JSON: counts and length quantiles."""
    def q(values: list[int]) -> dict:
        s = sorted(values)
        return {"min": s[0], "p50": s[len(s) // 2], "p90": s[min(len(s) - 1, len(s) * 9 // 10)],
                "max": s[-1], "mean": sum(s) / len(s)}

    return {"requests": len(items), "mix": items[0].mix,
            "prompt_tokens": q([it.prompt_tokens for it in items]),
            "output_tokens": q([it.output_tokens for it in items])}
