"""ortserve: LLM serving over gRPC on ONNX Runtime, with an honest KV-cache byte budget.

`ortserve.v1` holds the generated protobuf/gRPC stubs (never edit them: `make protos`).
The modules beside it are the pieces both services share.
"""
