"""The side effects of starting a task in a container: the runtime's version, the converted image,
mount points, scratch folders, leftovers of killed runs and the cleanup after the run.
inside_job/container.py builds the commands; this module runs what must run before them."""

from __future__ import annotations

import os
import pwd
import subprocess

from inside_job import container, gpus, imageref, scratch
from inside_job.errors import SetupFailed, telling_line
from inside_job.locks import FileLock

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

    from inside_job.jobfiles import Console
    from inside_job.prepared import Prepared
    from inside_job.spec import TaskSpec

RUNNER_ARCHIVE = "klique-runner.pyz"
# Where ch-fromhost --nvidia puts the host's libcuda in an image (any of these).
_PREFIXED = ("APPTAINERENV_", "SINGULARITYENV_")
_LIB_DIRS = ("usr/lib64", "usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib")


class Launch:
    """One task's container start: what every runtime's launcher reads."""

    def __init__(
        self,
        spec: TaskSpec,
        prepared: Prepared,
        console: Console,
        grant: gpus.Grant | None,
        runtime: str,
    ) -> None:
        self.spec = spec
        self.prepared = prepared
        self.console = console
        self.runtime = runtime
        self.mounts, self.cwd = container.binds(spec.job_dir, prepared.cwd)
        self.gpu_env = gpus.task_env(grant, runtime)
        self.variables = container.task_variables(spec.env, spec.id, self.cwd, self.gpu_env)
        self.scratch = scratch.root(spec.container_scratch)
        self.image = spec.image or ""

    def reference(self, version: tuple[int, ...] | None = None) -> str:
        """The image as this runtime reads it; a local one must exist."""
        try:
            image = imageref.for_runtime(self.image, self.runtime, version)
        except imageref.ImageError as exc:
            raise SetupFailed(str(exc)) from exc
        if imageref.is_local(image) and not os.path.exists(image):
            raise SetupFailed(f"image {image} does not exist on this node; fix: check the path")
        return image


def wrap(
    spec: TaskSpec, runtime: str, prepared: Prepared, console: Console, grant: gpus.Grant | None
) -> None:
    """Turn prepared's command into the runtime's launch command (Pyxis needs none)."""
    if spec.requirements is not None or spec.requirements_file:
        raise SetupFailed(
            f"requirements with a {runtime} image are not supported: install them in the image"
        )
    ensure_runner_archive(spec.job_dir)
    launch = Launch(spec, prepared, console, grant, runtime)
    for host, _ in launch.mounts:
        if ":" in host or "," in host:
            raise SetupFailed(
                f"folder {host} holds ':' or ',', which {runtime}'s bind option cannot carry; "
                "fix: use a job_root and code folder without them"
            )
    LAUNCHERS[runtime](launch)


def ensure_runner_archive(job_dir: str) -> None:
    """Inside an image the task imports inside_job from the job's zipapp; build it if missing."""
    path = os.path.join(job_dir, RUNNER_ARCHIVE)
    if not os.path.exists(path):
        from pathlib import Path

        from inside_job import zipapp  # on its path only: every job starts the runner

        zipapp.build(Path(path))


def charliecloud(launch: Launch) -> None:
    image = launch.reference()
    inner = [path for _, path in launch.mounts]
    argv_extra: list[str] = []
    if imageref.local_kind(image) == "sqfs":
        listing = _sqfs_listing(image)
        missing = [path for path in inner if path.lstrip("/") not in listing]
        if missing:
            raise SetupFailed(
                f"image {image} lacks the mount point(s) {', '.join(missing)} and a SquashFS image "
                "cannot be changed; fix: create them in the image before mksquashfs/ch-convert"
            )
        image_env = "ch/environment" in listing
        workspace = _workspace(launch, "charliecloud")
        mount_point = os.path.join(workspace.path, "mnt")
        os.makedirs(mount_point)
        argv_extra = [f"--mount={mount_point}"]
    else:
        _mount_points(image, inner)
        image_env = os.path.isfile(os.path.join(image, "ch", "environment"))
        if launch.gpu_env.get("NVIDIA_VISIBLE_DEVICES", "void") != "void" and not _has_libcuda(
            image
        ):
            launch.console.say(
                f"image {image} has no libcuda: the task cannot use its GPUs until the site runs "
                f"`ch-fromhost --nvidia {image}`"
            )
    argv = container.charliecloud_argv(
        image, launch.prepared.argv, launch.variables, launch.mounts, launch.cwd, image_env
    )
    launch.prepared.argv = argv[:1] + argv_extra + argv[1:]
    launch.prepared.env = _launcher_env()


def apptainer(launch: Launch) -> None:
    binary = launch.runtime
    version_text = _output([binary, "--version"], f"{binary} --version")
    no_eval = container.apptainer_supports_no_eval(binary, version_text)
    container.check_names(launch.variables, binary)
    workspace = _workspace(launch, binary)
    upper = "SINGULARITY" if binary == "singularity" else "APPTAINER"
    # The host's own APPTAINERENV_* would reach the task: only the task's variables may.
    env = {k: v for k, v in _launcher_env().items() if not k.startswith(_PREFIXED)}
    env[f"{upper}_CACHEDIR"] = scratch.cache(launch.scratch, binary)
    env[f"{upper}_TMPDIR"] = workspace.path
    image = launch.reference()
    sif = image if imageref.is_local(image) else _converted(launch, image, ".sif", env)
    spec = launch.spec
    gpu = container.apptainer_gpu_flag(spec.gpus_requested, spec.container_gpus, launch.gpu_env)
    home = spec.container_home == "account"
    launch.prepared.argv = container.apptainer_argv(
        binary, sif, launch.prepared.argv, launch.mounts, launch.cwd, gpu, no_eval, home
    )
    env.update(container.apptainer_environment(binary, launch.variables, no_eval))
    launch.prepared.env = env


def enroot(launch: Launch) -> None:
    version = imageref.parse_version(_output(["enroot", "version"], "enroot version"))
    container.check_names(launch.variables, "enroot")
    env = container.enroot_launcher_env(_launcher_env(), launch.gpu_env)
    env["ENROOT_CACHE_PATH"] = scratch.cache(launch.scratch, "enroot")
    workspace = _workspace(launch, "enroot", env)
    env["ENROOT_DATA_PATH"] = os.path.join(workspace.path, "data")
    env["ENROOT_TEMP_PATH"] = workspace.path
    image = launch.reference(version)
    sqsh = image if imageref.is_local(image) else _converted(launch, image, ".sqsh", env)
    rc = os.path.join(workspace.path, "rc")
    _write_private(rc, container.enroot_rc(launch.variables, launch.cwd))
    name = f"klique-{launch.spec.id}"
    nvidia = {k: v for k, v in launch.gpu_env.items() if k.startswith("NVIDIA_")}
    create, start, remove = container.enroot_argvs(
        sqsh, name, rc, launch.prepared.argv, launch.mounts, nvidia
    )
    launch.prepared.cleanup.insert(0, lambda: _quiet(remove, env))
    _check(create, f"enroot create of {sqsh}", env)
    launch.prepared.argv = start
    launch.prepared.env = env


def _workspace(
    launch: Launch, runtime: str, env: dict[str, str] | None = None
) -> scratch.Workspace:
    """This run's folder under the scratch root, after removing what killed runs left there."""
    root = os.path.join(launch.scratch, runtime)
    removal = None
    if runtime == "enroot" and env is not None:
        removal = _enroot_removal(env)
    for path in scratch.sweep(root, removal):
        launch.console.say(f"removed {path}, left by an earlier run that was killed")
    host = "".join(c if c.isalnum() or c == "-" else "-" for c in os.uname().nodename)
    workspace = scratch.Workspace(root, f"{launch.spec.id}-{host}-{os.getpid()}")
    launch.prepared.cleanup.append(workspace.remove)
    return workspace


def _enroot_removal(env: dict[str, str]) -> Callable[[str], None]:
    """`enroot remove` for every container a dead run unpacked (it knows their modes)."""

    def remove(path: str) -> None:
        data = os.path.join(path, "data")
        names = os.listdir(data) if os.path.isdir(data) else []
        for name in names:
            _quiet(["enroot", "remove", "--force", name], dict(env, ENROOT_DATA_PATH=data))

    return remove


def _converted(launch: Launch, image: str, suffix: str, env: dict[str, str]) -> str:
    """Convert image once per cache, under a lock; later tasks reuse the file."""
    path = container.cached_image_path(launch.spec.cache(), image, suffix)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with FileLock(path + ".lock"):
        if not os.path.exists(path):
            partial = f"{path}.tmp-{os.getpid()}{suffix}"
            if launch.runtime == "enroot":
                argv = container.enroot_import_argv(partial, image)
            else:
                argv = container.apptainer_build_argv(launch.runtime, partial, image)
            try:
                _check(argv, f"pulling image {launch.image}", env)
                os.rename(partial, path)
            finally:
                scratch.remove_tree(partial)
    return path


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
                f"{exc.strerror}; fix: create {path} in the image"
            ) from exc


def _sqfs_listing(image: str) -> set[str]:
    """Every path in a SquashFS image (unsquashfs -l), without the leading folder name."""
    out = _output(["unsquashfs", "-l", "-d", "", image], f"listing {image}")
    return {line.strip().lstrip("/") for line in out.splitlines() if line.startswith("/")}


def _has_libcuda(image: str) -> bool:
    for lib_dir in _LIB_DIRS:
        try:
            names = os.listdir(os.path.join(image, lib_dir))
        except OSError:
            continue
        if any(name.startswith("libcuda.so") for name in names):
            return True
    return False


def _write_private(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, text.encode("utf-8", "surrogateescape"))
    finally:
        os.close(fd)


def _output(argv: list[str], doing: str) -> str:
    return _check(argv, doing, None)


def _check(argv: list[str], doing: str, env: dict[str, str] | None) -> str:
    try:
        result = subprocess.run(
            argv, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL, env=env
        )
    except FileNotFoundError as exc:
        raise SetupFailed(f"{argv[0]} is not installed on this node ({doing})") from exc
    if result.returncode != 0:
        said = telling_line(result.stderr + result.stdout, f"exit code {result.returncode}")
        raise SetupFailed(f"{doing} failed: {said}")
    return result.stdout


def _quiet(argv: list[str], env: dict[str, str]) -> None:
    subprocess.run(argv, capture_output=True, check=False, stdin=subprocess.DEVNULL, env=env)


def _launcher_env() -> dict[str, str]:
    env = dict(os.environ)
    if "USER" not in env:  # ch-run refuses to start without it
        env["USER"] = pwd.getpwuid(os.getuid()).pw_name
    return env


LAUNCHERS: dict[str, Callable[[Launch], None]] = {
    "charliecloud": charliecloud,
    "apptainer": apptainer,
    "singularity": apptainer,
    "enroot": enroot,
}
