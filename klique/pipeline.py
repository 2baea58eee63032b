"""Pipelines: `@klique.step(resource=...)` makes a function a step, `@klique.pipeline(...)` a
function whose body calls steps. Each call becomes a task on its step's compute resource;
return values pass to the next steps as artifacts (pickled objects, or files); steps whose
inputs are ready run at the same time. The controller runs here, or as a task itself."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import inspect
import json
import pickle
import time

from klique._api import KliqueError
from klique.artifacts import PICKLE_PROTOCOL, File, check_name
from klique.task import Task

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

    from klique._api import Api

STEP_COMMAND = ["python3", "-m", "klique", "step"]
STEP_KEY = "klique.step"  # the parameter that tells a step's job what to run
POLL_S = 0.5
BATCH = 1000  # ready steps queued in one request
_FAILED = ("failed", "cancelled", "timeout", "lost")


class PipelineFailed(KliqueError):
    """A step failed (its reason is the pipeline's), or the pipeline was cancelled."""


class Step:
    """A function that runs as a task on `resource` when a pipeline calls it."""

    def __init__(
        self,
        func: Callable[..., Any],
        resource: Optional[str],
        returns: Sequence[str],
        cache: bool,
        requirements: Optional[List[str]],
        image: Optional[str],
    ) -> None:
        self.func = func
        self.resource = resource
        self.returns = tuple(check_name(r) for r in returns) or ("result",)
        self.single = not returns
        self.cache = cache
        self.requirements = requirements
        self.image = image
        self.__name__ = func.__name__
        self.__doc__ = func.__doc__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        controller = Controller.current
        if controller is None:  # outside a pipeline: a plain call
            return self.func(*args, **kwargs)
        outputs = controller.add(self, args, kwargs)
        return outputs[0] if self.single else tuple(outputs)


def step(
    resource: Optional[str] = None,
    returns: Sequence[str] = (),
    cache: bool = False,
    requirements: Optional[List[str]] = None,
    image: Optional[str] = None,
) -> Callable[[Callable[..., Any]], Step]:
    """Make a function a pipeline step. `returns` names its outputs when it returns a tuple;
    `cache=True` reuses the outputs of a completed step with the same code and inputs."""

    def wrap(func: Callable[..., Any]) -> Step:
        return Step(func, resource, tuple(returns), cache, requirements, image)

    return wrap


class Output:
    """A step's output before it exists: pass it to other steps, or ask for .result()."""

    def __init__(self, node: Node, name: str) -> None:
        self.node = node
        self.name = name

    def __repr__(self) -> str:
        return f"<klique.Output {self.node.step.__name__}.{self.name}>"

    def result(self) -> Any:
        """Run the pipeline until this output exists, and return its value."""
        self.node.controller.run(until=self.node)
        task = self.node.task_id
        return Task(self.node.controller.api, task or 0).artifacts[self.name].get()


class Node:
    """One call of a step in the pipeline's body: a task once its inputs are ready."""

    def __init__(
        self, controller: Controller, step: Step, args: Tuple[Any, ...], kwargs: Dict[str, Any]
    ):
        self.controller = controller
        self.step = step
        self.args = args
        self.kwargs = kwargs
        self.task_id: Optional[int] = None
        self.state = "waiting"
        self.outputs = [Output(self, name) for name in step.returns]

    def needs(self) -> List[Node]:
        values = list(self.args) + list(self.kwargs.values())
        return [v.node for v in values if isinstance(v, Output)]


class Controller:
    """Runs a pipeline's graph: starts each step once its inputs exist, follows them all with
    one request per look, and stops everything at the first failure."""

    current: Optional[Controller] = None

    def __init__(self, task: Task, origin: Dict[str, Any], project: str) -> None:
        self.api: Api = task._api
        self.pipeline = task.id
        self.project = project
        self.code = origin.get("code")
        self.script = origin["command"][1]
        self.requirements = list(origin.get("requirements") or [])
        self.nodes: List[Node] = []

    def add(self, step: Step, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> List[Output]:
        node = Node(self, step, args, kwargs)
        self.nodes.append(node)
        return node.outputs

    def run(self, until: Optional[Node] = None) -> None:
        while True:
            self._check_pipeline()
            ready = [
                node
                for node in self.nodes
                if node.state == "waiting" and all(n.state == "completed" for n in node.needs())
            ]
            if ready:
                self._start(ready)
            self._follow()
            target = [until] if until is not None else self.nodes
            if all(n.state == "completed" for n in target):
                return
            time.sleep(POLL_S)

    def _check_pipeline(self) -> None:
        state = self.api.get(f"/sdk/tasks/{self.pipeline}")["state"]
        if state in _FAILED:
            raise PipelineFailed(f"pipeline {self.pipeline} was {state}")

    def _follow(self) -> None:
        started = {n.task_id: n for n in self.nodes if n.task_id is not None}
        if not started:
            return
        for found in self.api.get(f"/sdk/tasks/{self.pipeline}/steps"):
            node = started.get(found["id"])
            if node is None:
                continue
            node.state = found["state"]
            if node.state in _FAILED:
                self._cancel_running()
                raise PipelineFailed(
                    f"step {node.step.__name__} (task {node.task_id}) {node.state}: "
                    f"{found['reason']}"
                )

    def _cancel_running(self) -> None:
        for node in self.nodes:
            if node.task_id is not None and node.state not in ("completed", *_FAILED):
                with contextlib.suppress(KliqueError):
                    self.api.post(f"/sdk/tasks/{node.task_id}/cancel")

    def _start(self, nodes: List[Node]) -> None:
        """Every ready step: those whose outputs an earlier run made are recorded one by one,
        the others queued together in one request."""
        queued: List[Tuple[Node, Dict[str, Any]]] = []
        for node in nodes:
            body = self._body(node)
            if "reuse" in body:
                self._made(node, self.api.post("/sdk/tasks", body))
            else:
                queued.append((node, body))
        for start in range(0, len(queued), BATCH):
            chunk = queued[start : start + BATCH]
            made = self.api.post("/sdk/tasks/batch", {"tasks": [body for _, body in chunk]})
            if len(made) != len(chunk):
                raise KliqueError(f"asked for {len(chunk)} steps, the server made {len(made)}")
            for (node, _), task in zip(chunk, made):  # noqa: B905 (lengths checked; Python 3.8)
                self._made(node, task)

    @staticmethod
    def _made(node: Node, task: Dict[str, Any]) -> None:
        node.task_id = int(task["id"])
        node.state = task["state"]

    def _body(self, node: Node) -> Dict[str, Any]:
        step = node.step
        args = [self._encode(a) for a in node.args]
        kwargs = {k: self._encode(v) for k, v in node.kwargs.items()}
        inputs = [
            {"task": ref["artifact"]["task"], "name": ref["artifact"]["name"]}
            for ref in [*args, *kwargs.values()]
            if isinstance(ref, dict) and "artifact" in ref
        ]
        body: Dict[str, Any] = {
            "name": step.__name__,
            "project": self.project,
            "resource": step.resource,
            "command": STEP_COMMAND,
            "code": self.code,
            "requirements": step.requirements
            if step.requirements is not None
            else self.requirements,
            "image": step.image,
            "parent": self.pipeline,
            "inputs": inputs,
            "parameters": {
                STEP_KEY: {
                    "script": self.script,
                    "function": step.func.__name__,
                    "returns": list(step.returns),
                },
                "args": args,
                "kwargs": kwargs,
            },
        }
        if step.cache:
            body["cache_key"] = self._cache_key(step, args, kwargs)
            earlier = self._cached(body["cache_key"])
            if earlier is not None:
                body["reuse"] = earlier
        return body

    def _cached(self, key: str) -> Optional[int]:
        try:
            return int(self.api.get("/sdk/cached", key=key)["id"])
        except KliqueError:
            return None

    def _cache_key(self, step: Step, args: List[Any], kwargs: Dict[str, Any]) -> str:
        """The step's own source and its inputs (an artifact by its content's digest)."""
        digests: Dict[Tuple[int, str], str] = {}

        def by_content(value: Any) -> Any:
            if isinstance(value, dict) and "artifact" in value:
                ref = value["artifact"]
                key = (ref["task"], ref["name"])
                if key not in digests:
                    digests[key] = Task(self.api, ref["task"]).artifacts[ref["name"]].digest
                return {"artifact": digests[key]}
            return value

        what = {
            "source": inspect.getsource(step.func),
            "resource": step.resource,
            "args": [by_content(a) for a in args],
            "kwargs": {k: by_content(v) for k, v in sorted(kwargs.items())},
        }
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()

    def _encode(self, value: Any) -> Any:
        """An input as a step's parameters carry it: an artifact, JSON, or a pickle."""
        if isinstance(value, Output):
            return {"artifact": {"task": value.node.task_id, "name": value.name}}
        if isinstance(value, File):
            name = f"input-{hashlib.sha256(value.path.encode()).hexdigest()[:16]}"
            Task(self.api, self.pipeline).upload_artifact(name, value)
            return {"artifact": {"task": self.pipeline, "name": name}}
        try:
            text = json.dumps(value)
        except (TypeError, ValueError):
            text = None
        if text is not None and json.loads(text) == value:
            return {"value": value}
        data = pickle.dumps(value, protocol=PICKLE_PROTOCOL)
        return {"pickle": base64.b64encode(data).decode("ascii")}


class Pipeline:
    """A function whose body calls steps. Calling it runs the controller here; .remote()
    queues the controller as a task (and, in that task's job, runs it)."""

    def __init__(self, func: Callable[..., Any], name: str, project: str, resource: Optional[str]):
        self.func = func
        self.name = name
        self.project = project
        self.resource = resource
        self.__name__ = func.__name__
        self.__doc__ = func.__doc__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        task, params = self._task(args, kwargs)
        return self._control(task, params)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """Queue the controller on the estate's pipeline resource (or this pipeline's); inside
        the controller's own job, run it. Returns the pipeline's Task (its result in the job)."""
        task, params = self._task(args, kwargs)
        if task.running_locally:
            resource = self.resource or task._api.get("/sdk/settings")["pipeline_resource"]
            task.execute_remotely(resource=resource, exit_process=False)
            return task
        return self._control(task, params)

    def _task(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[Task, Dict[str, Any]]:
        bound = inspect.signature(self.func).bind(*args, **kwargs)
        bound.apply_defaults()
        task = Task.init(project=self.project, name=self.name)
        return task, task.connect(dict(bound.arguments))

    def _control(self, task: Task, params: Dict[str, Any]) -> Any:
        origin = _origin_of(task)
        controller = Controller(task, origin, self.project)
        Controller.current = controller
        try:
            outputs = self.func(**params)
            controller.run()
        except KliqueError as exc:
            task.fail(str(exc))
            raise
        finally:
            Controller.current = None
        result = _resolve(outputs)
        if result is not None:
            task.upload_artifact("result", result)
        task.close()
        return result


def pipeline(
    name: Optional[str] = None, project: str = "default", resource: Optional[str] = None
) -> Callable[[Callable[..., Any]], Pipeline]:
    """Make a function a pipeline. `resource` is where .remote() runs its controller (default:
    the estate's pipeline resource)."""

    def wrap(func: Callable[..., Any]) -> Pipeline:
        return Pipeline(func, name or func.__name__, project, resource)

    return wrap


def _origin_of(task: Task) -> Dict[str, Any]:
    """The code, script and requirements the steps share with the controller."""
    if task._job is not None:
        doc = task._job
        return {
            "code": doc.get("code"),
            "command": doc.get("command"),
            "requirements": doc.get("requirements") or [],
        }
    if not task._origin.get("command"):
        raise KliqueError("a pipeline runs from a script file: save it, and run it with python3")
    # on its path only: every task imports klique
    from klique._environment import requirements_to_send

    return dict(task._origin, requirements=requirements_to_send())


def _resolve(value: Any) -> Any:
    if isinstance(value, Output):
        return value.result()
    if isinstance(value, tuple):
        return tuple(_resolve(v) for v in value)
    if isinstance(value, list):
        return [_resolve(v) for v in value]
    return value
