"""The gateway's own refusal of a parameter (pure): HTTP 400 with `param` naming it."""

from __future__ import annotations


class ParamError(ValueError):
    """A parameter the gateway refuses: HTTP 400 with `param` naming it."""

    def __init__(self, param: str, message: str, code: str = "invalid_parameter") -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = f"{param}: {message}"
        self.code = code
