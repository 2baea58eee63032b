"""The cookies a browser session travels in, one contract for the whole server (docs/identity.md):
the session's cookie, the header its CSRF token comes back in, the sign-in form's own cookie, and
how a new session's cookie is set and an ended one's cleared."""

from __future__ import annotations

from starlette.responses import Response

SESSION_COOKIE = "klique_session"
CSRF_COOKIE = "klique_csrf"  # of old: cleared wherever a session's cookie is set or cleared
CSRF_HEADER = "X-Klique-CSRF"
SIGNIN_COOKIE = "klique_signin"  # the sign-in form's double-submit token (broker/web/session.py)


def set_session_cookies(response: Response, cookie: str, secure: bool) -> None:
    """A new session's cookie: its id, never readable by a page. The CSRF token is no cookie
    (a script could read one, and routes once shared this host): the UI's pages carry it, and
    the browser's `klique_csrf` of old is cleared."""
    response.set_cookie(
        SESSION_COOKIE, cookie, path="/", httponly=True, samesite="lax", secure=secure
    )
    response.delete_cookie(CSRF_COOKIE, path="/")


def clear_session_cookies(response: Response) -> None:
    response.delete_cookie(SESSION_COOKIE, path="/")
    response.delete_cookie(CSRF_COOKIE, path="/")
