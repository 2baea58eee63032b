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
import operator
import pickle
import sys
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
        retries: int = 0,
        name: Optional[str] = None,
        single: Optional[bool] = None,
    ) -> None:
        self.func = func
        self.resource = resource
        self.returns = tuple(check_name(r) for r in returns) or ("result",)
        self.single = not returns if single is None else single
        self.cache = cache
        self.requirements = requirements
        self.image = image
        self.retries = _retries(retries)
        self.__name__ = name or func.__name__
        self.__doc__ = func.__doc__

    def source(self) -> str:
        """What the cache compares of the step itself: the function's source."""
        return inspect.getsource(self.func)

    def runs(self, args: List[Any], kwargs: Dict[str, Any]) -> Dict[str, Any]:
        """What the step's task runs: the pipeline's script, calling this function."""
        return {
            "command": STEP_COMMAND,
            "parameters": {
                STEP_KEY: {
                    "function": self.func.__name__,
                    "returns": list(self.returns),
                },
                "args": args,
                "kwargs": kwargs,
            },
        }

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        controller = Controller.current
        if controller is None:  # outside a pipeline: a plain call
            return self.func(*args, **kwargs)
        outputs = controller.add(self, args, kwargs)
        return outputs[0] if self.single else tuple(outputs)


class TaskStep(Step):
    """A step that is a clone of an existing task (ClearML's add_step): the base task's code,
    packages and parameters, its keyword arguments the parameters to change. Other steps read
    its id (`${NAME.id}`), and through it its artifacts; it has no return values."""

    def __init__(self, name: str, base: int, resource: Optional[str], retries: int) -> None:
        def clone() -> None:
            """A clone of the base task."""

        super().__init__(clone, resource, (), False, None, None, retries, name)
        self.base = int(base)

    def source(self) -> str:
        raise KliqueError(f"step {self.__name__}: a cloned task's outputs are not cached")

    def runs(self, args: List[Any], kwargs: Dict[str, Any]) -> Dict[str, Any]:
        """The parameters to change: values (JSON), or another step's task id."""
        changed = {}
        for key, value in kwargs.items():
            if "value" not in value:
                raise KliqueError(
                    f"step {self.__name__}: parameter {key} of a cloned task takes a value "
                    "(text, a number, a list or a dict) or ${STEP.id}, not a step's output"
                )
            changed[key] = value["value"]
        return {"parameters": changed}


def step(
    resource: Optional[str] = None,
    returns: Sequence[str] = (),
    cache: bool = False,
    requirements: Optional[List[str]] = None,
    image: Optional[str] = None,
    retries: int = 0,
) -> Callable[[Callable[..., Any]], Step]:
    """Make a function a pipeline step. `returns` names its outputs when it returns a tuple;
    `cache=True` reuses the outputs of a completed step with the same code and inputs;
    `retries=N` starts a step that failed (not one cancelled) again, up to N times."""

    def wrap(func: Callable[..., Any]) -> Step:
        return Step(func, resource, tuple(returns), cache, requirements, image, retries)

    return wrap


def _retries(retries: Any) -> int:
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise KliqueError(f"retries {retries!r}: give a number of retries, 0 or more")
    return retries


class Output:
    """A step's output before it exists. Passed to another step it is that step's input;
    used as a value (printed, compared, added, indexed, an attribute read) the pipeline runs
    until it exists and it is its value; .result() says so outright."""

    def __init__(self, node: Node, name: str) -> None:
        self.node = node
        self.name = name

    def __repr__(self) -> str:
        return f"<klique.Output {self.node.step.__name__}.{self.name}>"

    def result(self) -> Any:
        """Run the pipeline until this output exists, and return its value."""
        if "_value" not in self.__dict__:
            self.node.controller.run(until=self.node)
            task = self.node.task_id
            value = Task(self.node.controller.api, task or 0).artifacts[self.name].get()
            self.__dict__["_value"] = value
        return self.__dict__["_value"]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # pickle's and copy's probes find nothing here
            raise AttributeError(name)
        return getattr(self.result(), name)

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise KliqueError(
            f"{self!r} is a step's output that does not exist yet: pass it to a step as an "
            "argument of its own, or use its value with .result()"
        )


def _through_value(name: str, apply: Callable[..., Any]) -> None:
    """Output.NAME: the same operation on the output's value."""

    def method(self: Output, *args: Any) -> Any:
        return apply(self.result(), *args)

    method.__name__ = name
    setattr(Output, name, method)


_THROUGH_VALUE: Dict[str, Callable[..., Any]] = {
    "__str__": str,
    "__format__": format,
    "__bool__": bool,
    "__len__": len,
    "__iter__": iter,
    "__int__": int,
    "__float__": float,
    "__index__": operator.index,
    "__getitem__": operator.getitem,
    "__contains__": operator.contains,
    "__eq__": operator.eq,
    "__ne__": operator.ne,
    "__lt__": operator.lt,
    "__le__": operator.le,
    "__gt__": operator.gt,
    "__ge__": operator.ge,
    "__add__": operator.add,
    "__sub__": operator.sub,
    "__mul__": operator.mul,
    "__truediv__": operator.truediv,
    "__floordiv__": operator.floordiv,
    "__mod__": operator.mod,
    "__pow__": operator.pow,
    "__neg__": operator.neg,
    "__abs__": abs,
    "__round__": round,
    "__radd__": lambda value, other: other + value,
    "__rsub__": lambda value, other: other - value,
    "__rmul__": lambda value, other: other * value,
    "__rtruediv__": lambda value, other: other / value,
}
for _name, _apply in _THROUGH_VALUE.items():
    _through_value(_name, _apply)


class TaskOf:
    """The id of a step's task, passed to another step (ClearML's `${NAME.id}`): that step
    may read every artifact of it."""

    def __init__(self, node: Node) -> None:
        self.node = node


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
        self.after: List[Node] = []  # steps it waits for without reading their outputs
        self.tries = 0

    def needs(self) -> List[Node]:
        values = list(self.args) + list(self.kwargs.values())
        return [v.node for v in values if isinstance(v, (Output, TaskOf))] + self.after


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
        self.default_resource: Optional[str] = None  # a step's when it names none

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
            if node.state in _FAILED and node.state != "cancelled" and self._retry(node):
                continue
            if node.state in _FAILED:
                self._cancel_running()
                raise PipelineFailed(
                    f"step {node.step.__name__} (task {node.task_id}) {node.state}: "
                    f"{found['reason']}"
                )

    @staticmethod
    def _retry(node: Node) -> bool:
        """Start a failed step again if it has retries left."""
        if node.tries >= node.step.retries:
            return False
        node.tries += 1
        print(
            f"klique: step {node.step.__name__} (task {node.task_id}) {node.state}; "
            f"starting it again ({node.tries} of {node.step.retries})",
            file=sys.stderr,
            flush=True,
        )
        node.task_id, node.state = None, "waiting"
        return True

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
            if isinstance(node.step, TaskStep):
                clone = {
                    "name": body["name"],
                    "resource": node.step.resource,  # None: the base task's
                    "parameters": body["parameters"],
                    "parent": self.pipeline,
                }
                self._made(node, self.api.post(f"/sdk/tasks/{node.step.base}/clone", clone))
            elif "reuse" in body:
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
        for value in [*node.args, *node.kwargs.values()]:
            if isinstance(value, TaskOf):  # its reader may read every artifact of that task
                inputs += self._every_artifact(value.node.task_id or 0)
        body: Dict[str, Any] = {
            "name": step.__name__,
            "project": self.project,
            "resource": step.resource or self._default_resource(),
            "code": self.code,
            "requirements": step.requirements
            if step.requirements is not None
            else self.requirements,
            "image": step.image,
            "parent": self.pipeline,
            "inputs": inputs,
        }
        body.update(step.runs(args, kwargs))
        if STEP_KEY in body["parameters"]:
            body["parameters"][STEP_KEY]["script"] = self.script
        if step.cache:
            body["cache_key"] = self._cache_key(step, args, kwargs)
            earlier = self._cached(body["cache_key"])
            if earlier is not None:
                body["reuse"] = earlier
        return body

    def _default_resource(self) -> Optional[str]:
        if self.default_resource is None:
            self.default_resource = self.api.get("/sdk/settings")["default_resource"]
        return self.default_resource

    def _every_artifact(self, task_id: int) -> List[Dict[str, Any]]:
        listed = self.api.get(f"/tasks/{int(task_id)}/artifacts")
        return [{"task": int(task_id), "name": a["name"]} for a in listed]

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
            "source": step.source(),
            "resource": step.resource,
            "args": [by_content(a) for a in args],
            "kwargs": {k: by_content(v) for k, v in sorted(kwargs.items())},
        }
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()

    def _encode(self, value: Any) -> Any:
        """An input as a step's parameters carry it: an artifact, JSON, or a pickle."""
        if isinstance(value, Output):
            return {"artifact": {"task": value.node.task_id, "name": value.name}}
        if isinstance(value, TaskOf):
            return {"value": value.node.task_id}
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
