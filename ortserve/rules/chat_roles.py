"""Chat roles the API accepts (types.proto ChatMessage.role): one list for every edge
that checks them (the scheduler, the worker, and the gateway's mapping onto them)."""

CHAT_ROLES = ("system", "user", "assistant", "tool")  # tool: a function's result
