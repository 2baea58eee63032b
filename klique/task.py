"""`klique.Task`: record a run (where it runs, or the Klique job it runs in), its parameters,
scalars and artifacts; send it to a compute resource; read another task's record."""

from __future__ import annotations

import atexit
import os
import re
import sys

from klique import _autocapture, _connect, _environment
from klique._api import Api, KliqueError, job_document
from klique._watch import Watcher
from klique.artifacts import Artifacts, upload
from klique.logger import Logger
from klique.models import Model, register

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Union

    from klique._local import LocalRun


class Task:
    """One tracked run. Use Task.init() in the script, Task.get(ID) to read another."""

    _current: Optional[Task] = None
    _added_requirements: List[str] = []  # Task.add_requirements, sent by execute_remotely

    def __init__(self, api: Api, task_id: int, record: Optional[Dict[str, Any]] = None) -> None:
        self.id = int(task_id)
        self._api = api
        self._record = record
        self.local: Optional[LocalRun] = None  # set for a run outside any pool
        self._job: Optional[Dict[str, Any]] = None  # task.json, inside a Klique job
        self._origin: Dict[str, Any] = {}  # what execute_remotely sends: command, code
        self.log = Logger(None)
        self.tags: List[str] = []
        self.task_type: Optional[str] = None
        self._watcher: Optional[Watcher] = None  # resources and TensorBoard, on a thread
        self._image: Optional[str] = None  # set_base_docker: the image execute_remotely sends

    def __repr__(self) -> str:
        return f"<klique.Task {self.id}>"

    @classmethod
    def init(
        cls,
        project: str = "default",
        name: str = "",
        api: Optional[Api] = None,
        project_name: Optional[str] = None,
        task_name: Optional[str] = None,
        tags: Optional[List[str]] = None,
        task_type: Optional[str] = None,
        auto_connect_arg_parser: bool = True,
        auto_connect_frameworks: Union[bool, Dict[str, bool]] = True,
        auto_resource_monitoring: bool = True,
    ) -> Task:
        """The task of this run: inside a Klique job, the job's own task; elsewhere a new task
        that runs locally, with the code, packages, console, scalars and artifacts.
        project_name= and task_name= are ClearML's names for project= and name=; tags are
        the task's (`klique ls --tag`); task_type is kept on this object only.

        It captures by itself, each part switchable off here or by its environment variable
        (klique/_autocapture.py): argparse's arguments as the parameters `Args/...`
        (auto_connect_arg_parser), matplotlib figures and TensorBoard event files
        (auto_connect_frameworks: False, or {"matplotlib": False}), the process tree's CPU,
        memory and GPUs under `:monitor:` (auto_resource_monitoring), and, for a local run,
        the installed packages and the git state."""
        if cls._current is not None:
            return cls._current
        project, name = project_name or project, task_name or name
        parts = _autocapture.switches(
            auto_connect_arg_parser, auto_connect_frameworks, auto_resource_monitoring
        )
        doc = job_document()
        task = cls._attach(doc) if doc else cls._record_local(project, name, api, parts, tags or [])
        task.task_type = task_type
        if tags and doc:  # a local run's record was made with them
            task.add_tags(tags)
        task.tags = sorted(set(tags or []))
        cls._current = task
        task._start_capture(parts)
        return task

    def _start_capture(self, parts: Dict[str, bool]) -> None:
        """Hook argparse and matplotlib, and start the thread that samples the resources and
        reads TensorBoard's event files; a run that keeps no reports captures nothing."""
        folder = self.log.folder
        if folder is None:
            return
        if parts["argparse"]:
            _autocapture.connect_arg_parser(self._connect_arguments)
        if parts["matplotlib"]:
            _autocapture.report_matplotlib(self.log)
        if parts["monitor"] or parts["tensorboard"]:
            folders = [os.getcwd(), os.environ.get("KLIQUE_JOB_DIR", "")]
            self._watcher = Watcher(self.log, parts["monitor"], parts["tensorboard"], folders)
            self.log._flushers.append(self._watcher.flush)
            # Registered after the local run's own exit handler, so it runs before it: the
            # last events are in the folder before the reporter sends the rest.
            atexit.register(self._watcher.close)

    def _connect_arguments(self, namespace: Any, name: str) -> None:
        """What a parser returned, connected while this is the run's task."""
        if Task._current is self:
            self.connect(namespace, name)

    def _stop_capture(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None

    def add_tags(self, tags: List[str]) -> None:
        """Tag this task (`klique tag ID TAG...` does the same)."""
        out = self._api.post(f"/tasks/{self.id}/tags", {"add": list(tags)})
        self.tags = list(out["tags"])

    @classmethod
    def current(cls) -> Optional[Task]:
        return cls._current

    @classmethod
    def current_task(cls) -> Optional[Task]:
        """ClearML's name for Task.current()."""
        return cls._current

    def get_logger(self) -> Logger:
        """What this run reports (task.log), with ClearML's method names: report_scalar,
        report_table, report_image... (klique/logger.py)."""
        return self.log

    @classmethod
    def get(cls, task_id: int, api: Optional[Api] = None) -> Task:
        """Another task (yours), to read its record and artifacts. Inside a pipeline step, a
        task whose artifacts the step was given (`${STEP.id}`): its artifacts only."""
        api = api or Api.here()
        try:
            return cls(api, task_id, api.get(f"/sdk/tasks/{int(task_id)}"))
        except KliqueError:
            if job_document() is None:
                raise
            found = cls(api, task_id)  # a job's token reads an input's artifacts, no record
            found.artifacts.keys()  # still refused: the same error as the record's
            return found

    @classmethod
    def get_task(
        cls,
        task_id: Optional[int] = None,
        project_name: Optional[str] = None,
        task_name: Optional[str] = None,
        api: Optional[Api] = None,
    ) -> Task:
        """ClearML's Task.get_task: by id, or the newest task with this name (in this project):
        yours, else your team's."""
        if task_id is not None:
            return cls.get(task_id, api)
        if not task_name:
            raise KliqueError("Task.get_task() needs task_id=, or task_name= (and project_name=)")
        api = api or Api.here()
        for team in (None, True):
            try:
                listed = api.get("/tasks", project=project_name, limit=1000, team=team)
            except KliqueError:
                if team:  # in no team: there is no team's list to look in
                    break
                raise
            for item in listed:
                if item.get("name") == task_name:
                    return cls.get(int(item["id"]), api)
        where = f" in project {project_name!r}" if project_name else ""
        raise KliqueError(
            f"no task of yours or your team's named {task_name!r}{where}; `klique ls --team` "
            "lists them"
        )

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
    def _record_local(
        cls,
        project: str,
        name: str,
        api: Optional[Api],
        parts: Dict[str, bool],
        tags: List[str],
    ) -> Task:
        from klique._local import LocalRun  # on its path only: every task imports klique

        api = api or Api()
        origin = _environment.origin()
        body = {
            "name": name or origin["name"],
            "project": project,
            "command": origin["command"] or ["python3"],
            "code": origin["code"] if parts["git"] else None,
            "packages": _environment.installed_packages() if parts["packages"] else [],
            "tags": sorted(set(tags)),
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

    def connect(self, parameters: Any, name: Optional[str] = None) -> Any:
        """Record these parameters: a dict, an argparse.Namespace or an object's public
        attributes (keys under `name/` when named, as ClearML's sections). In a Klique job, the
        values stored on the task (edited with `klique submit --clone ID --param K=V`) replace
        the script's defaults, in place; returns what it was given."""
        values, write_back = _connect.flat(parameters, name or "")
        write_back(self._connect_values(values))
        return parameters

    def connect_configuration(self, configuration: Any, name: str = "General") -> Any:
        """A configuration (a dict, or a file's path) recorded as the parameter
        `configuration/NAME`; in a job, the task's stored one: the dict, or the path of a file
        with the stored text."""
        value, is_file = _connect.configuration_value(configuration)
        stored = self._connect_values({f"configuration/{name}": value})[f"configuration/{name}"]
        if is_file:
            return _connect.configuration_file(str(configuration), str(stored))
        return stored

    def _connect_values(self, parameters: Dict[str, Any]) -> Dict[str, Any]:
        """Record flat parameters; the values to use (the stored ones, in a job)."""
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

    def upload_artifact(
        self,
        name: str,
        artifact_object: Any = None,
        metadata: Optional[Dict[str, Any]] = None,
        artifact: Any = None,
    ) -> Dict[str, Any]:
        """A file or a folder (a path to one) or any picklable object (a DataFrame, a numpy
        array...), kept under `name` on the task; `artifacts[name].get()` gives it back.
        metadata= (JSON values) is kept as the parameter `artifact_metadata/NAME`."""
        given = artifact if artifact is not None else artifact_object
        stored = upload(self._api, self.id, name, given)
        if metadata is not None:
            body = {"values": {f"artifact_metadata/{name}": dict(metadata)}, "overwrite": True}
            self._api.post(f"/sdk/tasks/{self.id}/parameters", body)
        return stored

    def register_model(
        self,
        name: str,
        path: str,
        framework: Optional[str] = None,
        metadata: Optional[Dict[str, Any]] = None,
        tags: Optional[List[str]] = None,
    ) -> Model:
        """A new version of model `name` in the registry, made by this task: the file or folder
        at `path` (uploaded as this task's artifacts), with this task's last scalars as its
        metrics. `klique model promote NAME VERSION production` serves it from endpoints."""
        return register(self._api, self.id, name, path, framework, metadata, tags)

    # Where it runs

    def execute_remotely(
        self,
        resource: Optional[str] = None,
        exit_process: bool = True,
        requirements: Optional[List[str]] = None,
        image: Optional[str] = None,
        queue_name: Optional[str] = None,
    ) -> Optional[Task]:
        """Queue this same task (code, diff, packages, parameters) on a compute resource and stop
        the local run (or return, with exit_process=False). Inside a Klique job: nothing.
        queue_name= is ClearML's name for the compute resource."""
        resource = queue_name or resource
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
            "requirements": _with_added(list(requirements), Task._added_requirements),
            "image": image or self._image,
        }
        self._stop_capture()
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

    @classmethod
    def add_requirements(cls, package_name: str, package_version: Optional[str] = None) -> None:
        """ClearML's: a package (or a requirements file's lines) that execute_remotely sends
        with the task's requirements, in place of the same package found installed here."""
        if os.path.isfile(package_name):
            with open(package_name, encoding="utf-8") as f:
                lines = [line.split("#")[0].strip() for line in f]
            cls._added_requirements.extend(line for line in lines if line)
        else:
            pinned = f"{package_name}=={package_version}" if package_version else package_name
            cls._added_requirements.append(pinned)

    def set_base_docker(
        self,
        docker_cmd: Optional[str] = None,
        docker_image: Optional[str] = None,
        docker_arguments: Any = None,
        docker_setup_bash_script: Any = None,
    ) -> None:
        """ClearML's: the container image execute_remotely sends (its `image=`). The
        container's arguments and set-up script are the compute resource's, set by the site."""
        image = docker_image or docker_cmd
        if docker_arguments or docker_setup_bash_script or (image and " " in image.strip()):
            raise KliqueError(
                "set_base_docker takes an image only: a container's arguments and set-up are "
                "the compute resource's (ask the site), or put the set-up in the image"
            )
        self._image = image.strip() if image else None

    def mark_completed(self) -> None:
        """ClearML's: end this run now as completed. A run recorded where it runs only; a
        job ends as completed when its script exits with 0."""
        if self.local is None:
            raise KliqueError(
                f"task {self.id} runs in a Klique job (or is another run): it ends when its "
                "script exits; `klique cancel` stops it"
            )
        self.close()

    def close(self) -> None:
        """End a local run now (completed); otherwise it ends when the process exits."""
        self._stop_capture()
        if self.local is not None:
            self.local.finish()
            self.local = None
            Task._current = None

    def fail(self, reason: str) -> None:
        """End a local run now as failed, with the reason."""
        self._stop_capture()
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


def _with_added(requirements: List[str], added: List[str]) -> List[str]:
    """The requirements found installed, the added ones replacing the same packages."""
    names = {_package_name(line) for line in added}
    kept = [line for line in requirements if _package_name(line) not in names]
    return kept + [line for line in added if line not in kept]


def _package_name(line: str) -> str:
    """`torch>=2; python_version>'3'` -> `torch` (as pip compares names)."""
    name = re.split(r"[<>=!~;\[ @]", line.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


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
