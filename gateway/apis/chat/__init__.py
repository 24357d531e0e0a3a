"""POST /v1/chat/completions and POST /v1/completions: one request shape, n choices."""
