"""A pipeline of three steps on two compute resources, written with ClearML's decorators.

It runs as ClearML's examples do with one change, the import line (`from clearml import
PipelineDecorator`). Each step is a task on its queue (a compute resource): `prepare` and
`evaluate` on `cpu`, `train` on `gpu`; what a step returns passes to the next one.

    python3 pipeline_from_decorator.py
"""

from klique import PipelineDecorator


@PipelineDecorator.component(return_values=["dataset"], cache=True, execution_queue="cpu")
def prepare(rows):
    print("step prepare: making", rows, "rows")
    return [(x, 3 * x + 1 + (x % 3 - 1) * 0.1) for x in range(rows)]


@PipelineDecorator.component(
    return_values=["slope", "intercept"], execution_queue="gpu", retry_on_failure=1
)
def train(dataset):
    import os

    print("step train on GPUs", os.environ.get("CUDA_VISIBLE_DEVICES"))
    n = len(dataset)
    mean_x = sum(x for x, _ in dataset) / n
    mean_y = sum(y for _, y in dataset) / n
    covariance = sum((x - mean_x) * (y - mean_y) for x, y in dataset)
    variance = sum((x - mean_x) ** 2 for x, _ in dataset)
    slope = covariance / variance
    return slope, mean_y - slope * mean_x


@PipelineDecorator.component(return_values=["accuracy"], execution_queue="cpu")
def evaluate(dataset, slope, intercept):
    print("step evaluate: slope", slope, "intercept", intercept)
    close = [abs(slope * x + intercept - y) < 0.5 for x, y in dataset]
    return sum(close) / len(close)


@PipelineDecorator.pipeline(name="pipeline demo", project="examples", version="1.0.0")
def executing_pipeline(rows=20):
    print("pipeline args:", rows)
    dataset = prepare(rows)
    slope, intercept = train(dataset)
    accuracy = 100 * evaluate(dataset, slope, intercept)
    print(f"accuracy={accuracy}%")
    print(f"slope={round(slope, 3)}")


if __name__ == "__main__":
    # the controller runs here; the steps on their queues
    PipelineDecorator.run_locally()
    executing_pipeline()
    print("process completed")
