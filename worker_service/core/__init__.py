"""The worker's pure core: sequences, the step scheduler, sampling, the tokenizer, domain errors. No ONNX Runtime, no grpc."""
