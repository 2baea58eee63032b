"""The web UI's error pages: a wrong address, a refusal or a fault in a page answers a page in
the site's layout (its navigation, what went wrong, a way back), never the API's JSON.

Only a browser's request for a page gets one: the API (/api/), the routes, the MCP endpoint and
the static files keep their own answers, so `klique` and scripts read JSON as before.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import HTMLResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from broker.errors import KliqueError
from broker.http.errors import error_answer, status_of
from broker.web.render import page

log = logging.getLogger(__name__)

NOT_PAGES = ("/api/", "/routes/", "/mcp", "/static/", "/agent/")

# What the page's heading says for each status; the message below it says what and how to fix.
TITLES = {
    400: "That request is not right",
    403: "Not for you",
    404: "No such page",
    405: "Not done that way",
    409: "Not now",
    413: "Too large",
    500: "Something went wrong here",
}

FAULT = (
    "the server failed while answering this page; it is not something you did; "
    "the server's log has the details: tell the platform team the time ({when} UTC)"
)


def wants_page(request: Request) -> bool:
    """A browser asking for a page (it accepts HTML), not a program asking the API."""
    path = request.url.path
    if path.startswith(NOT_PAGES):
        return False
    return "text/html" in request.headers.get("accept", "")


def error_title(status: int) -> str:
    return TITLES.get(status, "That did not work")


def not_found_message(path: str) -> str:
    shown = path if len(path) <= 80 else path[:77] + "..."  # a long address is someone's text
    return f"there is no page at {shown}; the pages are in the menu above"


def error_page(request: Request, status: int, message: str) -> HTMLResponse:
    """The error page, as the signed-in viewer sees the site (anonymous: the menu alone)."""
    web = request.app.state.web  # broker.web.ui.Web, set by install_error_pages
    try:
        who: Any = web.signed_in(request)
    except StarletteHTTPException:
        who = None
    return page(
        "error.html",
        status,
        who=who,
        csrf=getattr(who, "csrf", ""),
        features=web.features(request),
        path=request.url.path,
        code=status,
        title=error_title(status),
        message=message,
    )


def install_error_pages(app: FastAPI, web: Any) -> None:
    """Answer the UI's errors with pages; the API's handlers answer everything else."""
    app.state.web = web

    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code < 400 or exc.status_code == 401 or not wants_page(request):
            return await http_exception_handler(request, exc)
        detail = str(exc.detail)
        if exc.status_code == 404 and detail in ("Not Found", ""):
            detail = not_found_message(request.url.path)
        return error_page(request, exc.status_code, detail)

    async def klique_error(request: Request, exc: KliqueError) -> Response:
        if not wants_page(request):
            return error_answer(exc)  # the API's JSON, as every adapter answers it
        return error_page(request, status_of(exc), str(exc))

    async def fault(request: Request, exc: Exception) -> Response:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
        log.error("the page %s failed at %s UTC", request.url.path, when, exc_info=exc)
        if not wants_page(request):
            return PlainTextResponse("Internal Server Error", status_code=500)
        return error_page(request, 500, FAULT.format(when=when))

    app.add_exception_handler(StarletteHTTPException, http_error)  # type: ignore[arg-type]
    app.add_exception_handler(KliqueError, klique_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, fault)
