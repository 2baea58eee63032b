"""Everything between task.json and starting the command: code, environment, GPUs, image."""

from __future__ import annotations

import contextlib
import os

from inside_job import gpus
from inside_job.prepared import AppRun, Prepared

TYPE_CHECKING = False
if TYPE_CHECKING:
    from inside_job.jobfiles import Console
    from inside_job.spec import TaskSpec

# Set by the Slurm template on the srun that starts the runner inside a Pyxis container.
PYXIS_MARKER = "KLIQUE_CONTAINER"
# Where the inside_job package is importable from: the zipapp, or the folder holding the package.
RUNNER_PATH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def prepare(spec: TaskSpec, console: Console) -> Prepared:
    cwd = _code(spec, console)
    venv = None
    prepared = Prepared(list(spec.command), {}, cwd)
    if spec.requirements is not None or spec.requirements_file:
        from inside_job import envbuild  # on its path only: every job starts the runner

        handle = envbuild.provide(spec, cwd, console)
        venv, prepared.env_lock, prepared.env_info = handle.path, handle.lock, handle.report()
    runtime = _runtime(spec)
    grant = gpus.grant(spec.scheduler, spec.gpus, dict(os.environ))
    if runtime == "pyxis":
        _check_inside_pyxis(spec)
    prepared.env = task_environment(spec, venv, grant, runtime)
    if spec.place is not None:
        prepared.env.update(spec.place.env())
    if spec.app is not None:
        if spec.app.models:
            from inside_job import models  # on its path only: apps that serve a registry model

            models.stage(spec, prepared, console)
        prepared.app = app_run(spec, prepared)
    if runtime is not None and runtime != "pyxis":
        from inside_job import launch  # on its path only: every job starts the runner

        try:
            launch.wrap(spec, runtime, prepared, console, grant)
        except BaseException:
            clean_up(prepared)
            raise
    return prepared


def app_run(spec: TaskSpec, prepared: Prepared) -> AppRun:
    """A free port on the node and a secret for this run, put where the app's definition says:
    `{port}` in the command and env, `{secret}` in env and the route's upstream headers only
    (never on the command line, which other accounts on the node can read)."""
    import secrets
    import socket

    assert spec.app is not None
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    secret = secrets.token_urlsafe(32)

    def fill(text: str) -> str:
        return text.replace("{port}", port).replace("{secret}", secret)

    prepared.argv = [arg.replace("{port}", port) for arg in prepared.argv]
    prepared.env.update({k: fill(v) for k, v in spec.app.env.items()})
    prepared.env["KLIQUE_APP_PORT"] = port
    headers = {k: fill(v) for k, v in spec.app.upstream_headers.items()}
    return AppRun(int(port), headers, fill(spec.app.ready_path))


def clean_up(prepared: Prepared) -> None:
    """Release the environment and undo what starting the container made, in order."""
    if prepared.env_lock is not None:
        prepared.env_lock.close()
        prepared.env_lock = None
    while prepared.cleanup:
        undo = prepared.cleanup.pop(0)
        with contextlib.suppress(Exception):  # one failed removal must not keep the others
            undo()


def _check_inside_pyxis(spec: TaskSpec) -> None:
    """Pyxis starts the runner itself inside the image; a runner on the host must not run the
    task there as if it were (templates/slurm/default.sh.j2 sets the marker on its srun)."""
    if os.environ.get(PYXIS_MARKER) != "pyxis":
        from inside_job.errors import SetupFailed  # on its path only: every job starts the runner

        raise SetupFailed(
            f"runtime pyxis, but the runner was not started inside the image {spec.image}: the "
            "batch template must start it with `srun --container-image=...` "
            f"and {PYXIS_MARKER}=pyxis (see templates/README.md)"
        )


def task_environment(
    spec: TaskSpec, venv: str | None, grant: gpus.Grant | None, runtime: str | None
) -> dict[str, str]:
    """The runner's environment, then the task's env, then what Klique guarantees."""
    env = dict(os.environ)
    env.update(spec.env)
    env.pop("PYTHONHOME", None)
    env["KLIQUE_TASK_ID"] = spec.id
    env["KLIQUE_JOB_DIR"] = spec.job_dir
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = _join_path(RUNNER_PATH, env.get("PYTHONPATH"))
    if venv is not None:
        env["VIRTUAL_ENV"] = venv
        env["PATH"] = _join_path(os.path.join(venv, "bin"), env.get("PATH", os.defpath))
    env.update(gpus.task_env(grant, runtime))
    if spec.gpu_memory_limit_mb is not None:  # after the task's env: the task cannot lift it
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={spec.gpu_memory_limit_mb}M"
    return env


def _code(spec: TaskSpec, console: Console) -> str:
    if spec.code is None:
        return spec.job_dir
    from inside_job import code  # on its path only: every job starts the runner

    mirrors = spec.cache() if spec.code.workdir is None else ""
    if spec.place is not None and spec.place.rank:
        name = f"{code.CLONE_DIR}.rank{spec.place.rank}"
        return code.materialise(spec.code, spec.job_dir, mirrors, console, name)
    return code.materialise(spec.code, spec.job_dir, mirrors, console)


def _runtime(spec: TaskSpec) -> str | None:
    if spec.image is None:
        return None
    from inside_job import container  # on its path only: every job starts the runner

    return container.choose_runtime(spec.image, spec.runtime)


def _join_path(first: str, rest: str | None) -> str:
    return f"{first}:{rest}" if rest else first
