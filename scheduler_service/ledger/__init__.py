"""The scheduler's pure core: value types, sentences and errors, placement, the ledger, the admission queue (imports run one way, in that order). No grpc, no protobuf."""
