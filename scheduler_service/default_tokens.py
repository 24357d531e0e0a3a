"""The server's ceiling for a request that sets no max_new_tokens (pure).

Without one, a request without a limit reserves the model's whole remaining
window up front (SmolLM2 fp32: 8,192 tokens, ~377 MB of KV): one chat that
sets none fills a small worker. Peers let such a request run to the window
too (vLLM, TGI, llama-server's `-n -1`), but they allocate KV as tokens come;
ortserve reserves the worst case at admission, so its default has to be a
number. DEFAULT_TOKENS is long enough that ordinary answers end by themselves
first, and a fraction of a modern window.

`--default-max-new-tokens 4096` sets it for every model, `--default-max-new-tokens
smollm2=1024` for one model (repeatable, the per-model value wins); 0 means
none: such a request asks for the remaining window, as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

DEFAULT_TOKENS = 4096
MAX_TOKENS = 2**32 - 1


@dataclass(frozen=True)
class DefaultMaxNewTokens:
    """The default ceiling per model: `per_model[name]`, else `tokens`; 0 is none."""

    tokens: int = DEFAULT_TOKENS
    per_model: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    def for_model(self, model: str) -> int | None:
        """The default for `model` (the request's model as resolved); None: the window."""
        tokens = self.per_model.get(model, self.tokens)
        return tokens or None

    def describe(self) -> str:
        """One line for the startup log: what applies to whom."""
        every = f"{self.tokens:,} tokens" if self.tokens else "none (the remaining window)"
        own = ", ".join(f"{m}={n:,}" if n else f"{m}=none" for m, n in sorted(self.per_model.items()))
        return every + (f"; {own}" if own else "")


def parse(values: Iterable[str]) -> DefaultMaxNewTokens:
    """`N` (every model) and `MODEL=N` (one model) items, each possibly a comma list;
    the last plain `N` wins. Raises ValueError naming the bad item."""
    tokens, per_model = DEFAULT_TOKENS, {}
    for value in values:
        for item in (part.strip() for part in str(value).split(",")):
            if not item:
                continue
            model, _, number = item.rpartition("=")
            if "=" in item and not model:
                raise ValueError(f"{item!r} names no model: use MODEL=N or N")
            n = _tokens(item, number)
            if model:
                per_model[model] = n
            else:
                tokens = n
    return DefaultMaxNewTokens(tokens, MappingProxyType(per_model))


def _tokens(item: str, number: str) -> int:
    if not number.strip().isdigit() or int(number) > MAX_TOKENS:
        raise ValueError(f"{item!r} is not N or MODEL=N with N a whole number of tokens from 0 "
                         f"(none: the remaining window) to {MAX_TOKENS:,}")
    return int(number)
