"""The other HTTP APIs, served over the chat path: OpenAI's Responses API (with its
stored responses) and Anthropic's Messages API, each a request side, a reply
side and a route.
"""
