"""Errors in OpenAI's format: {"error": {"message", "type", "param", "code"}} with an HTTP status."""

from __future__ import annotations

from typing import Any


class APIError(Exception):
    """An error answered to the client as is; status and body follow the OpenAI API."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid(message: str, param: str | None = None, code: str | None = None) -> APIError:
    """400: the request itself is wrong (bad JSON, a bad or unsupported parameter)."""
    return APIError(400, message, param=param, code=code)


def model_not_found(name: str, served: str) -> APIError:
    return APIError(404, f"The model '{name}' does not exist (this server serves '{served}')", param="model",
                    code="model_not_found")


def server_error(message: str, status: int = 500) -> APIError:
    return APIError(status, message, type="server_error")
