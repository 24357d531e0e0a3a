"""Sessions: the registry (pure) and the session RPCs, composed into the servicer."""
