"""The model registry's operations, one place for the REST API, the web UI, MCP and app
launches: register a version made by a run, list and show models, pick a version by number or
stage, change a stage, read a version's files, and resolve an app's `registry:NAME@REF`
parameters at launch. Each asks broker/authz.py and raises Klique's own errors."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from broker import authz
from broker.apps.launch import APPLICATION, COUNTED
from broker.domain import Task, TaskSpec
from broker.errors import KliqueError, NotFound, NotPermitted
from broker.identity.resolve import Caller
from broker.models.rules import (
    check_file_path,
    check_name,
    check_stage,
    parse_ref,
    pick,
    refs_in,
    stage_moves,
)
from broker.store.models import ModelStore
from broker.tasks.control import TaskControl
from broker.tasks.model_schemas import (
    ModelDetailOut,
    ModelIn,
    ModelOut,
    ServingOut,
    VersionOut,
)
from broker.tasks.records import find


def no_such_model(name: str) -> NotFound:
    """The one answer for a model that does not exist and one the caller may not see."""
    return NotFound(f"no model {name!r} that you may read; `klique model ls` lists them")


def last_scalars(scalars: list[dict[str, Any]]) -> dict[str, float]:
    """Each scalar's last reported value (`name/series` for a chart's other lines)."""
    last: dict[str, float] = {}
    for s in scalars:
        series = s.get("series") or ""
        last[f"{s['name']}/{series}" if series else s["name"]] = float(s["value"])
    return last


def keeper(model: dict[str, Any]) -> str:
    return f"team {model['team']}" if model["team"] else str(model["owner"])


class ModelService:
    """The registry over one control loop (its store, its estate)."""

    def __init__(self, control: TaskControl) -> None:
        self.control = control
        self.store = ModelStore(control.store)

    # Registering

    def register(self, actor: Caller, body: ModelIn) -> VersionOut:
        """A new version of `body.name`, made by run `body.task` (the caller's, or the report
        token's own task), its files the run's artifacts named in `body.files`."""
        authz.check_scope(actor, "submit")
        name = check_name(body.name)
        task = find(self.control, body.task, actor, authz.acts_on)
        if body.kind == "file" and len(body.files) != 1:
            raise KliqueError("a model of kind file has exactly one file; use kind folder")
        version = {
            "task_id": task.id,
            "kind": body.kind,
            "framework": body.framework,
            "files": [self._file(task, f.path, f.artifact) for f in body.files],
            "metadata": body.metadata,
            "tags": body.tags,
            "metrics": last_scalars(self.control.store.scalars(task.id)),
        }
        owner = {"name": name, "owner": task.owner, "team": task.team, "project": task.spec.project}

        def same_keeper(model: dict[str, Any]) -> bool:
            return model["team"] == task.team and (
                task.team is not None or model["owner"] == task.owner
            )

        made = self.store.register(owner, version, same_keeper)
        if made is None:
            found = self.store.model(name) or owner
            raise NotPermitted(
                f"model name {name!r} is kept by {keeper(found)}; fix: register under another "
                "name (a run adds versions only to its own team's models)"
            )
        return VersionOut(**made)

    def _file(self, task: Task, path: str, artifact: str) -> dict[str, Any]:
        check_file_path(path)
        found = self.control.store.artifact(task.id, artifact)
        if found is None:
            raise NotFound(
                f"task {task.id} has no artifact {artifact!r} to register as {path}; upload it "
                "first (the SDK's register_model does)"
            )
        return {"path": path, "digest": found["digest"], "size": found["size"]}

    # Reading

    def listing(self, who: Caller) -> list[ModelOut]:
        """The models the caller sees, by name."""
        seen = [m for m in self.store.models() if self._sees(who, m)]
        return [self._model_out(m, self.store.versions(m["name"])) for m in seen]

    def show(self, who: Caller, name: str) -> ModelDetailOut:
        """A model with its versions, and the apps that serve them (not yet ended)."""
        model = self._visible(who, name)
        versions = self.store.versions(name)
        return ModelDetailOut(
            **self._model_out(model, versions).model_dump(),
            versions=[VersionOut(**v) for v in versions],
            serving=self.serving(name),
        )

    def version(self, actor: Caller, name: str, ref: str) -> VersionOut:
        """The version `ref` names (a number, production, staging, latest)."""
        return VersionOut(**self._readable(actor, name, ref))

    def file(self, actor: Caller, name: str, version: int, index: int) -> dict[str, Any]:
        """A version's file `index` (path, digest, size), if the caller may read it."""
        found = self._readable(actor, name, str(version))
        files = found["files"]
        if not 0 <= index < len(files):
            raise NotFound(f"model {name} version {version} has {len(files)} files")
        return dict(files[index])

    def serving(self, name: str) -> list[ServingOut]:
        """The apps not yet ended that serve a version of `name` (their launch resolved it)."""
        tasks = self.control.store.tasks(states=COUNTED, with_diff=False)
        out = []
        for task in tasks:
            app = task.spec.app or {}
            if task.spec.kind != APPLICATION:
                continue
            for staged in app.get("models") or ():
                if staged.get("name") == name:
                    out.append(
                        ServingOut(
                            id=task.id,
                            app=str(app.get("name")),
                            state=task.state.value,
                            route=str(app.get("route")),
                            version=int(staged["version"]),
                            ref=str(staged["ref"]),
                        )
                    )
        return out

    # Stages

    def set_stage(self, who: Caller, name: str, version: int, stage: str) -> VersionOut:
        """Move a version to `stage`; to production, the one there before is archived."""
        check_stage(stage)
        model = self._visible(who, name)
        if not authz.may_stage_model(who, model["owner"], model["team"]):
            raise no_such_model(name)
        authz.check_scope(who, "submit")
        if not any(v["version"] == version for v in self.store.versions(name)):
            raise NotFound(f"model {name} has no version {version}; `klique model show {name}`")
        after = self.store.set_stages(name, lambda now: stage_moves(now, version, stage), who.user)
        return VersionOut(**next(v for v in after if v["version"] == version))

    # Launches

    def with_models(self, who: Caller, spec: TaskSpec) -> TaskSpec:
        """An app task's spec with the versions its `registry:` parameters name, resolved
        now (the app's record shows which it serves; its runner stages exactly those)."""
        app = spec.app or {}
        refs = refs_in(app.get("params") or {})
        if not refs:
            return spec
        staged = []
        for text in refs:
            name, ref = parse_ref(text)
            found = self._readable(who, name, ref)
            files = [dict(f) for f in found["files"]]
            staged.append(
                {
                    "ref": text,
                    "name": name,
                    "version": found["version"],
                    "kind": found["kind"],
                    "files": files,
                }
            )
        return replace(spec, app={**app, "models": staged})

    # The rules, applied

    def _sees(self, who: Caller, model: dict[str, Any]) -> bool:
        return authz.sees_model(who, model["owner"], model["team"])

    def _visible(self, who: Caller, name: str) -> dict[str, Any]:
        model = self.store.model(name)
        if model is None or not self._sees(who, model):
            raise no_such_model(name)
        return model

    def _readable(self, actor: Caller, name: str, ref: str) -> dict[str, Any]:
        """The version `ref` picks, for a user who sees the model, or for a report token whose
        task made that version or whose launch resolved it."""
        model = self.store.model(name)
        if model is None:
            raise no_such_model(name)
        speaking = authz.speaks_for_task(actor)
        if speaking is None and not self._sees(actor, model):
            raise no_such_model(name)
        found = pick(self.store.versions(name), ref)
        if speaking is not None and (
            found is None
            or not authz.report_token_reads_model(
                self.control.store.get(speaking), name, int(found["version"]), found["task_id"]
            )
        ):
            raise no_such_model(name)
        if found is None:
            raise NotFound(f"model {name} has no {ref} version; `klique model show {name}`")
        return dict(found)

    def _model_out(self, model: dict[str, Any], versions: list[dict[str, Any]]) -> ModelOut:
        production = pick(versions, "production")
        return ModelOut(**model, production=production["version"] if production else None)
