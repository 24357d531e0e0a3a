"""The proto's events -> OpenAI's JSON, SSE chunks and headers (pure): the response
shapes, logprobs, one output's reasoning / text / tool-call pieces, and gRPC
failures as OpenAI-shaped HTTP errors through one table.
"""
