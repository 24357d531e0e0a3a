"""One-off A/B runs and profiles of the engine and plain ORT loops (outputs: bench/results/)."""
