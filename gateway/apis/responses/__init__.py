"""OpenAI's Responses API: POST /v1/responses, GET and DELETE of a stored one."""
