"""Errors the server answers with a status code and a one-line message, in OpenAI's shape:
``{"error": {"message": ..., "type": ..., "param": ..., "code": ...}}``, so the ``openai``
client raises its own exception class for each status (``param`` names the request field at
fault, where there is one)."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, code: str | None = None,
                 param: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.headers = headers
        self.status = status
        self.message = " ".join(str(message).split())
        self.code = code
        self.param = param


def error_body(status: int, message: str, code: str | None = None,
               param: str | None = None) -> dict[str, Any]:
    kind = ("authentication_error" if status == 401 else
            "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": " ".join(str(message).split()), "type": kind, "param": param,
                      "code": code}}


def validation_param(errors: list[dict[str, Any]]) -> str | None:
    """The request field of pydantic's first error (``max_tokens``, ``messages.0.role``)."""
    for err in errors[:1]:
        where = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        return where or None
    return None


def validation_message(errors: list[dict[str, Any]]) -> str:
    """pydantic's errors as one line: ``body.max_tokens: Input should be ...; ...``."""
    parts = []
    for err in errors[:3]:
        where = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or "body"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    more = f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""
    return "; ".join(parts) + more
