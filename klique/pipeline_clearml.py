"""ClearML's pipeline names on Klique's pipelines (klique/pipeline.py): `PipelineDecorator`
(component, pipeline, run_locally, debug_pipeline, set_default_execution_queue) and
`PipelineController` (add_step, add_function_step, add_parameter, start, start_locally, wait).
A queue is a compute resource; each step is a task there, a child of the pipeline's task."""

from __future__ import annotations

import re

from klique._api import KliqueError
from klique.pipeline import Controller, Node, Pipeline, Step, TaskOf, TaskStep, _origin_of
from klique.task import Task

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Sequence, Union

RETURNED = ("return_object",)  # ClearML's name for a step's one return value
_REFERENCE = re.compile(r"^\$\{([^.{}]+)\.([^{}]+)\}$")  # ${step.id}, ${step.name}, ${pipeline.x}


def _requirements(packages: Union[None, str, Sequence[str]]) -> Optional[List[str]]:
    """ClearML's packages=: a list of requirements, or a requirements file's path."""
    if packages is None:
        return None
    if isinstance(packages, str):
        with open(packages, encoding="utf-8") as f:
            lines = [line.split("#")[0].strip() for line in f]
        return [line for line in lines if line]
    return list(packages)


def _returns(names: Sequence[str]) -> Dict[str, Any]:
    """Step's returns= and single= for ClearML's return_values: one name is a plain value."""
    names = (names,) if isinstance(names, str) else tuple(names)
    return {"returns": names, "single": len(names) == 1}


class Component(Step):
    """A function step (`@PipelineDecorator.component`): its queue, else the default one
    (set_default_execution_queue, the pipeline's default_queue), else the estate's default
    compute resource."""

    @property
    def resource(self) -> Optional[str]:
        return self._queue or PipelineDecorator._default_queue

    @resource.setter
    def resource(self, queue: Optional[str]) -> None:
        self._queue = queue


class PipelineDecorator:
    """ClearML's decorators: `@PipelineDecorator.component(...)` on each step's function,
    `@PipelineDecorator.pipeline(...)` on the function that calls them."""

    _default_queue: Optional[str] = None
    _controller_here = False  # run_locally(): the controller runs in this process
    _steps_here = False  # debug_pipeline(): the steps are plain calls, in this process

    @classmethod
    def component(
        cls,
        _func: Optional[Callable[..., Any]] = None,
        *,
        return_values: Sequence[str] = RETURNED,
        name: Optional[str] = None,
        cache: bool = False,
        packages: Union[None, str, Sequence[str]] = None,
        execution_queue: Optional[str] = None,
        docker: Optional[str] = None,
        retry_on_failure: int = 0,
    ) -> Any:
        """A step on the compute resource `execution_queue`. One name in return_values: the
        step returns a plain value; several: a tuple. cache=True reuses the outputs of the
        same code and inputs; retry_on_failure=N starts a failed step again up to N times;
        packages= and docker= are the step's requirements and image."""

        def wrap(func: Callable[..., Any]) -> Component:
            return Component(
                func,
                execution_queue,
                cache=cache,
                requirements=_requirements(packages),
                image=docker,
                retries=retry_on_failure or 0,
                name=name,
                **_returns(return_values),
            )

        return wrap(_func) if _func is not None else wrap

    @classmethod
    def pipeline(
        cls,
        _func: Optional[Callable[..., Any]] = None,
        *,
        name: str,
        project: str = "default",
        version: Optional[str] = None,
        default_queue: Optional[str] = None,
        pipeline_execution_queue: Optional[str] = None,
        start_controller_locally: bool = False,
    ) -> Any:
        """The pipeline. Calling it runs the controller on the compute resource
        `pipeline_execution_queue` (None: the estate's pipeline resource), or in this process
        after run_locally() or with start_controller_locally=True."""

        def wrap(func: Callable[..., Any]) -> DecoratedPipeline:
            made = DecoratedPipeline(func, name, project, pipeline_execution_queue)
            made.version, made.default_queue = version, default_queue
            made.here = start_controller_locally
            return made

        return wrap(_func) if _func is not None else wrap

    @classmethod
    def run_locally(cls) -> None:
        """The controller runs in this process; each step still runs on its compute resource."""
        cls._controller_here = True

    @classmethod
    def debug_pipeline(cls) -> None:
        """Everything in this process: the steps are plain function calls, no tasks made."""
        cls._steps_here = True

    @classmethod
    def set_default_execution_queue(cls, default_execution_queue: Optional[str]) -> None:
        """The compute resource of the components that name none."""
        cls._default_queue = default_execution_queue


class DecoratedPipeline(Pipeline):
    """`@PipelineDecorator.pipeline`: a Pipeline whose call goes where ClearML's goes."""

    version: Optional[str] = None
    default_queue: Optional[str] = None
    here = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if PipelineDecorator._steps_here:
            return self.func(*args, **kwargs)
        if self.default_queue and PipelineDecorator._default_queue is None:
            PipelineDecorator._default_queue = self.default_queue
        if PipelineDecorator._controller_here or self.here:
            return super().__call__(*args, **kwargs)
        return self.remote(*args, **kwargs)

    def _task(self, args: Any, kwargs: Any) -> Any:
        task, params = super()._task(args, kwargs)
        if self.version:
            task.connect({"version": self.version}, name="Pipeline")
        return task, params


class PipelineController:
    """ClearML's PipelineController: steps added by name (clones of tasks, or functions of
    this script), with parents, run by start_locally() here or by start() as a task."""

    def __init__(
        self,
        name: str,
        project: str = "default",
        version: Optional[str] = None,
        retry_on_failure: int = 0,
    ) -> None:
        self.name = name
        self.project = project
        self.version = version
        self.retries = retry_on_failure or 0
        self.default_queue: Optional[str] = None
        self.parameters: Dict[str, Any] = {}
        self._added: List[Dict[str, Any]] = []
        self.task: Optional[Task] = None
        self._done = False

    def set_default_execution_queue(self, default_execution_queue: Optional[str]) -> None:
        """The compute resource of the steps that name none."""
        self.default_queue = default_execution_queue

    def add_parameter(self, name: str, default: Any = None, description: str = "") -> None:
        """A pipeline parameter (recorded on the pipeline's task, edited in a clone); steps
        read it as ${pipeline.NAME}."""
        self.parameters[name] = default

    def add_step(
        self,
        name: str,
        base_task_id: Optional[int] = None,
        parents: Optional[Sequence[str]] = None,
        parameter_override: Optional[Dict[str, Any]] = None,
        execution_queue: Optional[str] = None,
        retry_on_failure: Optional[int] = None,
        base_task_project: Optional[str] = None,
        base_task_name: Optional[str] = None,
    ) -> bool:
        """A clone of an existing task (by id, or the newest of yours named base_task_name in
        base_task_project), its parameters changed by parameter_override (values, or
        ${STEP.id} of an earlier step), queued on execution_queue (None: the base task's)."""
        if base_task_id is None:
            if not base_task_name:
                raise KliqueError(f"step {name}: give base_task_id=, or base_task_name=")
            found = Task.get_task(project_name=base_task_project, task_name=base_task_name)
            base_task_id = found.id
        self._add(
            name,
            parents,
            TaskStep(name, int(base_task_id), execution_queue, self._retries(retry_on_failure)),
            dict(parameter_override or {}),
        )
        return True

    def add_function_step(
        self,
        name: str,
        function: Callable[..., Any],
        function_kwargs: Optional[Dict[str, Any]] = None,
        function_return: Sequence[str] = RETURNED,
        execution_queue: Optional[str] = None,
        parents: Optional[Sequence[str]] = None,
        cache_executed_step: bool = False,
        retry_on_failure: Optional[int] = None,
        packages: Union[None, str, Sequence[str]] = None,
        docker: Optional[str] = None,
    ) -> bool:
        """A function of this script (defined at its top level) as a step on execution_queue;
        function_kwargs take values, ${STEP.RETURN_NAME}, ${STEP.id} or ${pipeline.NAME}."""
        if getattr(function, "__qualname__", "").count(".") or not callable(function):
            raise KliqueError(
                f"step {name}: the function must be defined at the top level of the script "
                "(the step's job imports it from there)"
            )
        made = Step(
            function,
            execution_queue,
            cache=cache_executed_step,
            requirements=_requirements(packages),
            image=docker,
            retries=self._retries(retry_on_failure),
            name=name,
            **_returns(function_return),
        )
        self._add(name, parents, made, dict(function_kwargs or {}))
        return True

    def _retries(self, asked: Optional[int]) -> int:
        return self.retries if asked is None else asked

    def _add(
        self, name: str, parents: Optional[Sequence[str]], made: Step, kwargs: Dict[str, Any]
    ) -> None:
        known = [a["name"] for a in self._added]
        if name in known:
            raise KliqueError(f"the pipeline has a step {name!r} already; name each step once")
        for parent in parents or ():
            if parent not in known:
                raise KliqueError(
                    f"step {name}: parent {parent!r} is not a step added before it "
                    f"(added: {', '.join(known) or 'none'})"
                )
        self._added.append(
            {"name": name, "step": made, "parents": list(parents or ()), "kwargs": kwargs}
        )

    def start_locally(self, run_pipeline_steps_locally: bool = False) -> bool:
        """Run the pipeline with its controller here, until it ends; with
        run_pipeline_steps_locally=True its function steps are plain calls in this process."""
        if run_pipeline_steps_locally:
            self._run_here()
        else:
            self._run(self._pipeline_task())
        return True

    def start(self, queue: Optional[str] = None, wait: bool = True) -> bool:
        """Queue the controller on the compute resource `queue` (None: the estate's pipeline
        resource) and end this process, as ClearML's does; in the controller's job, run it."""
        task = self._pipeline_task()
        if task.running_locally:
            resource = queue or task._api.get("/sdk/settings")["pipeline_resource"]
            task.execute_remotely(resource=resource, exit_process=True)
        self._run(task)
        return True

    def wait(self, timeout: Optional[float] = None) -> None:
        """The pipeline has ended by now: start() and start_locally() return at its end."""
        if not self._done:
            raise KliqueError("the pipeline has not started: call start() or start_locally()")

    def _pipeline_task(self) -> Task:
        task = Task.init(project=self.project, name=self.name)
        if self.parameters:
            task.connect(self.parameters, name="Args")
        if self.version:
            task.connect({"version": self.version}, name="Pipeline")
        self.task = task
        return task

    def _run(self, task: Task) -> None:
        controller = Controller(task, _origin_of(task), self.project)
        nodes: Dict[str, Node] = {}
        for added in self._added:
            step: Step = added["step"]
            if step.resource is None and not isinstance(step, TaskStep):
                step.resource = self.default_queue
            kwargs = {k: self._value(v, nodes, added["name"]) for k, v in added["kwargs"].items()}
            node = Node(controller, step, (), kwargs)
            node.after = [nodes[p] for p in added["parents"]]
            controller.nodes.append(node)
            nodes[added["name"]] = node
        try:
            controller.run()
        except KliqueError as exc:
            task.fail(str(exc))
            raise
        self._done = True
        task.close()

    def _run_here(self) -> None:
        results: Dict[str, Any] = {}
        for added in self._added:
            step: Step = added["step"]
            if isinstance(step, TaskStep):
                raise KliqueError(
                    f"step {added['name']} is a clone of task {step.base}: it runs on a "
                    "compute resource; use start_locally() without run_pipeline_steps_locally"
                )
            kwargs = {k: self._plain(v, results, added["name"]) for k, v in added["kwargs"].items()}
            value = step.func(**kwargs)
            values = [value] if step.single else list(value)
            results[added["name"]] = dict(zip(step.returns, values))  # noqa: B905 (Python 3.8)
        self._done = True

    def _value(self, value: Any, nodes: Dict[str, Node], where: str) -> Any:
        """A step's argument: `${STEP.NAME}` the output of an earlier step, `${STEP.id}` its
        task's id, `${pipeline.NAME}` a pipeline parameter; anything else as it is."""
        found = _REFERENCE.match(value) if isinstance(value, str) else None
        if found is None:
            return value
        step, name = found.groups()
        if step == "pipeline":
            return self._parameter(name, where)
        if step not in nodes:
            raise KliqueError(f"step {where}: {value} names no step added before it")
        node = nodes[step]
        if name == "id":
            return TaskOf(node)
        for output in node.outputs:
            if output.name == name:
                return output
        returns = ", ".join(node.step.returns) or "nothing"
        raise KliqueError(f"step {where}: {value}: step {step} returns {returns}")

    def _plain(self, value: Any, results: Dict[str, Dict[str, Any]], where: str) -> Any:
        found = _REFERENCE.match(value) if isinstance(value, str) else None
        if found is None:
            return value
        step, name = found.groups()
        if step == "pipeline":
            return self._parameter(name, where)
        if name not in results.get(step, {}):
            raise KliqueError(f"step {where}: {value} is no output of a step run before it")
        return results[step][name]

    def _parameter(self, name: str, where: str) -> Any:
        if name not in self.parameters:
            raise KliqueError(f"step {where}: no pipeline parameter {name!r} (add_parameter)")
        return self.parameters[name]
