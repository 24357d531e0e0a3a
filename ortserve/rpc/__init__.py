"""gRPC as every service speaks it: one error path per servicer, API keys, TLS and
keepalive, a server's shared set-up, the relay's frames and client, the worker leg
of an admitted request, the health probe.
"""
