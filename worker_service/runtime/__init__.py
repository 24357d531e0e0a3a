"""ONNX Runtime and KV memory: the model, device resolution, the runners, the KV pool, the arena, session KV."""
