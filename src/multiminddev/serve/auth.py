"""Who may use the server, and which adapter folders a request may name.

- ``ApiKeyMiddleware``: with ``ServeConfig.api_key`` set, every ``/v1/`` route wants
  ``Authorization: Bearer <key>`` (as OpenAI and vLLM's ``--api-key``); a missing or wrong key
  is answered 401 with an OpenAI error object (``code: invalid_api_key``), so the ``openai``
  client raises ``AuthenticationError``. The page (``/``, ``/static``), ``/health`` and
  ``/metrics`` stay open: they carry no model output and change nothing.
- Admin routes (adapter load/unload, A/B changes, promotion) sit under ``/v1/`` and so need the
  key too; ``ServeConfig`` refuses a host beyond loopback without a key, so they are open only
  to this machine's own users.
- ``confine_adapter_path``: a folder named in a request must lie inside one of the configured
  adapter roots once resolved (symbolic links and ``..`` followed), so a client cannot make the
  server read an arbitrary folder.

Not covered: TLS (put a reverse proxy in front for that) and per-user keys or rate limits.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from multiminddev.serve.errors import error_body

API_KEY_ENV = "MULTIMINDDEV_API_KEY"
PROTECTED_PREFIX = "/v1/"


class PathOutsideRootsError(ValueError):
    """An adapter folder outside every configured adapter root."""


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bearer_matches(authorization: str | None, key: str) -> bool:
    """``Authorization: Bearer <key>`` holds ``key`` (compared in constant time)."""
    scheme, _, given = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), key.encode())


def confine_adapter_path(path: str, roots: Sequence[Path]) -> Path:
    """``path`` resolved (a relative one against the first root); PathOutsideRootsError unless
    it lies inside one of ``roots``."""
    if not roots:
        raise PathOutsideRootsError("this server takes no adapter folders from requests (no "
                                    "adapter root: start it with --adapter-root FOLDER)")
    real_roots = [Path(r).resolve() for r in roots]
    given = Path(path)
    resolved = (given if given.is_absolute() else real_roots[0] / given).resolve()
    if not any(resolved == root or resolved.is_relative_to(root) for root in real_roots):
        raise PathOutsideRootsError(
            f"{path} is outside this server's adapter roots "
            f"({', '.join(str(r) for r in real_roots)}); put the adapter there or start the "
            "server with --adapter-root FOLDER")
    return resolved


class ApiKeyMiddleware:
    """Pure ASGI middleware (streams pass through untouched): 401 for a ``/v1/`` request
    without the key."""

    def __init__(self, app: Any, api_key: str):
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not str(scope.get("path", "")).startswith(PROTECTED_PREFIX):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        if bearer_matches(authorization, self.api_key):
            await self.app(scope, receive, send)
            return
        body = json.dumps(error_body(
            401, "this server needs its API key: send 'Authorization: Bearer <key>' (the "
                 "openai client's api_key)", "invalid_api_key")).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})
