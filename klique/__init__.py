"""The researcher's SDK: track a run, send it to a compute resource, chain runs into pipelines.

    import klique
    task = klique.Task.init(project="AI Engineering", name="train")
    params = task.connect({"lr": 0.1, "epochs": 3})
    task.execute_remotely(resource="1-gpu")      # stops here; the job goes on from Task.init
    task.log.scalar("loss", 0.3, step=10)
    task.upload_artifact("model", "model.pt")
    task.register_model("resnet", "model.pt")   # klique.Model.get("resnet", stage="production")
    klique.Dataset.get(dataset_name="images").get_local_copy()   # once per node

Standard library only (Python 3.8+): it runs inside every job, shipped in the runner."""

from klique._api import KliqueError
from klique.artifacts import Artifact, File
from klique.datasets import Dataset
from klique.models import Model
from klique.output_model import OutputModel
from klique.pipeline import PipelineFailed, pipeline, step
from klique.pipeline_clearml import PipelineController, PipelineDecorator
from klique.sweep import Sweep, sweep
from klique.task import Task
from klique.tune import Tuning, tune

__all__ = [
    "Artifact",
    "Dataset",
    "File",
    "KliqueError",
    "Model",
    "OutputModel",
    "PipelineController",
    "PipelineDecorator",
    "PipelineFailed",
    "Sweep",
    "Task",
    "Tuning",
    "pipeline",
    "step",
    "sweep",
    "tune",
]
