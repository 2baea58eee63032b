"""Container runtimes: Charliecloud (run in the tests here); Apptainer, Singularity, enroot and
Pyxis, whose argv is unit-tested but has not run against a live binary here."""

from __future__ import annotations

import hashlib
import os
import shutil

from inside_job.errors import SetupFailed

TYPE_CHECKING = False
if TYPE_CHECKING:
    from inside_job.prepare import Prepared
    from inside_job.spec import TaskSpec

RUNTIMES = ("charliecloud", "apptainer", "singularity", "enroot", "pyxis")
JOB_MOUNT = "/klique/job"
WORK_MOUNT = "/klique/work"
CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_GPU_VARIABLES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")


def choose_runtime(image: str, configured: str | None) -> str:
    """The configured runtime, else one that fits the image and is installed."""
    if configured is not None:
        if configured not in RUNTIMES:
            raise SetupFailed(f"runtime {configured!r} is unknown (one of {', '.join(RUNTIMES)})")
        return configured
    if os.path.isdir(image) or image.endswith(".sqfs"):
        wanted: tuple[str, ...] = ("charliecloud",)
    elif image.endswith(".sqsh"):
        wanted = ("enroot",)
    elif image.endswith(".sif"):
        wanted = ("apptainer", "singularity")
    else:
        wanted = ("apptainer", "singularity", "enroot")
    for runtime in wanted:
        if shutil.which(_BINARIES[runtime]):
            return runtime
    raise SetupFailed(f"no container runtime for {image} on this node (tried {', '.join(wanted)})")


def inner_environment(spec: TaskSpec, host_env: dict[str, str], inner_cwd: str) -> dict[str, str]:
    """The task's clean environment inside the image: its env, Klique's variables, its GPUs."""
    env = {"PATH": CONTAINER_PATH, "HOME": "/tmp", "LANG": "C.UTF-8"}
    env.update(spec.env)
    env["KLIQUE_TASK_ID"] = spec.id
    env["KLIQUE_JOB_DIR"] = JOB_MOUNT
    env["PYTHONUNBUFFERED"] = "1"
    runner = f"{JOB_MOUNT}/klique-runner.pyz"
    env["PYTHONPATH"] = f"{runner}:{spec.env['PYTHONPATH']}" if "PYTHONPATH" in spec.env else runner
    env["PWD"] = inner_cwd
    for name in _GPU_VARIABLES:
        if name in host_env:
            env[name] = host_env[name]
    return env


def binds(job_dir: str, cwd: str) -> tuple[list[tuple[str, str]], str]:
    """(host, container) folders to bind, and the task's working folder inside.

    The job directory is /klique/job inside; a code folder outside it is /klique/work.
    """
    pairs = [(job_dir, JOB_MOUNT)]
    if cwd == job_dir or cwd.startswith(job_dir + os.sep):
        return pairs, JOB_MOUNT + cwd[len(job_dir) :]
    pairs.append((cwd, WORK_MOUNT))
    return pairs, WORK_MOUNT


def charliecloud_argv(
    image: str, command: list[str], env: dict[str, str], mounts: list[tuple[str, str]], cwd: str
) -> list[str]:
    """ch-run with an emptied environment (--unset-env='*') and only the task's variables set."""
    argv = ["ch-run", "--unset-env=*", "--env-no-expand"]
    argv += [f"--set-env={name}={value}" for name, value in sorted(env.items())]
    for host, inner in mounts:
        argv += ["-b", f"{host}:{inner}"]
    return [*argv, "-c", cwd, image, "--", *command]


def apptainer_argv(
    binary: str, sif: str, command: list[str], mounts: list[tuple[str, str]], cwd: str, gpus: bool
) -> list[str]:
    """apptainer|singularity exec --cleanenv; variables travel as APPTAINERENV_* (see below)."""
    argv = [binary, "exec", "--cleanenv"] + (["--nv"] if gpus else [])
    for host, inner in mounts:
        argv += ["--bind", f"{host}:{inner}"]
    return [*argv, "--pwd", cwd, sif, *command]


def apptainer_environment(binary: str, env: dict[str, str]) -> dict[str, str]:
    """Variables that reach the task through --cleanenv, verbatim (no quoting involved)."""
    prefix = "SINGULARITYENV_" if os.path.basename(binary) == "singularity" else "APPTAINERENV_"
    return {prefix + name: value for name, value in env.items()}


def apptainer_build_argv(binary: str, sif: str, image: str) -> list[str]:
    return [binary, "build", sif, image]


def enroot_argvs(
    sqsh: str,
    name: str,
    command: list[str],
    env: dict[str, str],
    mounts: list[tuple[str, str]],
    cwd: str,
) -> tuple[list[str], list[str], list[str]]:
    """(create, start, remove) for one task's enroot container made from a squashfs image."""
    create = ["enroot", "create", "--force", "--name", name, sqsh]
    start = ["enroot", "start"]
    for host, inner in mounts:
        start += ["--mount", f"{host}:{inner}"]
    start += [arg for item in sorted(env.items()) for arg in ("--env", "=".join(item))]
    # enroot start has no working-directory option; the folder and argv pass as arguments.
    start += [name, "/bin/sh", "-c", 'cd "$0" && exec "$@"', cwd, *command]
    return create, start, ["enroot", "remove", "--force", name]


def enroot_import_argv(sqsh: str, image: str) -> list[str]:
    return ["enroot", "import", "--output", sqsh, image]


def pyxis_srun_prefix(image: str, job_dir: str, extra_mounts: tuple[str, ...] = ()) -> list[str]:
    """The `srun` argv prefix for a batch template: the runner itself starts inside the image.

    The job directory keeps its path inside, so task.json needs no translation.
    """
    mounts = [job_dir, *extra_mounts]
    if any("," in m or ":" in m for m in mounts):
        raise ValueError("Pyxis mounts cannot contain ',' or ':'")
    return [
        "srun",
        "--ntasks=1",
        f"--container-image={image}",
        "--container-mounts=" + ",".join(f"{m}:{m}" for m in mounts),
        f"--container-workdir={job_dir}",
    ]


def cached_image_path(cache_dir: str, image: str, suffix: str) -> str:
    """Where a converted image lives: named by the reference's digest when it pins one."""
    _, at, digest = image.partition("@sha256:")
    name = digest if at else hashlib.sha256(image.encode("utf-8")).hexdigest()
    return os.path.join(cache_dir, "images", f"{name[:32]}{suffix}")


_BINARIES = {
    "charliecloud": "ch-run",
    "apptainer": "apptainer",
    "singularity": "singularity",
    "enroot": "enroot",
    "pyxis": "srun",
}


def wrap(spec: TaskSpec, runtime: str, prepared: Prepared) -> None:
    """Turn prepared's command into the runtime's launch command (pyxis needs none)."""
    from inside_job import launch

    if spec.requirements is not None or spec.requirements_file:
        raise SetupFailed(
            f"requirements with a {runtime} image are not supported: install them in the image"
        )
    launch.ensure_runner_archive(spec.job_dir)
    mounts, inner_cwd = binds(spec.job_dir, prepared.cwd)
    inner = inner_environment(spec, prepared.env, inner_cwd)
    launch.LAUNCHERS[runtime](spec, prepared, mounts, inner, inner_cwd)
