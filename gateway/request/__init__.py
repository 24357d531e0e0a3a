"""OpenAI request JSON -> the proto (pure: no HTTP, no grpc): the chat and completion
bodies, their messages, tools, vLLM's extra keys, response_format, the typed
parameter readers and their one refusal, /tokenize's bodies.
"""
