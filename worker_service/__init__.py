"""The ortserve worker: one model on one device, run over ONNX Runtime.

The engine (`engine.py` and the modules beside it: model, tokenizer, sampling,
kv_cache, errors) is pure Python over onnxruntime, with no gRPC or protobuf;
the servicer translates between it and the wire.
"""
