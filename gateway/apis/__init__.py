"""The HTTP APIs, one folder each (chat and completions, OpenAI's Responses API with its
stored responses, Anthropic's Messages API), each a request side, a reply side and a
route, all over the one generation path (gateway/generation.py).
"""
