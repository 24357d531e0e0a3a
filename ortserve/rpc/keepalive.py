"""gRPC keepalive pings: a peer that vanished without closing its connection is found in
seconds, not at each call's deadline.

A worker host powered off, a partition, a process stopped (SIGSTOP, a hung VM): TCP
sees nothing while no data moves, so without pings every stream relayed to that worker
waits for its caller's deadline (minutes), and a shared Relay call holds them all. An
HTTP/2 PING unanswered within the timeout makes the channel give the connection up;
every call on it then fails UNAVAILABLE (the relay names the worker), and the next
request connects again.

Both ends ping: a channel every `interval_s` while it has calls open (not when idle:
nothing waits there), and every ortserve server its callers every DEFAULT_INTERVAL_S; a
server accepts pings every MIN_INTERVAL_S (a gRPC server answers pings more frequent
than it allows with GOAWAY "too_many_pings"; clients enforce no such limit).
"""

from __future__ import annotations

DEFAULT_INTERVAL_S = 10.0  # a silent peer is given up after about twice this
MIN_INTERVAL_S = 1.0  # the most frequent pings an ortserve server accepts
MAX_INTERVAL_S = 86_400.0  # a day: beyond, 0 (off) says it better

def channel_options(interval_s: float) -> tuple[tuple[str, int], ...]:
    """grpc channel options that ping every `interval_s` while calls are open and give the
    connection up when a ping is not answered within as long; 0: no pings (gRPC's default)."""
    if interval_s == 0:
        return ()
    if not MIN_INTERVAL_S <= interval_s <= MAX_INTERVAL_S:  # NaN included
        raise ValueError(f"a keepalive interval of {interval_s:g} s is outside "
                         f"{MIN_INTERVAL_S:g}-{MAX_INTERVAL_S:g} s (ortserve's servers accept "
                         f"pings every {MIN_INTERVAL_S:g} s at most); use 0 for off")
    interval_ms = round(interval_s * 1000)
    return (("grpc.keepalive_time_ms", interval_ms),
            ("grpc.keepalive_timeout_ms", interval_ms),
            # Any ping's answer, not only keepalive's: a flow-control (BDP) ping may be
            # the one in flight when the peer stops, and it waits 60 s by default.
            ("grpc.http2.ping_timeout_ms", interval_ms),
            # gRPC stops pinging after 2 pings without a data frame from us; a relay that
            # only receives (a long generation) would then be unwatched.
            ("grpc.http2.max_pings_without_data", 0))


# A channel at the default interval (the gateway's to the scheduler and to workers).
CHANNEL_OPTIONS = channel_options(DEFAULT_INTERVAL_S)

# How soon a lost peer is tried again. gRPC's reconnect backoff grows from 1 s to 120 s,
# and while a channel waits it out every call on it fails at once (UNAVAILABLE): a worker
# or scheduler restarted on the same port stays unusable, for up to two minutes, to every
# caller that tried it while it was down. Every channel ortserve opens tries again within
# a second instead (one TCP connect a second to a peer that is down).
RECONNECT_OPTIONS = (("grpc.initial_reconnect_backoff_ms", 500),
                     ("grpc.max_reconnect_backoff_ms", 1000))

def server_options(interval_s: float = DEFAULT_INTERVAL_S) -> tuple[tuple[str, int], ...]:
    """For every grpc server ortserve starts (serving.new_server): it accepts pings every
    MIN_INTERVAL_S, and pings its own callers every `interval_s` as channel_options does
    (0: not), so a caller gone silent (a client host lost, a scheduler stopped) has its
    calls cancelled, and what they hold released, in about twice `interval_s` instead of
    when each generation ends (the worker's --caller-keepalive-s; the others: the default)."""
    return (("grpc.http2.min_recv_ping_interval_without_data_ms", int(MIN_INTERVAL_S * 1000)),
            *channel_options(interval_s))


SERVER_OPTIONS = server_options(DEFAULT_INTERVAL_S)
