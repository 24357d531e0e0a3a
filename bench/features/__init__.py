"""One feature's cost or gain: prefix cache, sessions, constrained decode, LoRA, speculation."""
