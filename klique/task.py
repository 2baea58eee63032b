"""`klique.Task`: record a run (where it runs, or the Klique job it runs in), its parameters,
scalars and artifacts; send it to a compute resource; read another task's record."""

from __future__ import annotations

import os
import sys

from klique import _environment
from klique._api import Api, KliqueError, job_document
from klique.artifacts import Artifacts, upload

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional

    from klique._local import LocalRun


class Logger:
    """task.log.scalar("loss", 0.3, step=10): a scalar on the task's record."""

    def __init__(self, folder: Optional[str]) -> None:
        self._folder = folder

    def scalar(self, name: str, value: float, step: Optional[int] = None) -> None:
        from inside_job import report  # on its path only: every task imports klique

        if not isinstance(name, str) or not name:
            raise ValueError("scalar name must be a non-empty string")
        if self._folder is not None:
            report.append(self._folder, name, value, step)


class Task:
    """One tracked run. Use Task.init() in the script, Task.get(ID) to read another."""

    _current: Optional[Task] = None

    def __init__(self, api: Api, task_id: int, record: Optional[Dict[str, Any]] = None) -> None:
        self.id = int(task_id)
        self._api = api
        self._record = record
        self.local: Optional[LocalRun] = None  # set for a run outside any pool
        self._job: Optional[Dict[str, Any]] = None  # task.json, inside a Klique job
        self._origin: Dict[str, Any] = {}  # what execute_remotely sends: command, code
        self.log = Logger(None)

    def __repr__(self) -> str:
        return f"<klique.Task {self.id}>"

    @classmethod
    def init(cls, project: str = "default", name: str = "", api: Optional[Api] = None) -> Task:
        """The task of this run: inside a Klique job, the job's own task; elsewhere a new task
        that runs locally, with the code, packages, console, scalars and artifacts."""
        if cls._current is not None:
            return cls._current
        doc = job_document()
        task = cls._attach(doc) if doc is not None else cls._record_local(project, name, api)
        cls._current = task
        return task

    @classmethod
    def current(cls) -> Optional[Task]:
        return cls._current

    @classmethod
    def get(cls, task_id: int, api: Optional[Api] = None) -> Task:
        """Another task (yours), to read its record and artifacts."""
        api = api or Api.here()
        return cls(api, task_id, api.get(f"/sdk/tasks/{int(task_id)}"))

    @classmethod
    def _attach(cls, doc: Dict[str, Any]) -> Task:
        report = doc.get("report")
        api = Api.for_job(doc) if isinstance(report, dict) else Api("", "")
        task = cls(api, int(doc["id"]))
        task._job = doc
        job_dir = os.environ.get("KLIQUE_JOB_DIR")
        task.log = Logger(job_dir)
        if job_dir:
            _say_why_it_fails(job_dir)
        return task

    @classmethod
    def _record_local(cls, project: str, name: str, api: Optional[Api]) -> Task:
        from klique._local import LocalRun  # on its path only: every task imports klique

        api = api or Api()
        origin = _environment.origin()
        body = {
            "name": name or origin["name"],
            "project": project,
            "command": origin["command"] or ["python3"],
            "code": origin["code"],
            "packages": _environment.installed_packages(),
        }
        out = api.post("/sdk/tasks", body)
        task = cls(api, out["id"], out)
        task._origin = origin
        task.local = LocalRun(api.url, out["report_token"], task.id, task._end)
        task.log = Logger(task.local.folder)
        print(f"klique: task {task.id} records this run (`klique show {task.id}`)")
        return task

    # The record

    @property
    def record(self) -> Dict[str, Any]:
        """The task as the API shows it (fetched again on every read)."""
        self._record = self._api.get(f"/sdk/tasks/{self.id}")
        return self._record

    @property
    def state(self) -> str:
        return str(self.record["state"])

    @property
    def parameters(self) -> Dict[str, Any]:
        if self._job is not None and not self._api.url:
            return dict(self._job.get("parameters") or {})
        return dict(self.record.get("parameters") or {})

    @property
    def artifacts(self) -> Artifacts:
        return Artifacts(self._api, self.id)

    @property
    def running_locally(self) -> bool:
        return self.local is not None

    def connect(self, parameters: Dict[str, Any]) -> Dict[str, Any]:
        """Record these parameters. In a Klique job, the values stored on the task (edited with
        `klique submit --clone ID --param K=V`) replace the script's defaults, in place."""
        if not isinstance(parameters, dict) or not all(isinstance(k, str) for k in parameters):
            raise TypeError("connect() takes a dict with string keys")
        if self._job is not None and not self._api.url:
            stored = dict(self._job.get("parameters") or {})
        else:
            body = {"values": parameters, "overwrite": self._job is None}
            stored = self._api.post(f"/sdk/tasks/{self.id}/parameters", body)["parameters"]
        if self._job is not None:
            for key in list(parameters):
                if key in stored:
                    parameters[key] = _like(parameters[key], stored[key])
        return parameters

    def upload_artifact(self, name: str, artifact: Any) -> Dict[str, Any]:
        """A file (a path to one) or any picklable object, kept under `name` on the task."""
        return upload(self._api, self.id, name, artifact)

    # Where it runs

    def execute_remotely(
        self,
        resource: Optional[str] = None,
        exit_process: bool = True,
        requirements: Optional[List[str]] = None,
        image: Optional[str] = None,
    ) -> Optional[Task]:
        """Queue this same task (code, diff, packages, parameters) on a compute resource and stop
        the local run (or return, with exit_process=False). Inside a Klique job: nothing."""
        if self.local is None:
            return None
        if not self._origin.get("command"):
            raise KliqueError(
                "this run has no script to send (an interactive session?); save it as a file "
                "and run it with python3, or use `klique submit`"
            )
        if requirements is None:
            requirements = _environment.requirements_to_send()
        body = {
            "resource": resource,
            "command": self._origin["command"],
            "code": self._origin["code"],
            "requirements": list(requirements),
            "image": image,
        }
        self.local.stop()
        self.local = None
        Task._current = None
        moved = self._api.post(f"/sdk/tasks/{self.id}/remote", body)
        print(
            f"klique: task {self.id} queued on {moved['resource']}; follow it with "
            f"`klique logs -f {self.id}`",
            flush=True,
        )
        if exit_process:
            sys.exit(0)
        return self

    def close(self) -> None:
        """End a local run now (completed); otherwise it ends when the process exits."""
        if self.local is not None:
            self.local.finish()
            self.local = None
            Task._current = None

    def fail(self, reason: str) -> None:
        """End a local run now as failed, with the reason."""
        if self.local is not None:
            self.local.stop()
            self.local = None
            Task._current = None
            self._end("failed", reason)

    def _end(self, outcome: str, reason: str) -> None:
        body = {"outcome": outcome, "exit_code": 0 if outcome == "completed" else 1}
        body["reason"] = reason.replace("\n", " ")[:2000]
        try:
            self._api.post(f"/sdk/tasks/{self.id}/end", body)
        except KliqueError as exc:
            sys.stderr.write(f"klique: could not record the end of task {self.id}: {exc}\n")


def _say_why_it_fails(job_dir: str) -> None:
    """An exception that ends the script becomes the task's reason (the runner reads it)."""
    previous = sys.excepthook

    def hook(kind: Any, value: Any, trace: Any) -> None:
        try:
            with open(os.path.join(job_dir, "reason.txt"), "w", encoding="utf-8") as f:
                f.write(f"{kind.__name__}: {value}"[:500])
        except OSError:
            pass
        previous(kind, value, trace)

    sys.excepthook = hook


def _like(default: Any, stored: Any) -> Any:
    """A stored value in the type of the script's default (`--param lr=0.01` is a number)."""
    if default is None or stored is None or isinstance(default, (dict, list)):
        return stored
    kind = type(default)
    try:
        if kind is bool and isinstance(stored, str):
            return stored.strip().lower() in ("1", "true", "yes", "on")
        return kind(stored)
    except (TypeError, ValueError):
        return stored
