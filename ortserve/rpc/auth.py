"""API keys and roles, checked in one grpc.aio server interceptor.

A call carries `authorization: Bearer <key>` metadata. Each key has roles;
each RPC needs one (METHOD_ROLES); health and reflection stay open so probes
and grpcurl's `list` work without a key. With no keys configured the server is
open (the local demo): every caller has every role.

Keys come from a file or an environment variable (never argv, where `ps` shows
them): one `role:key` entry per line or whitespace-separated, `#` comments;
roles are `generate` and `admin` (admin includes generate).
"""

from __future__ import annotations

import contextvars
import enum
import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import grpc
import structlog

from ortserve.rpc.error_path import domain_status
from ortserve.status.errors import DomainError, ErrorReason

log = structlog.get_logger("auth")


class Role(enum.StrEnum):
    # Generate, Admit, sessions, Release of one's own lease, GetBudget's totals
    GENERATE = "generate"
    ADMIN = "admin"  # also every caller's lease ids (GetBudget include_leases)


# What each role grants: admin includes generate.
_GRANTS = {Role.GENERATE: frozenset({Role.GENERATE}),
           Role.ADMIN: frozenset({Role.GENERATE, Role.ADMIN})}
ALL_ROLES = frozenset(Role)

# The minimum role per full method name. A method neither here nor open needs
# admin: a new RPC is closed until someone decides who may call it.
METHOD_ROLES: dict[str, Role] = {
    "/ortserve.v1.Scheduler/Generate": Role.GENERATE,
    "/ortserve.v1.Scheduler/Admit": Role.GENERATE,
    "/ortserve.v1.Scheduler/Release": Role.GENERATE,
    "/ortserve.v1.Scheduler/GetBudget": Role.GENERATE,  # include_leases: admin, in the servicer
    "/ortserve.v1.Scheduler/Tokenize": Role.GENERATE,
    "/ortserve.v1.Scheduler/Detokenize": Role.GENERATE,
    # A session is a generating client's conversation: the same role as Generate.
    "/ortserve.v1.Scheduler/OpenSession": Role.GENERATE,
    "/ortserve.v1.Scheduler/SessionTurn": Role.GENERATE,
    "/ortserve.v1.Scheduler/GetSession": Role.GENERATE,
    "/ortserve.v1.Scheduler/SwapOutSession": Role.GENERATE,
    "/ortserve.v1.Scheduler/CloseSession": Role.GENERATE,
    # Stored responses continue sessions: the same role.
    "/ortserve.v1.Scheduler/PutStoredResponse": Role.GENERATE,
    "/ortserve.v1.Scheduler/GetStoredResponse": Role.GENERATE,
    "/ortserve.v1.Scheduler/DeleteStoredResponse": Role.GENERATE,
    "/ortserve.v1.Scheduler/ClaimStoredResponse": Role.GENERATE,
    "/ortserve.v1.Scheduler/EndStoredTurn": Role.GENERATE,
    # Loading and unloading LoRA adapters moves a worker's capacity: an operator's call.
    "/ortserve.v1.Scheduler/LoadAdapter": Role.ADMIN,
    "/ortserve.v1.Scheduler/UnloadAdapter": Role.ADMIN,
}
OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.v1alpha.ServerReflection/",
                 "/grpc.reflection.v1.ServerReflection/")

# The calling key's roles, set by the interceptor around each handler (the one
# place a handler learns who called: GetBudget's include_leases asks it).
_caller_roles: contextvars.ContextVar[frozenset[Role]] = contextvars.ContextVar(
    "ortserve_caller_roles", default=ALL_ROLES)


# The calling key's SHA-256 digest (None: no keys configured), beside its roles: the
# scheduler charges the call to the tenant its tenants file maps that digest to.
_caller_key_digest: contextvars.ContextVar[bytes | None] = contextvars.ContextVar(
    "ortserve_caller_key_digest", default=None)


def caller_key_digest() -> bytes | None:
    return _caller_key_digest.get()


def caller_has(role: Role) -> bool:
    return role in _caller_roles.get()


def require_role(role: Role, what: str) -> None:
    """Raise ROLE_REQUIRED (PERMISSION_DENIED) unless the caller's key has `role`."""
    roles = _caller_roles.get()
    if role not in roles:
        raise DomainError(ErrorReason.ROLE_REQUIRED,
                          f"{what} needs a key with role {role.value}; this key has "
                          f"{', '.join(sorted(roles)) or 'no role'}; ask an operator for an "
                          f"{role.value} key or leave that option out",
                          metadata={"required_role": role.value, "key_roles": ",".join(sorted(roles))})


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


@dataclass(frozen=True)
class ApiKeys:
    """Known keys (as SHA-256 digests, so no plaintext key sits in memory dumps of the table)."""

    roles_of_digest: Mapping[bytes, frozenset[Role]] = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        return bool(self.roles_of_digest)

    def roles(self, key: str) -> frozenset[Role] | None:
        digest = _digest(key)
        found = None
        # NOTE: compare against every entry in constant time per entry: no early exit
        # that would tell a prober how close a guess came.
        for known, roles in self.roles_of_digest.items():
            if hmac.compare_digest(known, digest):
                found = roles
        return found

    def __len__(self) -> int:
        return len(self.roles_of_digest)


def parse_keys(text: str, source: str) -> ApiKeys:
    """`role:key` entries (lines or whitespace-separated; `#` starts a comment)."""
    table: dict[bytes, frozenset[Role]] = {}
    for n, line in enumerate(text.splitlines(), 1):
        for entry in line.split("#", 1)[0].split():
            role, sep, key = entry.partition(":")
            if not sep or not key:
                raise ValueError(f"{source} line {n}: expected role:key (role one of "
                                 f"{', '.join(Role)}), got an entry of {len(entry)} chars "
                                 "without ':'")
            try:
                grants = _GRANTS[Role(role)]
            except ValueError:
                raise ValueError(f"{source} line {n}: unknown role {role!r}; roles are "
                                 f"{', '.join(Role)}") from None
            if len(key) < 16:
                raise ValueError(f"{source} line {n}: the {role} key is {len(key)} chars; use "
                                 "at least 16 (e.g. `openssl rand -hex 24`)")
            table[_digest(key)] = table.get(_digest(key), frozenset()) | grants
    return ApiKeys(table)


def load_keys(path: str | None, env_text: str | None) -> ApiKeys:
    """Keys from --api-keys-file and/or the environment variable's text, merged."""
    merged: dict[bytes, frozenset[Role]] = {}
    sources = []
    if path:
        with open(path, encoding="utf-8") as f:
            sources.append(parse_keys(f.read(), path))
    if env_text:
        sources.append(parse_keys(env_text, "the API keys environment variable"))
    for keys in sources:
        for digest, roles in keys.roles_of_digest.items():
            merged[digest] = merged.get(digest, frozenset()) | roles
    return ApiKeys(merged)


def _bearer(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode() if isinstance(value, bytes) else value
            scheme, _, token = text.strip().partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
    return None


def _refusal(handler: grpc.RpcMethodHandler, error: DomainError) -> grpc.RpcMethodHandler:
    """A handler of the same shape that only ends the call with `error`'s status."""
    code, message, trailers = domain_status(error)  # the one table (status_table.py)

    async def refuse(request, context):
        context.set_trailing_metadata(trailers)
        await context.abort(code, message)

    async def refuse_stream(request, context):
        await refuse(request, context)
        yield  # pragma: no cover (never reached: abort raises)

    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse_stream)
    return grpc.unary_unary_rpc_method_handler(refuse)


def _with_roles(handler: grpc.RpcMethodHandler, roles: frozenset[Role],
                digest: bytes | None = None) -> grpc.RpcMethodHandler:
    """The same handler, run with the caller's roles (and key digest) in context."""
    if handler.unary_unary is not None:
        inner = handler.unary_unary

        async def unary(request, context):
            token = _caller_roles.set(roles)
            key_token = _caller_key_digest.set(digest)
            try:
                return await inner(request, context)
            finally:
                _caller_key_digest.reset(key_token)
                _caller_roles.reset(token)
        return handler._replace(unary_unary=unary)
    if handler.unary_stream is not None:
        inner_stream = handler.unary_stream

        async def stream(request, context):
            _caller_roles.set(roles)  # this async generator's own context
            _caller_key_digest.set(digest)
            async for item in inner_stream(request, context):
                yield item
        return handler._replace(unary_stream=stream)
    return handler  # no client-streaming RPCs here


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """The one place keys and roles are checked for a server's RPCs."""

    def __init__(self, keys: ApiKeys, method_roles: Mapping[str, Role] = METHOD_ROLES) -> None:
        self._keys = keys
        self._method_roles = method_roles

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or not self._keys.enabled or method.startswith(OPEN_PREFIXES):
            return handler
        needed = self._method_roles.get(method, Role.ADMIN)
        key = _bearer(handler_call_details.invocation_metadata)
        if not key:
            error = DomainError(
                ErrorReason.API_KEY_MISSING,
                f"{method} needs an API key: send metadata 'authorization: Bearer <key>' "
                f"(this server knows {len(self._keys)} key(s)); the CLI and the Python client "
                "read it from ORTSERVE_API_KEY", metadata={"method": method})
        elif (roles := self._keys.roles(key)) is None:
            error = DomainError(
                ErrorReason.API_KEY_UNKNOWN,
                f"{method}: the API key ({len(key)} chars) is not one of this server's "
                f"{len(self._keys)} key(s); check ORTSERVE_API_KEY or ask an operator for a key",
                metadata={"method": method, "key_chars": len(key)})
        elif needed not in roles:
            error = DomainError(
                ErrorReason.ROLE_REQUIRED,
                f"{method} needs a key with role {needed.value}; this key has "
                f"{', '.join(sorted(roles))}; ask an operator for an {needed.value} key",
                metadata={"method": method, "required_role": needed.value,
                          "key_roles": ",".join(sorted(roles))})
        else:
            return _with_roles(handler, roles, _digest(key))
        log.warning("call refused", method=method, reason=error.reason.value)
        return _refusal(handler, error)
