"""ortserve: LLM serving over gRPC on ONNX Runtime, with an honest KV-cache byte budget.

`ortserve.v1` holds the generated protobuf/gRPC stubs (never edit them: `make protos`).
The wings beside it are the pieces every service shares, one idea each (each wing's
__init__ says what is in it):

- `status`: domain errors, the reason -> status table, rich details, human units
- `rules`: the rules both edges apply to a request, written once
- `output`: what a model writes: its grammar, the tool-call and reasoning parsers, a chat's history
- `rpc`: gRPC as every service speaks it: the error path, keys, TLS, keepalive, the relay, the worker leg
- `process`: one process's life: logs, env defaults, banner, ports, metrics, tracing, version

Lower wings never import higher ones: `status` and `process` import no other wing;
`output` imports `status`; `rules` imports `output` and `status`; `rpc` imports
`status` and `process`.
"""
