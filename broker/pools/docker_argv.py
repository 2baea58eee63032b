"""The argv of a docker-mode host pool's runtime commands (`podman run`, `ps`, `inspect`, `stop`),
built without I/O from validated values only, and the reading of their answers; the driver
(broker/pools/host_docker.py) runs them. Podman and Docker agree on every option used here
(docs.podman.io podman-run(1), Docker's `docker run` reference) but two: GPUs and walltime."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from broker.domain import Task
from broker.errors import NotPermitted
from broker.pools import kube_pod
from broker.pools.docker_args import Limits, limit_args, task_label, userns_args, volume

RUNNER_PATH = f"{kube_pod.RUNNER_MOUNT}/{kube_pod.RUNNER_FILE}"
LABEL_TASK = kube_pod.LABEL_TASK
LABEL_POOL = kube_pod.LABEL_POOL
LABEL_INSTALLATION = kube_pod.LABEL_INSTALLATION


@dataclass(frozen=True)
class ContainerRun:
    """Everything a task's container is started from: validated values only."""

    runtime: str  # "podman" or "docker"
    binary: str
    name: str
    task_id: int
    pool: str
    image: str
    python: str  # the image's interpreter
    job_dir: str
    runner: str  # the runner zipapp on the host
    uid: int
    gid: int
    walltime_s: int
    gpu_ids: tuple[int, ...] = ()
    gpu_kind: str = "nvidia.com/gpu"
    run_args: tuple[str, ...] = ()
    limits: Limits | None = None
    keep_id: bool = False  # rootless podman: the account's uid inside is its own
    relabel: bool = False  # SELinux enforces: relabel the mounts
    installation: str = ""


def run_argv(run: ContainerRun) -> list[str]:
    """`podman run` (or `docker run`) for one task, detached: it returns once started."""
    if run.uid == 0 or run.gid == 0:
        raise NotPermitted(f"task {run.task_id}: Klique never runs a container as root")
    argv = [run.binary, "run", "--detach", "--pull=never", f"--name={run.name}"]
    argv += [f"--label={LABEL_TASK}={run.task_id}", f"--label={LABEL_POOL}={run.pool}"]
    if run.installation:
        argv.append(f"--label={LABEL_INSTALLATION}={run.installation}")
    argv += [f"--user={run.uid}:{run.gid}", "--security-opt=no-new-privileges", "--cap-drop=all"]
    argv += userns_args(run.runtime, run.keep_id)
    argv += limit_args(run.limits)
    mount = mount_folder(run.job_dir)
    argv.append(
        volume(run.runner, RUNNER_PATH, read_only=True, relabel="z" if run.relabel else None)
    )
    argv.append(volume(mount, mount, read_only=False, relabel="Z" if run.relabel else None))
    argv += [f"--workdir={run.job_dir}", f"--env=HOME={run.job_dir}", "--env=PYTHONUNBUFFERED=1"]
    argv += gpu_args(run.runtime, run.gpu_kind, run.gpu_ids)
    if run.runtime == "podman":
        argv.append(f"--timeout={run.walltime_s}")
    argv += [*run.run_args, run.image, run.python, RUNNER_PATH, run.job_dir]
    return argv


def gpu_args(runtime: str, kind: str, gpu_ids: Sequence[int]) -> list[str]:
    """The GPUs placement gave the task, as the runtime names them."""
    if not gpu_ids:
        return []
    if runtime == "podman":
        return [f"--device={kind}={n}" for n in gpu_ids]
    # Docker reads --gpus as CSV: a list of devices is quoted inside the value.
    return ["--gpus", '"device=' + ",".join(str(n) for n in gpu_ids) + '"']


def list_argv(binary: str, pool: str) -> list[str]:
    """The names of this pool's running containers, one a line."""
    label = f"--filter=label={LABEL_POOL}={pool}"
    return [binary, "ps", label, "--filter=status=running", "--format={{.Names}}"]


def owned_argv(runtime: str, binary: str, pool: str, installation: str) -> list[str]:
    """Every container of this pool and installation, running or not: `NAME TASK` a line.
    Podman's template reads a label by index; Docker's has `.Label`."""
    task = f'index .Labels "{LABEL_TASK}"' if runtime == "podman" else f'.Label "{LABEL_TASK}"'
    argv = [binary, "ps", "--all", f"--filter=label={LABEL_POOL}={pool}"]
    argv += [f"--filter=label={LABEL_INSTALLATION}={installation}"]
    return argv + [f"--format={{{{.Names}}}} {{{{{task}}}}}"]


def inspect_argv(binary: str, name: str) -> list[str]:
    """Whether the kernel's OOM killer ended the container, and its exit code."""
    return [binary, "inspect", "--format={{.State.OOMKilled}} {{.State.ExitCode}}", name]


def parse_owned(out: str) -> dict[str, int | None]:
    """`owned_argv`'s answer: container name -> its task id (None: no readable label)."""
    listed: dict[str, int | None] = {}
    for line in out.splitlines():
        name, _, task = line.strip().partition(" ")
        if name:
            listed[name] = task_label(task)
    return listed


def stop_argv(binary: str, name: str, grace_s: int) -> list[str]:
    """SIGTERM (the runner forwards it to the task), SIGKILL after grace_s seconds."""
    return [binary, "stop", f"--time={grace_s}", name]


def container_name(task: Task) -> str:
    """The attempt's folder's name (klique-<task>-<attempt>-<random>): the attempt's own."""
    return mount_folder(str(task.job_dir)).rsplit("/", 1)[-1]


def mount_folder(job_dir: str) -> str:
    """The folder a task's container mounts: the one that holds its job folder."""
    return job_dir.rstrip("/").rsplit("/", 1)[0]
