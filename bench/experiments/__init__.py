"""One-off A/B runs and profiles: the engine, plain ORT loops, gRPC channels (outputs: bench/results/)."""
