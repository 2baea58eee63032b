"""ClearML's PipelineController two ways: `clone BASE` runs here a clone of task BASE (n=5)
and a function step that reads the clone's artifact through Task.get_task; `queued` sends
the controller to `cpu` (start(queue=)), where it runs two function steps."""

import sys

from klique import PipelineController, Task


def read(task_id):
    return Task.get_task(task_id=task_id).artifacts["out"].get() + 1


def one(x):
    return x + 1


def two(y):
    return y * 10


if __name__ == "__main__":
    if sys.argv[1] == "clone":
        pipe = PipelineController(name="clone step", project="examples")
        pipe.add_step("again", base_task_id=int(sys.argv[2]), parameter_override={"n": 5})
        pipe.add_function_step(
            "read",
            read,
            {"task_id": "${again.id}"},
            ["v"],
            parents=["again"],
            execution_queue="cpu",
        )
        pipe.start_locally()
    else:
        pipe = PipelineController(name="queued controller", project="examples")
        pipe.add_function_step("one", one, {"x": 1}, ["y"], execution_queue="cpu")
        pipe.add_function_step("two", two, {"y": "${one.y}"}, ["z"], retry_on_failure=1)
        pipe.set_default_execution_queue("gpu")
        pipe.start(queue="cpu")
        print("the controller went on here")
