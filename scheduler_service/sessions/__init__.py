"""Sessions: the registry (pure) and the session parts (build.py), composed into the servicer."""
