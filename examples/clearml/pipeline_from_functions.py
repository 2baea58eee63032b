"""A step that reads another task's artifact, in a pipeline written with ClearML's
PipelineController (`from clearml import PipelineController, Task`).

`make_dataset` uploads a table, a folder of samples and a numpy-free summary object as its
artifacts; `process` is given its task id (`${make_dataset.id}`), finds it with
`Task.get_task` and reads them with `.get()` and `.get_local_copy()`.

    python3 pipeline_from_functions.py
"""

from klique import PipelineController, Task


def make_dataset(rows):
    import os
    import tempfile

    task = Task.current_task()
    table = [{"x": x, "y": x * x} for x in range(rows)]
    task.upload_artifact("dataset", artifact_object=table, metadata={"rows": rows})
    samples = tempfile.mkdtemp()
    for x in range(3):
        with open(os.path.join(samples, f"sample-{x}.txt"), "w") as f:
            f.write(f"{x},{x * x}\n")
    task.upload_artifact("samples", artifact_object=samples)
    print("uploaded", rows, "rows and 3 samples")


def process(dataset_task_id, scale):
    import os

    source = Task.get_task(task_id=dataset_task_id)
    table = source.artifacts["dataset"].get()
    folder = source.artifacts["samples"].get_local_copy()
    samples = sorted(os.listdir(folder))
    total = sum(row["y"] for row in table) * scale
    Task.current_task().get_logger().report_table(
        "dataset", "head", iteration=0, table_plot=table[:5]
    )
    print(f"read {len(table)} rows and {len(samples)} samples from task {dataset_task_id}")
    return {"rows": len(table), "samples": samples, "total": total}


if __name__ == "__main__":
    pipe = PipelineController(name="data processing", project="examples", version="1.0.0")
    pipe.add_parameter("rows", 10)
    pipe.set_default_execution_queue("cpu")
    pipe.add_function_step(
        name="make_dataset",
        function=make_dataset,
        function_kwargs={"rows": "${pipeline.rows}"},
        function_return=[],
    )
    pipe.add_function_step(
        name="process",
        function=process,
        function_kwargs={"dataset_task_id": "${make_dataset.id}", "scale": 2},
        function_return=["summary"],
        parents=["make_dataset"],
        cache_executed_step=False,
    )
    pipe.start_locally()
    pipe.wait()
    print("process completed")
