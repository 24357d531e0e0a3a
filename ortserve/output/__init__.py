"""What a model writes, and how it is constrained, read and remembered: the output
grammar (structured output, tool calls), the tool-call and reasoning parsers, and
a chat's remembered history. Pure: no grpc, no HTTP.
"""
