"""ClearML's pipeline names on Klique's pipelines, without a server: a one-name return is a
plain value; a step's output used as a value is its value, and pickling one says `.result()`;
retries start a failed step again (not a cancelled one); the default queue, packages and
references between steps; folders as artifacts; add_requirements, set_base_docker and
mark_completed."""

from __future__ import annotations

import hashlib
import io
import os
import pickle
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from klique import KliqueError, PipelineController, PipelineDecorator, PipelineFailed
from klique.artifacts import Artifact, upload
from klique.pipeline import Controller, Node, Output, Pipeline, Step, TaskOf
from klique.pipeline_clearml import DecoratedPipeline
from klique.task import Task, _with_added


@pytest.fixture(autouse=True)
def fresh_decorator(monkeypatch):
    monkeypatch.setattr(PipelineDecorator, "_default_queue", None)
    monkeypatch.setattr(PipelineDecorator, "_controller_here", False)
    monkeypatch.setattr(PipelineDecorator, "_steps_here", False)


def double(x):
    return 2 * x


def split(x):
    return x, -x


def test_a_component_maps_clearmls_arguments_onto_a_step(tmp_path) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("numpy==2.0  # arrays\n\npandas\n")
    one = PipelineDecorator.component(
        return_values=["data"],
        execution_queue="gpu",
        cache=True,
        retry_on_failure=2,
        packages=str(requirements),
        docker="python:3.11",
    )(double)
    assert (one.returns, one.single, one.resource, one.cache, one.retries) == (
        ("data",),
        True,
        "gpu",
        True,
        2,
    )
    assert (one.requirements, one.image) == (["numpy==2.0", "pandas"], "python:3.11")
    plain = PipelineDecorator.component(double)
    assert (plain.returns, plain.single, plain.resource) == (("return_object",), True, None)
    PipelineDecorator.set_default_execution_queue("cpu")
    assert plain.resource == "cpu" and one.resource == "gpu"
    two = PipelineDecorator.component(return_values=["a", "b"])(split)
    assert two.single is False and two(3) == (3, -3)  # outside a pipeline: a plain call
    with pytest.raises(KliqueError, match="give a number of retries"):
        PipelineDecorator.component(retry_on_failure=-1)(double)


def test_debug_pipeline_runs_every_step_here_as_a_plain_call() -> None:
    step_one = PipelineDecorator.component(return_values=["doubled"])(double)
    step_two = PipelineDecorator.component(return_values=["a", "b"])(split)

    @PipelineDecorator.pipeline(name="p", project="examples", version="1")
    def flow(x=2):
        a, b = step_two(step_one(x))
        return a - b

    PipelineDecorator.debug_pipeline()
    assert flow(3) == 12


class Ready:
    """A controller whose steps have run (no server)."""

    def run(self, until: Any = None) -> None:
        pass


def output_of(value: Any) -> Output:
    node = SimpleNamespace(step=SimpleNamespace(__name__="train"), controller=Ready())
    output = Output(node, "accuracy")  # type: ignore[arg-type]
    output.__dict__["_value"] = value
    return output


def test_a_steps_output_used_as_a_value_is_its_value() -> None:
    accuracy = output_of(0.875)
    assert 100 * accuracy == 87.5 and accuracy * 2 == 1.75 and accuracy + 1 == 1.875
    assert f"{accuracy}" == "0.875" and f"{accuracy:.1f}" == "0.9" and round(accuracy, 2) == 0.88
    assert accuracy > 0.5 and bool(accuracy) and float(accuracy) == 0.875
    rows = output_of({"rows": [1, 2, 3]})
    assert rows["rows"][1] == 2 and "rows" in rows and len(rows) == 1 and list(rows) == ["rows"]
    assert rows.keys() == {"rows": 0}.keys()  # an attribute of the value
    assert {rows: "usable as a key"}[rows] == "usable as a key"  # hashed as itself


def test_pickling_an_output_that_does_not_exist_yet_says_result() -> None:
    with pytest.raises(KliqueError, match=r"\.result\(\)"):
        pickle.dumps({"model": output_of(1)})


class Steps:
    """The server's answers about a pipeline's steps, one list per look."""

    def __init__(self, *looks: list[dict[str, Any]]) -> None:
        self.looks = list(looks)
        self.cancelled: list[str] = []

    def get(self, path: str, **query: Any) -> Any:
        assert path == "/sdk/tasks/1/steps", path
        return self.looks.pop(0)

    def post(self, path: str, body: Any = None) -> Any:
        self.cancelled.append(path)
        return {}


def controller_with(api: Steps, retries: int) -> tuple[Controller, Node]:
    task = SimpleNamespace(_api=api, id=1)
    controller = Controller(task, {"command": ["python3", "flow.py"]}, "p")  # type: ignore[arg-type]
    step = Step(double, "cpu", (), False, None, None, retries)
    node = Node(controller, step, (1,), {})
    node.task_id, node.state = 5, "queued"
    controller.nodes.append(node)
    return controller, node


def test_a_failed_step_starts_again_while_it_has_retries(capsys) -> None:
    api = Steps([{"id": 5, "state": "failed", "reason": "exited with code 1"}])
    controller, node = controller_with(api, retries=1)
    controller._follow()
    assert (node.state, node.task_id, node.tries) == ("waiting", None, 1)
    assert "step double (task 5) failed; starting it again (1 of 1)" in capsys.readouterr().err
    node.task_id, node.state = 6, "queued"
    api.looks.append([{"id": 6, "state": "failed", "reason": "exited with code 1"}])
    with pytest.raises(PipelineFailed, match=r"step double \(task 6\) failed"):
        controller._follow()


def test_a_cancelled_step_is_not_started_again() -> None:
    api = Steps([{"id": 5, "state": "cancelled", "reason": "cancelled by alice"}])
    controller, _ = controller_with(api, retries=3)
    with pytest.raises(PipelineFailed, match="cancelled"):
        controller._follow()


def make_dataset(rows):
    return list(range(rows))


TOTALS: list[int] = []


def total(data, scale):
    TOTALS.append(sum(data) * scale)
    return TOTALS[-1]


def test_a_controllers_steps_run_here_with_references_between_them() -> None:
    pipe = PipelineController(name="p", project="examples", version="1")
    pipe.add_parameter("rows", 4)
    pipe.add_function_step(
        "data", make_dataset, {"rows": "${pipeline.rows}"}, function_return=["rows"]
    )
    pipe.add_function_step(
        "sum", total, {"data": "${data.rows}", "scale": 10}, ["total"], parents=["data"]
    )
    with pytest.raises(KliqueError, match="not started"):
        pipe.wait()
    assert pipe.start_locally(run_pipeline_steps_locally=True)
    pipe.wait()
    assert TOTALS[-1] == (0 + 1 + 2 + 3) * 10


def test_a_controller_refuses_what_it_cannot_run() -> None:
    pipe = PipelineController(name="p", project="examples")
    pipe.add_function_step("data", make_dataset, {"rows": 2})
    with pytest.raises(KliqueError, match="a step 'data' already"):
        pipe.add_function_step("data", make_dataset)
    with pytest.raises(KliqueError, match=r"parent 'later' is not a step added before it"):
        pipe.add_function_step("sum", total, parents=["later"])

    def nested(x):
        return x

    with pytest.raises(KliqueError, match="top level of the script"):
        pipe.add_function_step("nested", nested)
    pipe.add_step("clone", base_task_id=7, parameter_override={"Args/lr": 0.1})
    with pytest.raises(KliqueError, match="clone of task 7: it runs on a compute resource"):
        pipe.start_locally(run_pipeline_steps_locally=True)
    controller = SimpleNamespace()
    nodes = {"data": Node(controller, Step(make_dataset, None, (), False, None, None), (), {})}  # type: ignore[arg-type]
    assert isinstance(pipe._value("${data.id}", nodes, "sum"), TaskOf)
    assert pipe._value("${data.result}", nodes, "sum").name == "result"
    with pytest.raises(KliqueError, match="step data returns result"):
        pipe._value("${data.model}", nodes, "sum")
    with pytest.raises(KliqueError, match="names no step added before it"):
        pipe._value("${gone.id}", nodes, "sum")
    assert pipe._value("$not a reference", nodes, "sum") == "$not a reference"


class Store:
    """An API that keeps what is uploaded, and serves it back."""

    def __init__(self) -> None:
        self.kept: dict[str, bytes] = {}

    def upload(self, path: str, source: io.BufferedReader, size: int) -> dict[str, Any]:
        self.kept[path.split("?")[0]] = source.read()
        return {"path": path}

    def download(self, path: str, out: io.BufferedWriter) -> None:
        out.write(self.kept[path])


def test_a_folder_is_an_artifact_and_comes_back_unpacked(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = tmp_path / "samples"
    (folder / "inner").mkdir(parents=True)
    (folder / "a.txt").write_text("a")
    (folder / "inner" / "b.txt").write_text("b")
    api = Store()
    sent = upload(api, 3, "samples", str(folder))  # type: ignore[arg-type]
    assert "kind=folder" in sent["path"] and "filename=samples.zip" in sent["path"]
    data = api.kept["/tasks/3/artifacts/samples"]
    info = {"name": "samples", "kind": "folder", "filename": "samples.zip", "size": len(data)}
    info["digest"] = hashlib.sha256(data).hexdigest()
    artifact = Artifact(api, 3, info)  # type: ignore[arg-type]
    copy = artifact.get_local_copy()
    assert copy == artifact.get() and os.path.isdir(copy)
    assert (Path(copy) / "inner" / "b.txt").read_text() == "b"


def test_added_requirements_replace_the_same_packages_found_installed(tmp_path, monkeypatch):
    monkeypatch.setattr(Task, "_added_requirements", [])
    listed = tmp_path / "requirements.txt"
    listed.write_text("scikit_learn>=1.4  # the model\n")
    Task.add_requirements("torch", "2.3.0")
    Task.add_requirements(str(listed))
    found = ["Torch==2.1.0", "numpy==2.0.0", "scikit-learn==1.3"]
    assert _with_added(found, Task._added_requirements) == [
        "numpy==2.0.0",
        "torch==2.3.0",
        "scikit_learn>=1.4",
    ]


def test_set_base_docker_takes_an_image_and_mark_completed_a_local_run_only() -> None:
    task = Task(None, 7)  # type: ignore[arg-type]
    task.set_base_docker("python:3.11-slim")
    assert task._image == "python:3.11-slim"
    task.set_base_docker(docker_image="nvcr.io/nvidia/pytorch:24.01-py3")
    assert task._image == "nvcr.io/nvidia/pytorch:24.01-py3"
    with pytest.raises(KliqueError, match="takes an image only"):
        task.set_base_docker("python:3.11 --ipc=host")
    with pytest.raises(KliqueError, match="takes an image only"):
        task.set_base_docker(docker_image="python:3.11", docker_arguments="--privileged")
    with pytest.raises(KliqueError, match="task 7 runs in a Klique job"):
        task.mark_completed()


def test_a_decorated_pipeline_runs_its_controller_where_clearml_runs_it(monkeypatch) -> None:
    went: list[str] = []
    monkeypatch.setattr(DecoratedPipeline, "remote", lambda self, *a, **k: went.append("queued"))
    monkeypatch.setattr(Pipeline, "__call__", lambda self, *a, **k: went.append("here"))
    flow = PipelineDecorator.pipeline(name="p", project="examples", default_queue="cpu")(double)
    flow(1)
    assert went == ["queued"] and PipelineDecorator._default_queue == "cpu"
    PipelineDecorator.run_locally()
    flow(1)
    assert went == ["queued", "here"]
