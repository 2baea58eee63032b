"""Pages and fragments from the Jinja templates (autoescaped), with the UI's security headers."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from fastapi.responses import HTMLResponse
from jinja2 import Environment, PackageLoader, select_autoescape

# Scripts and styles come only from this server: no inline script, no inline style, no eval.
# 'self' is the UI's own origin, which serves no app: routes live on an origin of their own
# (broker/route_proxy/origin.py), so nothing an app serves is a script, style, frame or connection
# this policy admits.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; frame-src 'none'; "
    "worker-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def when(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def duration(seconds: float | None) -> str:
    """3 s, 4 min 10 s, 2 h 05 min, 3 d 4 h: short and exact enough to compare runs."""
    if seconds is None:
        return "-"
    s = int(max(seconds, 0))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def age(ts: float | None) -> str:
    return duration(time.time() - ts) if ts else "-"


def runtime(task: Any) -> str:
    if not task.started_at:
        return "-"
    return duration((task.finished_at or time.time()) - task.started_at)


def number(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


ENV = Environment(
    loader=PackageLoader("broker.web", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
ENV.filters.update(when=when, duration=duration, age=age, runtime=runtime, number=number)


def fragment(template: str, **context: Any) -> str:
    return ENV.get_template(template).render(**context)


def page(template: str, status: int = 200, **context: Any) -> HTMLResponse:
    return HTMLResponse(fragment(template, **context), status_code=status, headers=HEADERS)
