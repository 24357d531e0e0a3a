"""The ortserve worker: one model on one device, run over ONNX Runtime.

The engine (`engine/`, over `runtime/` and `core/`: model, tokenizer, sampling,
KV, errors) is pure Python over onnxruntime, with no gRPC or protobuf; the
modules at this top level are the edge: the servicer translates between the
engine and the wire.
"""
