"""Tenants: who a call is charged to, each one's KV quota and fair-share weight (pure).

The scheduler reads a TOML file (the standard library's tomllib: no new
dependency, and TOML's tables read as the settings they are) at start and on
SIGHUP; a file that does not parse, or says something this module does not
accept, is refused naming its line, and a refused reload keeps the table in
force. The format is documented in docs/features/tenants.md:

    default_tenant = "batch"          # calls that name no tenant ("": the pool's only)
    trust_tenant_metadata = false     # honour the `ortserve-tenant` metadata a gateway sets

    [tenants.interactive]
    quota = "70%"                     # a share of the model's capacity, or bytes ("2GiB", 2147483648)
    weight = 7                        # its share of room that frees while tenants wait
    key_sha256 = ["<sha256 hex of an API key>"]
    models = { "SmolLM2-135M" = "50%" }   # per-model quotas over `quota`
    requests_per_s = 5                # optional: a token bucket on starting requests (rate.py)
    burst = 10                        # its size (default: requests_per_s rounded up)

No grpc here: the servicer passes the caller's key digest and metadata value
to `TenantTable.resolve`, the ledger asks `quota_bytes` under its lock.
"""

from __future__ import annotations

import hashlib
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ortserve.rules.request_rules import TENANT_METADATA
from ortserve.status.errors import DomainError, ErrorReason, clip, quoted
from ortserve.status.units import human_bytes, parse_bytes

METADATA_KEY = TENANT_METADATA  # the gRPC metadata a trusted gateway sets
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_TOP_KEYS = ("default_tenant", "trust_tenant_metadata", "tenants")
_TENANT_KEYS = ("quota", "weight", "key_sha256", "models", "requests_per_s", "burst")


class TenantFileError(ValueError):
    """A tenants file refused: the message names the file and the line."""


@dataclass(frozen=True)
class Quota:
    """A tenant's most KV bytes: absolute (`share` None) or a share of the capacity."""

    absolute_bytes: int = 0
    share: float | None = None  # 0 < share <= 1

    def bytes_of(self, capacity_bytes: int) -> int:
        if self.share is None:
            return self.absolute_bytes
        return math.floor(self.share * capacity_bytes)

    def text(self, capacity_bytes: int) -> str:
        if self.share is None:
            return human_bytes(self.absolute_bytes)
        return (f"{self.share * 100:g} % of {human_bytes(capacity_bytes)} = "
                f"{human_bytes(self.bytes_of(capacity_bytes))}")


@dataclass(frozen=True)
class Tenant:
    name: str
    quota: Quota | None = None  # None: no quota of its own (the pool's room only)
    weight: float = 1.0
    models: Mapping[str, Quota] = field(default_factory=dict)
    requests_per_s: float | None = None  # a token bucket on starting requests; None: no limit
    burst: int = 1  # the bucket's size: requests it may start at once after a quiet spell

    def quota_for(self, model: str) -> Quota | None:
        """The quota on `model`'s workers ("": the whole pool): its own line, else `quota`."""
        return self.models.get(model, self.quota)


@dataclass(frozen=True)
class TenantTable:
    """The tenants in force. Empty: no tenants (every call is the pool's, as before)."""

    tenants: Mapping[str, Tenant] = field(default_factory=dict)
    tenant_of_digest: Mapping[bytes, str] = field(default_factory=dict)
    default_tenant: str = ""
    trust_tenant_metadata: bool = False
    source: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.tenants)

    def get(self, name: str) -> Tenant | None:
        return self.tenants.get(name)

    def weight(self, name: str) -> float:
        tenant = self.tenants.get(name)
        return tenant.weight if tenant else 1.0

    def quota_bytes(self, name: str, model: str, capacity_bytes: int) -> int | None:
        """Tenant `name`'s quota on `model` given that model's capacity; None: no quota."""
        tenant = self.tenants.get(name)
        quota = tenant.quota_for(model) if tenant else None
        return None if quota is None else quota.bytes_of(capacity_bytes)

    def resolve(self, key_digest: bytes | None, claimed: str | None) -> str:
        """The tenant a call is charged to ("" none): its key's, else the trusted metadata's,
        else the default. Raises INVALID_REQUEST for metadata that cannot be honoured."""
        by_key = self.tenant_of_digest.get(key_digest) if key_digest else None
        if claimed is None or claimed == "":
            return by_key or self.default_tenant
        if by_key is not None:
            if claimed != by_key:
                raise _refused(f"the call's {METADATA_KEY} metadata names tenant "
                               f"{quoted(claimed)} but its API key is tenant {quoted(by_key)}; "
                               f"drop the metadata (the key decides) or use that tenant's key",
                               claimed)
            return by_key
        if not self.trust_tenant_metadata:
            raise _refused(f"this scheduler does not trust {METADATA_KEY} metadata (its tenants "
                           f"file {self.source or '(none)'} has trust_tenant_metadata = false); "
                           "call with the tenant's API key, or have the operator set "
                           "trust_tenant_metadata once only the gateway can reach this port",
                           claimed)
        if claimed not in self.tenants:
            raise _refused(f"the {METADATA_KEY} metadata names tenant {quoted(claimed)}, not one "
                           f"of the {len(self.tenants)} in {self.source}: "
                           f"{', '.join(sorted(self.tenants))}; send one of those", claimed)
        return claimed


def _refused(message: str, claimed: str) -> DomainError:
    return DomainError(ErrorReason.INVALID_REQUEST, message,
                       metadata={"tenant_metadata": clip(claimed, 64)})


# -- the file ----------------------------------------------------------------------


def key_digest(key: str) -> bytes:
    """What a tenants file's key_sha256 holds (hex): `printf %s KEY | sha256sum`."""
    return hashlib.sha256(key.encode()).digest()


def load(path: str) -> TenantTable:
    """The tenants file at `path`; raises TenantFileError naming the line, OSError if unreadable."""
    with open(path, encoding="utf-8") as f:
        return parse(f.read(), path)


def parse(text: str, source: str) -> TenantTable:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:  # its message ends "(at line N, column M)"
        raise TenantFileError(f"{source}: not TOML: {error}") from None

    def refuse(line: int, message: str) -> TenantFileError:
        return TenantFileError(f"{source} line {line}: {message}")

    for key in data:
        if key not in _TOP_KEYS:
            raise refuse(_line_of(text, None, key), f"unknown setting {key!r}; the top level "
                         f"takes {', '.join(_TOP_KEYS)} (docs/features/tenants.md)")
    raw_tenants = data.get("tenants", {})
    if not isinstance(raw_tenants, dict):
        raise refuse(_line_of(text, None, "tenants"), "tenants must be a table ([tenants.NAME])")
    tenants: dict[str, Tenant] = {}
    of_digest: dict[bytes, str] = {}
    for name, raw in raw_tenants.items():
        line = _line_of(text, name, None)
        if not _NAME.match(name):
            raise refuse(line, f"tenant name {name!r}: use 1 to 64 letters, digits, '.', '_' "
                         "or '-', starting with a letter or digit")
        if not isinstance(raw, dict):
            raise refuse(line, f"tenant {name!r} must be a table ([tenants.{name}])")
        for key in raw:
            if key not in _TENANT_KEYS:
                raise refuse(_line_of(text, name, key), f"tenant {name!r}: unknown setting "
                             f"{key!r}; a tenant takes {', '.join(_TENANT_KEYS)}")
        try:
            quota = _quota(raw["quota"]) if "quota" in raw else None
        except ValueError as error:
            raise refuse(_line_of(text, name, "quota"), f"tenant {name!r} quota: {error}") from None
        weight = raw.get("weight", 1)
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight > 0 \
                or not math.isfinite(weight):
            raise refuse(_line_of(text, name, "weight"), f"tenant {name!r} weight: must be a "
                         f"number > 0, got {weight!r}")
        models: dict[str, Quota] = {}
        raw_models = raw.get("models", {})
        if not isinstance(raw_models, dict):
            raise refuse(_line_of(text, name, "models"), f"tenant {name!r} models: a table of "
                         "model name = quota")
        for model, value in raw_models.items():
            try:
                models[model] = _quota(value)
            except ValueError as error:
                raise refuse(_line_of(text, name, model), f"tenant {name!r} model {model!r} "
                             f"quota: {error}") from None
        digests = raw.get("key_sha256", [])
        if isinstance(digests, str):
            digests = [digests]
        for hex_digest in digests if isinstance(digests, list) else [digests]:
            key_line = _line_of(text, name, "key_sha256")
            if not isinstance(hex_digest, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", hex_digest):
                raise refuse(key_line, f"tenant {name!r} key_sha256: each entry is the 64 hex "
                             "digits of an API key's SHA-256 (printf %s KEY | sha256sum), got "
                             f"{clip(hex_digest, 16)!r}")
            digest = bytes.fromhex(hex_digest)
            if of_digest.get(digest, name) != name:
                raise refuse(key_line, f"tenant {name!r} key_sha256: that key is tenant "
                             f"{of_digest[digest]!r}'s already; a key is one tenant's")
            of_digest[digest] = name
        rate = raw.get("requests_per_s")
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int | float)
                                 or not 0 < rate < math.inf):
            raise refuse(_line_of(text, name, "requests_per_s"), f"tenant {name!r} "
                         f"requests_per_s: must be a number > 0, got {rate!r}")
        burst = raw.get("burst", max(1, math.ceil(rate)) if rate is not None else 1)
        if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1 or (
                rate is None and "burst" in raw):
            raise refuse(_line_of(text, name, "burst"), f"tenant {name!r} burst: an integer "
                         f">= 1 beside requests_per_s, got {burst!r}")
        tenants[name] = Tenant(name, quota, float(weight), MappingProxyType(models),
                               float(rate) if rate is not None else None, burst)
    default = data.get("default_tenant", "")
    if not isinstance(default, str) or (default and default not in tenants):
        raise refuse(_line_of(text, None, "default_tenant"), f"default_tenant {default!r} is "
                     f"not a tenant of this file ({', '.join(sorted(tenants)) or 'none'})")
    trust = data.get("trust_tenant_metadata", False)
    if not isinstance(trust, bool):
        raise refuse(_line_of(text, None, "trust_tenant_metadata"),
                     f"trust_tenant_metadata must be true or false, got {trust!r}")
    return TenantTable(MappingProxyType(tenants), MappingProxyType(of_digest), default, trust,
                       source)


def _quota(value: object) -> Quota:
    """'30%' -> a share; '2GiB' or 2147483648 -> bytes."""
    if isinstance(value, bool):
        raise ValueError(f"got {value!r}; give a share ('30%') or bytes ('2GiB', 2147483648)")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{value:,} bytes is negative")
        return Quota(absolute_bytes=value)
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            percent = float(value.strip()[:-1])
        except ValueError:
            raise ValueError(f"{value!r} is not a percentage (e.g. '30%')") from None
        if not 0 < percent <= 100:
            raise ValueError(f"{value!r}: a share is more than 0 % and at most 100 %")
        return Quota(share=percent / 100)
    if isinstance(value, str) and re.fullmatch(r"\s*[0-9.]+\s*", value):
        raise ValueError(f"{value!r} is not a byte size: say which, '{value.strip()}%' or "
                         f"'{value.strip()}GiB' (a bare TOML integer is bytes)")
    if isinstance(value, str):
        return Quota(absolute_bytes=parse_bytes(value))
    raise ValueError(f"got {value!r}; give a share ('30%') or bytes ('2GiB', 2147483648)")


_HEADER = re.compile(r"^\s*\[\s*([^\]]+?)\s*\]")


def _dotted(header: str) -> tuple[str, ...]:
    return tuple(part.strip().strip("\"'") for part in re.findall(r'"[^"]*"|\'[^\']*\'|[^.]+',
                                                                  header))


def _line_of(text: str, tenant: str | None, key: str | None) -> int:
    """The 1-based line where `key` is set (in tenant's table when given); the table's
    header when the key is not found; 1 when neither is (TOML has no positions after parsing)."""
    section: tuple[str, ...] = ()
    header_line = 0
    want = ("tenants", tenant) if tenant is not None else ()
    for n, line in enumerate(text.splitlines(), 1):
        match = _HEADER.match(line)
        if match:
            section = _dotted(match.group(1).strip("[]"))
            if tenant is not None and section[:2] == want and not header_line:
                header_line = n
            continue
        stripped = line.split("#", 1)[0].strip()
        if not stripped or "=" not in stripped:
            continue
        name = stripped.split("=", 1)[0].strip().strip("\"'")
        if tenant is None:
            if not section and key is not None and name == key:
                return n
        elif section[:2] == want and key is not None and name == key:
            return n
        elif section == ("tenants",) and name == tenant and not header_line:
            header_line = n  # an inline table: [tenants] name = { ... }
    return header_line or 1
