"""What a batch template learns of a task's container: the image (checked by a strict pattern
before it may enter a script), the pool's runtime, and for Pyxis the `srun` that starts the
runner inside the image. The reference grammar and per-runtime syntax live in
inside_job/imageref.py, shared with the runner."""

from __future__ import annotations

from typing import Any

from broker.domain import Pool, Task
from broker.errors import SubmitError
from inside_job import container, imageref


def container_fields(pool: Pool, runtime: str | None, task: Task, job_dir: str) -> dict[str, Any]:
    """`image`, `container_runtime` (the pool's, or empty: what the node has) and
    `container_srun` (an argv; empty unless Pyxis)."""
    runtime = runtime or ""
    image = task.spec.image or ""
    fields: dict[str, Any] = {"image": "", "container_runtime": runtime, "container_srun": []}
    if not image:
        return fields
    try:
        fields["image"] = imageref.check(image)
        if runtime == "pyxis":
            reference = imageref.for_runtime(image, "pyxis")
            fields["container_srun"] = container.pyxis_srun_argv(reference, job_dir)
    except imageref.ImageError as exc:
        raise SubmitError(f"pool {pool.name}: {exc}") from exc
    return fields
