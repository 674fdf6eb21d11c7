"""The web page at ``/``: plain HTML, CSS and JavaScript from ``serve/static/``, no build step.

The page talks to the server's own endpoints (``/v1/kernels/optimize``, the job's SSE events,
``/v1/ab/status``). Only the files named in ``STATIC_FILES`` are served (an allowlist, no path
from the request reaches the file system), and a Content-Security-Policy allows scripts from
this server only: the page shows model output through ``textContent``, and the policy keeps an
injected inline script from running even if that ever slipped.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException, Response

STATIC_DIR = Path(__file__).resolve().parent / "static"
STATIC_FILES = {
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
CONTENT_SECURITY_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self'; "
                           "img-src 'self' data:; connect-src 'self'; object-src 'none'; "
                           "base-uri 'none'; frame-ancestors 'none'")
_HEADERS = {"Content-Security-Policy": CONTENT_SECURITY_POLICY,
            "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}


def web_router() -> APIRouter:
    router = APIRouter(tags=["web"])

    @router.get("/", include_in_schema=False)
    def page() -> Response:
        return Response((STATIC_DIR / "index.html").read_bytes(),
                        media_type="text/html; charset=utf-8", headers=_HEADERS)

    @router.get("/static/{name}", include_in_schema=False)
    def static(name: str) -> Response:
        if name not in STATIC_FILES:
            raise HTTPException(404, f"no static file {name!r}")
        return Response((STATIC_DIR / name).read_bytes(), media_type=STATIC_FILES[name],
                        headers=_HEADERS)

    return router
