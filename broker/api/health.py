"""/healthz and /readyz, on every replica, unauthenticated, for load balancers and operators:
the process answers; the store answers and the scheduler's lease as this replica sees it
(broker/control/lease.py). Nothing secret: replica ids, a term, seconds; never the store's
address, a token, or an error's text. And any request that meets a store that does not
answer (a replica cut from the database) is answered 503 in one sentence, not 500 and a
traceback: the caller, or a load balancer, tries again, perhaps at another replica."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError

from broker.control.lease import readiness
from broker.control.loop import ControlLoop

READY_WAIT_S = 2.0  # a store that takes longer than this to answer is not ready
STORE_SILENT = "the store does not answer now; try again in a few seconds"

log = logging.getLogger("klique.server")


def install_store_unavailable(app: FastAPI) -> None:
    """A request that meets an unreachable store: 503 and one sentence (its cause logged in
    one line here, never shown: it names the database's host)."""

    async def store_silent(request: Request, exc: OperationalError) -> JSONResponse:
        log.warning(
            "%s %s: the store did not answer: %s", request.method, request.url.path, exc.orig
        )
        return JSONResponse({"detail": STORE_SILENT}, status_code=503)

    app.add_exception_handler(OperationalError, store_silent)  # type: ignore[arg-type]


def health_router(control: ControlLoop) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get("/healthz")
    def healthz() -> dict[str, Any]:
        """The process answers (restart it if not)."""
        return {"ok": True}

    @router.get("/readyz")
    async def readyz() -> JSONResponse:
        """Ready to serve: the store answers (503 if not); with the lease's state."""
        leading = control.leads()  # the role when asked, however long the store then takes
        try:
            ready = await asyncio.wait_for(
                asyncio.to_thread(control.readiness), timeout=READY_WAIT_S
            )
        except TimeoutError:
            leadership = control.leadership
            replica = leadership.replica if leadership is not None else None
            ready = readiness(None, replica, leading)
        ready["role"] = "leader" if leading else "follower"
        return JSONResponse(ready, status_code=200 if ready["ready"] else 503)

    return router
