"""A task to clone as a pipeline's step (ClearML's add_step): its parameter `n` doubled is its
artifact `out`."""

from klique import Task

task = Task.init(project_name="examples", task_name="base")
args = task.connect({"n": 1})
task.execute_remotely(queue_name="cpu")
task.upload_artifact("out", artifact_object=args["n"] * 2)
