"""The one error a request's sampling settings raise: which field is wrong, and why."""

from __future__ import annotations


class ParamError(ValueError):
    """A request parameter is out of range; `param` names it for the API error."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
