"""The Tuning pages: a viewer's tunings, and one tuning: its best trial, the trials table, the
objective over the trials (uPlot) and the trials' parallel coordinates (SVG drawn here)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from broker.errors import NotFound
from broker.tasks.tuning import TuningService
from broker.web.tuning_view import objective_chart, parallel
from broker.web.ui import Web


def add_routes(router: APIRouter, web: Web) -> None:
    tunings = TuningService(web.control)

    @router.get("/tunings")
    def tuning_list(request: Request) -> HTMLResponse:
        who = web.viewer(request)
        rows = [t.model_dump(mode="json") for t in tunings.listing(who.caller)]
        return web.page(request, who, "tunings.html", tunings=rows)

    @router.get("/tunings/{tuning_id}")
    def tuning_page(request: Request, tuning_id: str) -> HTMLResponse:
        who = web.viewer(request)
        try:
            if not tuning_id.isdigit() or len(tuning_id) > 18:
                raise NotFound(f"no tuning {tuning_id[:40]!r} of yours")
            found = tunings.show(who.caller, int(tuning_id)).model_dump(mode="json")
        except NotFound as exc:
            return web.error(request, who, 404, str(exc))
        settings, trials = found["settings"], found["trial_list"]
        return web.page(
            request,
            who,
            "tuning.html",
            tuning=found,
            charts=objective_chart(trials, settings["direction"]),
            parallel=parallel(settings["params"], trials, settings["objective"]),
        )
