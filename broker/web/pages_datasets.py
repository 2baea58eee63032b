"""The Datasets pages: the datasets a viewer may read, and one dataset's versions: each one's
parent, files and bytes, who made it (and the run, where a run did), and the tasks that read
it. The same service calls, and so the same authz, as the API's (broker/tasks/datasets.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from broker.errors import KliqueError, NotFound
from broker.tasks.datasets import DatasetService, no_such_dataset
from broker.web.ui import Web


def add_routes(router: APIRouter, web: Web) -> None:
    datasets = DatasetService(web.control)

    @router.get("/datasets")
    def dataset_list(request: Request) -> HTMLResponse:
        who = web.viewer(request)
        rows = [d.model_dump(mode="json") for d in datasets.listing(who.caller)]
        return web.page(request, who, "datasets.html", datasets=rows)

    @router.get("/datasets/{name}")
    def dataset_page(request: Request, name: str) -> HTMLResponse:
        who = web.viewer(request)
        try:
            found = datasets.show(who.caller, name)
        except NotFound as exc:
            return web.error(request, who, 404, str(exc))
        except KliqueError:  # not a dataset name: no dataset has it, the same answer
            return web.error(request, who, 404, str(no_such_dataset(name[:130])))
        return web.page(request, who, "dataset.html", dataset=found.model_dump(mode="json"))
