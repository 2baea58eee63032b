"""The side effects of starting a container: mount points, converted images, cleanup."""

from __future__ import annotations

import os
import pwd
import subprocess

from inside_job import container
from inside_job.errors import SetupFailed
from inside_job.locks import FileLock

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

    from inside_job.prepare import Prepared
    from inside_job.spec import TaskSpec

RUNNER_ARCHIVE = "klique-runner.pyz"


def ensure_runner_archive(job_dir: str) -> None:
    """Inside an image the task imports inside_job from the job's zipapp; build it if missing."""
    path = os.path.join(job_dir, RUNNER_ARCHIVE)
    if not os.path.exists(path):
        from pathlib import Path

        from inside_job import zipapp

        zipapp.build(Path(path))


def charliecloud(
    spec: TaskSpec, prepared: Prepared, mounts: list[tuple[str, str]], env: dict[str, str], cwd: str
) -> None:
    if os.path.isdir(spec.image or ""):
        _mount_points(spec.image or "", [inner for _, inner in mounts])
    prepared.argv = container.charliecloud_argv(spec.image or "", prepared.argv, env, mounts, cwd)
    prepared.env = _launcher_env()


def apptainer(
    spec: TaskSpec, prepared: Prepared, mounts: list[tuple[str, str]], env: dict[str, str], cwd: str
) -> None:
    _apptainer_family("apptainer", spec, prepared, mounts, env, cwd)


def singularity(
    spec: TaskSpec, prepared: Prepared, mounts: list[tuple[str, str]], env: dict[str, str], cwd: str
) -> None:
    _apptainer_family("singularity", spec, prepared, mounts, env, cwd)


def _apptainer_family(
    binary: str,
    spec: TaskSpec,
    prepared: Prepared,
    mounts: list[tuple[str, str]],
    env: dict[str, str],
    cwd: str,
) -> None:
    image = spec.image or ""
    sif = image if image.endswith(".sif") else _converted(spec.cache_dir, image, ".sif", binary)
    gpus = env.get("CUDA_VISIBLE_DEVICES", "x") != ""
    prepared.argv = container.apptainer_argv(binary, sif, prepared.argv, mounts, cwd, gpus)
    prepared.env = dict(_launcher_env(), **container.apptainer_environment(binary, env))


def enroot(
    spec: TaskSpec, prepared: Prepared, mounts: list[tuple[str, str]], env: dict[str, str], cwd: str
) -> None:
    image = spec.image or ""
    sqsh = (
        image if image.endswith(".sqsh") else _converted(spec.cache_dir, image, ".sqsh", "enroot")
    )
    name = f"klique-{spec.id}"
    create, start, remove = container.enroot_argvs(sqsh, name, prepared.argv, env, mounts, cwd)
    _check(create, f"enroot create of {sqsh}")
    prepared.argv = start
    prepared.env = _launcher_env()
    prepared.cleanup.append(remove)


def _mount_points(image: str, inner: list[str]) -> None:
    for path in inner:
        target = os.path.join(image, path.lstrip("/"))
        if os.path.isdir(target):
            continue
        try:
            os.makedirs(target)
        except OSError as exc:
            raise SetupFailed(
                f"image {image} lacks the mount point {path} and cannot be changed: "
                f"{exc.strerror}; create {path} in the image"
            ) from exc


def _converted(cache_dir: str, image: str, suffix: str, binary: str) -> str:
    """Convert image once per node or shared cache, under a lock; later tasks reuse the file."""
    path = container.cached_image_path(cache_dir, image, suffix)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with FileLock(path + ".lock"):
        if not os.path.exists(path):
            partial = f"{path}.tmp-{os.getpid()}{suffix}"
            if binary == "enroot":
                argv = container.enroot_import_argv(partial, image)
            else:
                argv = container.apptainer_build_argv(binary, partial, image)
            _check(argv, f"converting {image}")
            os.rename(partial, path)
    return path


def _check(argv: list[str], doing: str) -> None:
    try:
        result = subprocess.run(
            argv, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL
        )
    except FileNotFoundError as exc:
        raise SetupFailed(f"{argv[0]} is not installed on this node ({doing})") from exc
    if result.returncode != 0:
        lines = (result.stderr + result.stdout).strip().splitlines()
        raise SetupFailed(f"{doing} failed: {lines[-1] if lines else result.returncode}")


def _launcher_env() -> dict[str, str]:
    env = dict(os.environ)
    if "USER" not in env:  # ch-run refuses to start without it
        env["USER"] = pwd.getpwuid(os.getuid()).pw_name
    return env


LAUNCHERS: dict[
    str, Callable[[TaskSpec, Prepared, list[tuple[str, str]], dict[str, str], str], None]
] = {
    "charliecloud": charliecloud,
    "apptainer": apptainer,
    "singularity": singularity,
    "enroot": enroot,
}
