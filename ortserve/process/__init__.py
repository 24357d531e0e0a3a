"""One process's life: logging (native stderr included), flags' environment
defaults, the start-up banner, exclusively held ports, metrics, tracing and
the version.
"""
