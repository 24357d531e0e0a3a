"""The rules both edges apply to a request, written once: its ranges and shapes,
the KV-cache byte arithmetic, the prefix cache's key, the chat roles.
"""
