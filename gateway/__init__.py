"""ortserve-gateway: an OpenAI-compatible HTTP front door over the scheduler's gRPC API.

`translate` maps OpenAI JSON <-> protobuf (pure), `errors` maps gRPC failures to
HTTP in one table, `upstream` holds the grpc.aio calls, `app` the FastAPI routes.
"""
