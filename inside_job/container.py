"""Container runtimes as argv and text, without side effects (inside_job/launch.py does those).

Which versions each builder follows:
- Charliecloud 0.26 and later (ch-run(1), "Environment variables"): --unset-env, a bare
  --set-env for the image's /ch/environment, --env-no-expand, --set-env=NAME='VALUE'.
- Apptainer 1.0 and later, SingularityCE 3.6 and later (user guide "Environment and Metadata"):
  exec --cleanenv with APPTAINERENV_/SINGULARITYENV_ variables; --no-eval from Apptainer 1.1 and
  SingularityCE 3.10; older versions get values escaped for their double-quoted export.
- enroot 3.0 and later (doc/cmd/start.md, doc/configuration.md, conf/hooks): create, start with
  --rc, --mount and --env, remove; the image reference by version (inside_job/imageref.py).
- Pyxis 0.8 and later (README, args.c): srun --container-image, --container-mounts,
  --container-workdir, --no-container-entrypoint.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil

from inside_job.errors import SetupFailed
from inside_job.imageref import RUNTIMES, ImageError, is_local, local_kind

JOB_MOUNT = "/klique/job"
WORK_MOUNT = "/klique/work"
# Docker's default PATH: what an image without its own PATH runs with.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Under the image's own environment: only where the image sets nothing else.
BASE_VARIABLES = {"PATH": DEFAULT_PATH, "HOME": "/tmp", "LANG": "C.UTF-8"}
_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BINARIES = {
    "charliecloud": "ch-run",
    "apptainer": "apptainer",
    "singularity": "singularity",
    "enroot": "enroot",
    "pyxis": "srun",
}


def choose_runtime(image: str, configured: str | None) -> str:
    """The configured runtime, else one that fits the image and is installed."""
    if configured is not None:
        if configured not in RUNTIMES:
            raise SetupFailed(f"runtime {configured!r} is unknown (one of {', '.join(RUNTIMES)})")
        return configured
    kind = local_kind(image) if is_local(image) else "registry"
    wanted = {
        "dir": ("charliecloud", "apptainer", "singularity"),
        "sqfs": ("charliecloud",),
        "sqsh": ("enroot",),
        "sif": ("apptainer", "singularity"),
        "registry": ("apptainer", "singularity", "enroot"),
    }[kind]
    for runtime in wanted:
        if shutil.which(_BINARIES[runtime]):
            return runtime
    raise SetupFailed(f"no container runtime for {image} on this node (tried {', '.join(wanted)})")


def task_variables(
    spec_env: dict[str, str], task_id: str, inner_cwd: str, gpu_env: dict[str, str]
) -> dict[str, str]:
    """What the task gets on top of the image's own environment: its env, then Klique's."""
    env = dict(spec_env)
    env["KLIQUE_TASK_ID"] = task_id
    env["KLIQUE_JOB_DIR"] = JOB_MOUNT
    env["PYTHONUNBUFFERED"] = "1"
    runner = f"{JOB_MOUNT}/klique-runner.pyz"
    env["PYTHONPATH"] = f"{runner}:{spec_env['PYTHONPATH']}" if "PYTHONPATH" in spec_env else runner
    env["PWD"] = inner_cwd
    env.update(gpu_env)
    return env


def check_names(env: dict[str, str], runtime: str) -> None:
    """Runtimes that set variables through a shell take only shell names."""
    for name in sorted(env):
        if not _SHELL_NAME.fullmatch(name):
            raise SetupFailed(
                f"environment variable {name!r} cannot be passed into a {runtime} container "
                "(a name is letters, digits and _, not starting with a digit); fix: rename it"
            )


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
    image: str,
    command: list[str],
    env: dict[str, str],
    mounts: list[tuple[str, str]],
    cwd: str,
    image_environment: bool,
) -> list[str]:
    """ch-run from an emptied environment: Klique's defaults, then the image's /ch/environment
    (a bare --set-env, where the image has one), then the task's variables.

    ch-run strips one pair of single quotes around a --set-env value, so every value is wrapped
    in one; --env-no-expand keeps `$NAME` items as they are.
    """
    argv = ["ch-run", "--unset-env=*", "--env-no-expand"]
    argv += [f"--set-env={name}='{value}'" for name, value in BASE_VARIABLES.items()]
    if image_environment:
        argv.append("--set-env")
    argv += [f"--set-env={name}='{value}'" for name, value in sorted(env.items())]
    for host, inner in mounts:
        argv += ["-b", f"{host}:{inner}"]
    return [*argv, "-c", cwd, image, "--", *command]


def apptainer_argv(
    binary: str,
    sif: str,
    command: list[str],
    mounts: list[tuple[str, str]],
    cwd: str,
    gpu_flag: str | None,
    no_eval: bool,
    home: bool = False,
) -> list[str]:
    """apptainer|singularity exec --cleanenv [--no-eval] [--no-home]; variables travel as
    APPTAINERENV_*. Apptainer mounts the account's home by default, and Python then finds
    ~/.local's site-packages: unless the pool keeps it (`container_home: account`), --no-home."""
    argv = [binary, "exec", "--cleanenv"] + (["--no-eval"] if no_eval else [])
    argv += [] if home else ["--no-home"]
    argv += [gpu_flag] if gpu_flag else []
    for host, inner in mounts:
        argv += ["--bind", f"{host}:{inner}"]
    return [*argv, "--pwd", cwd, sif, *command]


def apptainer_gpu_flag(requested: bool, vendor: str, gpu_env: dict[str, str]) -> str | None:
    """--nv or --rocm (the driver libraries) when the task's compute resource asks for GPUs, or
    the scheduler named some (a host pool's grant): a site that sets no CUDA variable in its
    jobs still gets the libraries for the GPUs it granted."""
    if requested or gpu_env.get("CUDA_VISIBLE_DEVICES", "") != "":
        return "--rocm" if vendor == "rocm" else "--nv"
    return None


def apptainer_environment(binary: str, env: dict[str, str], no_eval: bool) -> dict[str, str]:
    """The task's variables as APPTAINERENV_* (SINGULARITYENV_* for singularity).

    Apptainer writes each as `export NAME="VALUE"` with only `"` escaped, and sources it: without
    --no-eval, `\\`, `$` and backquotes are escaped here so the evaluation gives the value back.
    """
    prefix = "SINGULARITYENV_" if os.path.basename(binary) == "singularity" else "APPTAINERENV_"
    if no_eval:
        return {prefix + name: value for name, value in env.items()}
    return {prefix + name: _escape_for_double_quotes(value) for name, value in env.items()}


def _escape_for_double_quotes(value: str) -> str:
    return value.replace("\\", "\\\\").replace("$", "\\$").replace("`", "\\`")


def apptainer_supports_no_eval(binary: str, version_text: str) -> bool:
    """--no-eval: Apptainer 1.1+, SingularityCE 3.10+ (`singularity-ce version 3.10.0`)."""
    from inside_job.imageref import parse_version  # on its path only: every job starts the runner

    version = parse_version(version_text)
    if version is None:
        return False
    if "apptainer" in version_text or os.path.basename(binary) == "apptainer":
        return version >= (1, 1)
    return version >= (3, 10)


def apptainer_build_argv(binary: str, sif: str, image: str) -> list[str]:
    return [binary, "build", sif, image]


def enroot_rc(env: dict[str, str], cwd: str) -> str:
    """The command script that replaces the image's /etc/rc (`enroot start --rc`): it skips the
    image's entrypoint as Pyxis does (`exec "$@"`), sets the task's variables byte for byte
    (enroot's own --env goes through a line-based file), and enters the task's folder."""
    lines = ["# Klique: run the task's command as it is, not through the image's entrypoint."]
    for name, default in BASE_VARIABLES.items():
        lines.append(f': "${{{name}:={default}}}"; export {name}')
    lines += [f"export {name}={shlex.quote(value)}" for name, value in sorted(env.items())]
    lines += [f"cd {shlex.quote(cwd)} || exit 125", 'exec "$@"', ""]
    return "\n".join(lines)


def enroot_argvs(
    sqsh: str,
    name: str,
    rc: str,
    command: list[str],
    mounts: list[tuple[str, str]],
    nvidia_env: dict[str, str],
) -> tuple[list[str], list[str], list[str]]:
    """(create, start, remove) for one task's enroot container made from a squashfs image."""
    create = ["enroot", "create", "--name", name, sqsh]
    start = ["enroot", "start", "--rc", rc]
    for host, inner in mounts:
        start += ["--mount", f"{host}:{inner}:none:x-create=dir,bind"]
    start += [arg for item in sorted(nvidia_env.items()) for arg in ("--env", "=".join(item))]
    start += [name, *command]
    return create, start, ["enroot", "remove", "--force", name]


def enroot_launcher_env(host_env: dict[str, str], gpu_env: dict[str, str]) -> dict[str, str]:
    """enroot's own environment. Its 98-nvidia.sh hook takes NVIDIA_* from here before the
    container's, so the grant replaces the host's; ENROOT_RESTRICT_DEV keeps /dev to the devices
    the hook adds; no login shell, whose /etc/profile would reset the image's PATH."""
    env = {k: v for k, v in host_env.items() if not k.startswith("NVIDIA_")}
    env.update({k: v for k, v in gpu_env.items() if k.startswith("NVIDIA_")})
    env["ENROOT_RESTRICT_DEV"] = "y"
    env["ENROOT_LOGIN_SHELL"] = "n"
    return env


def enroot_import_argv(sqsh: str, image: str) -> list[str]:
    return ["enroot", "import", "--output", sqsh, image]


def pyxis_srun_argv(image: str, job_dir: str) -> list[str]:
    """The `srun` argv that starts the runner inside the image, for a Slurm batch template.

    The job directory keeps its path inside, so task.json needs no translation.
    """
    if "," in job_dir or ":" in job_dir:
        raise ImageError(
            f"job folder {job_dir} holds ',' or ':', which Pyxis's --container-mounts cannot "
            "carry; fix: choose a job_root without them"
        )
    return [
        "srun",
        "--ntasks=1",
        f"--container-image={image}",
        f"--container-mounts={job_dir}:{job_dir}",
        f"--container-workdir={job_dir}",
        "--no-container-entrypoint",
        "--export=ALL",  # the batch script's environment (itself sbatch's --export list)
    ]


def cached_image_path(cache_dir: str, image: str, suffix: str) -> str:
    """Where a converted image lives: named by the reference's digest when it pins one."""
    _, at, digest = image.partition("@sha256:")
    name = digest if at else hashlib.sha256(image.encode("utf-8")).hexdigest()
    return os.path.join(cache_dir, "images", f"{name[:32]}{suffix}")
