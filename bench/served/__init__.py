"""The served path through real processes: serving load, token-path CPU, the gRPC floor."""
