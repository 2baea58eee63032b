"""The Models pages: the registry's models a viewer may read, and one model's lineage: the run
that made each version, the version's stage and metrics, and the apps serving it; its team
promotes a version from the page."""

from __future__ import annotations

import asyncio
import re
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from broker.errors import KliqueError, NotFound
from broker.models.rules import MODEL_NAME, STAGES
from broker.tasks.models import ModelService
from broker.web.render import HEADERS
from broker.web.ui import Web


def add_routes(router: APIRouter, web: Web) -> None:
    models = ModelService(web.control)

    @router.get("/models")
    def model_list(request: Request) -> HTMLResponse:
        who = web.viewer(request)
        rows = [m.model_dump(mode="json") for m in models.listing(who.caller)]
        return web.page(request, who, "models.html", models=rows)

    @router.get("/models/{name}")
    def model_page(request: Request, name: str) -> HTMLResponse:
        who = web.viewer(request)
        try:
            found = models.show(who.caller, name if re.fullmatch(MODEL_NAME, name) else "-")
        except NotFound as exc:
            return web.error(request, who, 404, str(exc))
        return web.page(
            request,
            who,
            "model.html",
            model=found.model_dump(mode="json"),
            stages=STAGES,
            error=request.query_params.get("error", ""),
        )

    @router.post("/models/{name}/versions/{version}/stage")
    async def model_stage(request: Request, name: str, version: str) -> Response:
        who, form = await web.posted(request)
        if not re.fullmatch(MODEL_NAME, name) or not version.isdigit() or len(version) > 9:
            return web.error(request, who, 404, f"no model {name[:130]!r} that you may read")
        try:
            await asyncio.to_thread(
                models.set_stage, who.caller, name, int(version), str(form.get("stage") or "")
            )
        except KliqueError as exc:
            return _back(name, str(exc))
        return _back(name)


def _back(name: str, error: str = "") -> Response:
    """Back to the model's page; a refusal's sentence shown there as the API says it."""
    where = f"/models/{quote(name)}"
    if error:
        where += f"?error={quote(error[:2000])}"
    return RedirectResponse(where, 303, headers=HEADERS)
