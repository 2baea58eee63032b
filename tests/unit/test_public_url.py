"""The one URL that jobs, pods, agents and browsers use (server.public_url, --public-url),
apart from the address the server binds: refused at start when it reaches nothing from other
nodes, carried in every pool kind's job folder, and read from there by the SDK in a job."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers import estates
from helpers.estates import profile

from broker.domain import Estate
from broker.preview import sample_task
from broker.server import build_app, public_url, serve
from broker.store.repository import Store

USER_MAP = {"job_root": "/jobs", "user_map": {"alice": "alice"}}
POOLS: dict[str, dict[str, Any]] = {
    "slurm": {"kind": "slurm", **USER_MAP},
    "pbs": {"kind": "pbs", **USER_MAP},
    "lsf": {"kind": "lsf", **USER_MAP},
    "kube": {
        "kind": "kubernetes",
        "namespace": "klique",
        "server": "http://127.0.0.1:1",
        "installation": "t",
    },
    "here": {"kind": "host", "slots": 1, **USER_MAP},
}
PUBLIC = "http://klique.example.org:8765"


def estate(*pools: str, server: dict[str, str] | None = None) -> Estate:
    """One compute resource `r` on these pools of POOLS, in order."""
    return estates.estate(
        "<estate>",
        server=server,
        resources={"r": profile(*pools, cpus=1, walltime="5m")},
        pools={name: POOLS[name] for name in pools},
    )


@pytest.mark.parametrize("pool", ["slurm", "pbs", "lsf", "kube"])
@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0", "::"])
def test_a_bind_address_that_reaches_nothing_is_refused_while_nodes_are_elsewhere(
    pool: str, host: str
) -> None:
    with pytest.raises(ValueError, match=r"jobs of pool .* set server\.public_url"):
        public_url(estate("here", pool), host, 8765)


def test_a_stated_public_url_is_used_and_an_unspecified_one_is_refused() -> None:
    assert public_url(estate("slurm"), "0.0.0.0", 8765, PUBLIC + "/") == PUBLIC
    stated = estate("slurm", server={"public_url": PUBLIC})
    assert public_url(stated, "0.0.0.0", 8765) == PUBLIC
    with pytest.raises(ValueError, match="public_url"):
        public_url(estate("slurm"), "127.0.0.1", 8765, "http://0.0.0.0:8765")


def test_a_server_whose_pools_are_all_here_keeps_its_bind_address() -> None:
    assert public_url(estate("here"), "127.0.0.1", 8765) == "http://127.0.0.1:8765"
    assert public_url(estate("here"), "::1", 8765) == "http://[::1]:8765"


def test_the_server_refuses_to_start_with_one_sentence_naming_the_setting(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as stop:
        serve(estate("slurm"), tmp_path, f"sqlite:///{tmp_path / 'k.db'}", "0.0.0.0", 1)
    message = str(stop.value.code)
    assert message.startswith("klique: jobs of pool slurm run on other nodes")
    assert "server.public_url" in message and "--public-url" in message
    assert not (tmp_path / "k.db").exists()  # refused before anything was made


def test_every_pool_kind_tells_its_jobs_the_public_url_not_the_bind_address(
    tmp_path: Path,
) -> None:
    e = estate("slurm", "pbs", "lsf", "kube", "here")
    store = Store.open(f"sqlite:///{tmp_path / 'k.db'}")
    try:
        app = build_app(e, store, tmp_path, public_url(e, "0.0.0.0", 8765, PUBLIC))
        drivers = app.state.control.drivers
        task = replace(sample_task(e, "r", "alice"), id=7)
        urls = {n: d.task_document(task, "tok")["report"]["url"] for n, d in drivers.items()}
    finally:
        store.close()
    assert urls == dict.fromkeys(["slurm", "pbs", "lsf", "kube", "here"], PUBLIC)


def test_a_kubernetes_report_url_still_overrides_the_public_url(tmp_path: Path) -> None:
    POOLS["kube2"] = {**POOLS["kube"], "report_url": "http://klique.svc:8765"}
    try:
        e = estate("kube2")
    finally:
        del POOLS["kube2"]
    store = Store.open(f"sqlite:///{tmp_path / 'k.db'}")
    try:
        app = build_app(e, store, tmp_path, public_url(e, "0.0.0.0", 8765, PUBLIC))
        task = replace(sample_task(e, "r", "alice"), id=7)
        document = app.state.control.drivers["kube2"].task_document(task, "tok")
    finally:
        store.close()
    assert document["report"]["url"] == "http://klique.svc:8765"


def test_the_sdk_in_a_job_uses_its_folders_url_whatever_klique_api_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from klique._api import Api

    (tmp_path / "task.json").write_text(
        json.dumps({"id": 7, "report": {"url": PUBLIC, "token": "job-token"}})
    )
    monkeypatch.setenv("KLIQUE_JOB_DIR", str(tmp_path))
    monkeypatch.setenv("KLIQUE_API", "http://127.0.0.1:8765")
    monkeypatch.setenv("KLIQUE_TOKEN", "login-token")
    api = Api.here()
    assert (api.url, api.token) == (PUBLIC, "job-token")
    monkeypatch.delenv("KLIQUE_JOB_DIR")
    assert Api.here().url == os.environ["KLIQUE_API"]  # outside a job, as before


def test_a_sweep_started_in_a_job_goes_to_the_folders_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import klique._api
    from klique.sweep import sweep

    (tmp_path / "task.json").write_text(json.dumps({"id": 7, "report": {"url": PUBLIC}}))
    monkeypatch.setenv("KLIQUE_JOB_DIR", str(tmp_path))
    monkeypatch.setenv("KLIQUE_API", "http://127.0.0.1:8765")
    called: list[str] = []

    def post(self: klique._api.Api, path: str, body: object = None) -> object:
        called.append(self.url)
        return {"sweep": 1, "tasks": [{"id": 8}]}

    monkeypatch.setattr(klique._api.Api, "post", post)
    sweep([{"command": ["true"]}], "r")
    assert called == [PUBLIC]
