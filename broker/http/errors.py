"""The HTTP status of each kind of Klique error, in one table that every adapter answers by
(broker/errors.py draws the kinds; what a kind means over HTTP is decided here, once)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from broker.errors import Conflict, KliqueError, NotFound, NotPermitted, TooLarge

# A kind not named here answers as its nearest named ancestor does (KliqueError: 400).
STATUS: dict[type[Exception], int] = {
    NotFound: 404,
    NotPermitted: 403,
    Conflict: 409,
    TooLarge: 413,
    KliqueError: 400,
}


def status_of(exc: KliqueError) -> int:
    """The HTTP status that answers `exc`: its kind's, else its nearest ancestor's."""
    return next(STATUS[kind] for kind in type(exc).__mro__ if kind in STATUS)


def error_answer(exc: KliqueError) -> JSONResponse:
    """`{"detail": sentence}` with the error's status: what every program reading JSON gets."""
    return JSONResponse({"detail": str(exc)}, status_code=status_of(exc))


def install_error_statuses(app: FastAPI) -> None:
    """Answer every Klique error a handler lets through with its status and its sentence."""

    async def klique_error(_request: Request, exc: KliqueError) -> JSONResponse:
        return error_answer(exc)

    app.add_exception_handler(KliqueError, klique_error)  # type: ignore[arg-type]
