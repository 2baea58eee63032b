"""Docker mode of a host pool (`mode: docker`): each task's runner runs inside the task's image,
in a container that podman (or Docker) starts with the uid and gid of the task's mapped account.

The container's argv is built here without I/O (`run_argv`), from validated values only: the
checked image reference, numbers, the job folder Klique chose and the pool's checked
`run_args`. The container gets two mounts, the runner zipapp (read-only) and the attempt's
folder, which holds the job folder (both at their own paths, so task.json's paths hold inside).
The server makes the attempt's folder, fresh, in the sticky job root; run as root it is root's
(see `make_mount_folder`), so the account cannot swap the path podman resolves as root for a
link elsewhere: what the account does inside it is resolved inside the container. It also gets
`--security-opt no-new-privileges`, every capability dropped, `--rm`, a name (the attempt's
folder's: the task's tag, attempt and a random part) and labels with the task id and the pool,
by which a restarted server finds it again.

Podman and Docker agree on every option used here (docs.podman.io podman-run(1), Docker's
`docker run` reference) but two: GPUs (podman names CDI devices, `--device nvidia.com/gpu=N`;
Docker its NVIDIA hook, `--gpus device=N`) and walltime (podman's `--timeout N` kills the
container after N seconds, from podman 4.0; Docker has none, so this driver stops it).
A container sees only the GPUs it was given, numbered from 0, so the runner is told 0..n-1.
"""

from __future__ import annotations

import asyncio
import grp
import json
import os
import pwd
import shutil
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from broker.domain import Pool, Task, TaskState
from broker.errors import KliqueError, NotPermitted, SubmitError, SubmitUnknown
from broker.execution import Observation, Submission
from broker.pools import kube_pod
from broker.pools.base import Context, PoolDriver
from broker.pools.docker_args import check_image
from broker.pools.host import SYSTEM_PATH, HostDriver, HostSettings
from broker.pools.settings import settings_as

RUNNER_PATH = f"{kube_pod.RUNNER_MOUNT}/{kube_pod.RUNNER_FILE}"
LABEL_TASK = kube_pod.LABEL_TASK
LABEL_POOL = kube_pod.LABEL_POOL
_COMMAND_TIMEOUT_S = 120.0

JOB_FOLDER = "job"  # the job folder, inside the attempt's folder that the container mounts


class CommandTimeout(KliqueError):
    """A runtime command that did not answer in time: what it did is unknown."""


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


def run_argv(run: ContainerRun) -> list[str]:
    """`podman run` (or `docker run`) for one task, detached: it returns once started."""
    if run.uid == 0 or run.gid == 0:
        raise NotPermitted(f"task {run.task_id}: Klique never runs a container as root")
    argv = [run.binary, "run", "--detach", "--rm", "--pull=never", f"--name={run.name}"]
    argv += [f"--label={LABEL_TASK}={run.task_id}", f"--label={LABEL_POOL}={run.pool}"]
    argv += [f"--user={run.uid}:{run.gid}", "--security-opt=no-new-privileges", "--cap-drop=all"]
    mount = mount_folder(run.job_dir)
    argv += [f"--volume={run.runner}:{RUNNER_PATH}:ro", f"--volume={mount}:{mount}"]
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


def stop_argv(binary: str, name: str, grace_s: int) -> list[str]:
    """SIGTERM (the runner forwards it to the task), SIGKILL after grace_s seconds."""
    return [binary, "stop", f"--time={grace_s}", name]


def image_of(task: Task, default: str | None = None) -> str:
    """The task's image, else the pool's: a checked registry reference."""
    where = f"task {task.id} on a host pool in docker mode"
    if not task.spec.image and not default:
        raise SubmitError(
            f"{where} has no image: its runner runs inside the task's image; fix: submit it "
            "with an image (`klique submit --image REFERENCE`), give the pool an `image`, or "
            "send it to a pool in venv mode"
        )
    if not task.spec.image:
        return str(default)
    try:
        return check_image(task.spec.image, where)
    except ValueError as exc:
        raise SubmitError(str(exc)) from exc


def container_name(task: Task) -> str:
    """The attempt's folder's name (klique-<task>-<attempt>-<random>): the attempt's own."""
    return mount_folder(str(task.job_dir)).rsplit("/", 1)[-1]


def mount_folder(job_dir: str) -> str:
    """The folder a task's container mounts: the one that holds its job folder."""
    return job_dir.rstrip("/").rsplit("/", 1)[0]


def make_mount_folder(path: str, gid: int) -> None:
    """Make the attempt's folder, new, in the job root (a sticky folder: mkdir never follows a
    link and fails on any name that exists). Run as root (podman as root resolves the mount's
    path), it is root's with the account's private group, mode 1770: the account makes its job
    folder inside, and cannot rename, remove or replace the folder itself. Otherwise it is the
    server's own account's, which is the account that runs the task."""
    parent, name = os.path.split(path)
    parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.mkdir(name, 0o700, dir_fd=parent_fd)
        if os.geteuid() != 0:
            return
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent_fd)
        try:
            os.fchown(fd, 0, gid)
            os.fchmod(fd, 0o1770)
        finally:
            os.close(fd)
    finally:
        os.close(parent_fd)


def private_group_problem(account: str, gid: int) -> str | None:
    """The account's primary group must be its own (a user private group): its members may
    write in the folder the container mounts."""
    try:
        group = grp.getgrgid(gid)
    except KeyError:
        return f"account {account!r} has primary group {gid}, which does not exist"
    if group.gr_name != account or set(group.gr_mem) - {account}:
        return (
            f"account {account!r} has primary group {group.gr_name!r}, which is not its own "
            "private group"
        )
    return None


def host_driver(pool: Pool, context: Context) -> HostDriver:
    """A host pool's driver (its kind's, in broker/pools/host.py): in docker mode each task's
    runner runs in a container of its image, else as a process."""
    docker = settings_as(pool, HostSettings).mode == "docker"
    return (DockerHostDriver if docker else HostDriver)(pool, context)


class DockerHostDriver(HostDriver):
    """A host pool whose tasks each run in a container of their image."""

    def __init__(self, pool: Pool, context: Context) -> None:
        super().__init__(pool, context)
        settings = self.settings
        self.runtime = settings.runtime
        self.binary = shutil.which(self.runtime, path=SYSTEM_PATH + ":/usr/sbin") or self.runtime
        self.python = settings.python or "python3"  # the image's interpreter
        self.image = settings.image or None  # for tasks that name none
        self.grace_s = settings.stop_grace
        self.gpu_kind = settings.gpu_device
        self.run_args = tuple(settings.run_args)
        self.containers: set[str] = set()  # this pool's running containers, as last listed
        self._stopped: set[int] = set()  # tasks stopped at their walltime by this driver
        # When this driver asked for each task's container: podman's --timeout counts from the
        # container's start, later than this and earlier than the task's recorded times.
        self._launched: dict[int, float] = {}

    async def check(self) -> list[str]:
        problems = list(await PoolDriver.check(self))  # the job root; no host interpreter
        if not os.path.isfile(self.binary):
            problems.append(
                f"pool {self.pool.name} runs tasks in containers with {self.runtime}, which is "
                f"not installed on this host; fix: install it, or set the pool's mode to venv"
            )
        mode = os.stat(self.context.runner).st_mode
        if not mode & stat.S_IROTH:
            # The tasks' uids read it through its mount; it is no secret (every job folder on
            # the other pools holds a copy).
            os.chmod(self.context.runner, mode | stat.S_IROTH)
        self.problems = problems
        return problems

    async def python_problem(self, account: str) -> str | None:
        return None  # the image's interpreter: a container that cannot start it fails to start

    def new_job_dir(self, task: Task) -> str:
        """The job folder, inside the attempt's folder that the container mounts."""
        return f"{super().new_job_dir(task)}/{JOB_FOLDER}"

    def uv_setting(self) -> str | None:
        # A staged uv lives in a host folder the container does not see.
        found = PoolDriver.uv_setting(self)
        return None if found == "stage" else found

    def task_document(
        self, task: Task, report_token: str, gpus: Sequence[int] | None = None
    ) -> dict[str, Any]:
        document = super().task_document(task, report_token, gpus)
        document["image"] = None  # the runner runs in the image already
        document["runtime"] = None
        if gpus:  # the container sees its GPUs only, from 0
            document["gpus"] = list(range(len(gpus)))
        profile = self.context.estate.resources[task.resource].profile
        cap = kube_pod.memory_share_mb(
            profile.gpu_fraction, profile.gpu_memory_mb, self.pool.gpu_memory_mb
        )
        if cap is not None:
            document["gpu_memory_limit_mb"] = cap
        return document

    def container_run(self, task: Task, account: str) -> ContainerRun:
        entry = pwd.getpwnam(account)
        if entry.pw_uid == 0 or entry.pw_gid == 0:
            raise NotPermitted(
                f"pool {self.pool.name!r} maps {task.owner!r} to {account!r}, whose uid or gid "
                "is 0; Klique never runs a container as root; fix: map the user to an "
                "ordinary account in the pool's user_map"
            )
        problem = private_group_problem(account, entry.pw_gid)
        if problem and os.geteuid() == 0:
            raise NotPermitted(
                f"pool {self.pool.name} runs the containers of {task.owner} as {account}: "
                f"{problem}, and docker mode gives that group the folder the container mounts; "
                "fix: give the account a group of its own (useradd's default on Debian)"
            )
        profile = self.context.estate.resources[task.resource].profile
        return ContainerRun(
            runtime=self.runtime,
            binary=self.binary,
            name=container_name(task),
            task_id=task.id,
            pool=self.pool.name,
            image=image_of(task, self.image),
            python=self.python,
            job_dir=str(task.job_dir),
            runner=str(self.context.runner),
            uid=entry.pw_uid,
            gid=entry.pw_gid,
            walltime_s=profile.walltime_s,
            gpu_ids=tuple(task.gpu_ids),
            gpu_kind=self.gpu_kind,
            run_args=self.run_args,
        )

    async def submit(self, task: Task, report_token: str) -> Submission:
        account = self.account(task)
        run = self.container_run(task, account)
        document = self.task_document(task, report_token, task.gpu_ids)
        files = {"task.json": (json.dumps(document, indent=2).encode(), 0o600)}
        try:
            await asyncio.to_thread(make_mount_folder, mount_folder(run.job_dir), run.gid)
        except OSError as exc:
            raise SubmitError(
                f"cannot make the folder of task {task.id}'s container in {self.job_root}: "
                f"{exc}; fix: make the pool's job_root a folder of root's with mode 1777 "
                "(install -d -m 1777 PATH)"
            ) from exc
        await self.transport.write_files(run.job_dir, files, account=account)
        self._launched[task.id] = time.time()
        try:
            code, _, err = await self._command(run_argv(run))
        except CommandTimeout as exc:  # it may have started: the next look finds it by name
            raise SubmitUnknown(str(exc)) from exc
        if code != 0:
            raise SubmitError(f"{self.runtime} could not start the task's container: {err}")
        self.containers.add(run.name)
        return Submission(native_id=run.name, job_dir=run.job_dir)

    async def poll(self, tasks: Sequence[Task]) -> dict[int, Observation]:
        if any(t.job_dir for t in tasks):
            await self._list()
        return await super().poll(tasks)

    async def _list(self) -> None:
        code, out, err = await self._command(list_argv(self.binary, self.pool.name))
        if code != 0:
            raise KliqueError(f"{self.runtime} cannot list this pool's containers: {err}")
        self.containers = {line.strip() for line in out.splitlines() if line.strip()}

    def _alive(self, task: Task) -> bool:
        return bool(task.native_id) and str(task.native_id) in self.containers

    async def _adopt(self, task: Task, files: dict[str, bytes]) -> Observation:
        """After a crash between starting the container and recording it: find it by name."""
        name = container_name(task)
        if name in self.containers or "exit.json" in files:
            return Observation(TaskState.SUBMITTED, native_id=name, job_dir=task.job_dir)
        return Observation(TaskState.QUEUED, "its container never started; starting it again")

    async def _observe(self, task: Task, files: dict[str, bytes]) -> Observation | None:
        walltime = self.context.estate.resources[task.resource].profile.walltime_s
        started = self._launched.get(task.id) or task.submitted_at or task.started_at
        late = started is not None and time.time() - started >= walltime
        if late and self.runtime == "docker" and self._alive(task):
            self._stopped.add(task.id)  # Docker has no --timeout: stopped here, as a cancel
            await self.cancel(task)
        seen = await super()._observe(task, files)
        if seen is not None and seen.state.final:
            self._launched.pop(task.id, None)
        if seen is None or seen.state not in (TaskState.LOST, TaskState.FAILED):
            return seen
        stopped = task.id in self._stopped
        self._stopped.discard(task.id)
        if stopped or (seen.state is TaskState.LOST and late):
            return Observation(
                TaskState.TIMEOUT, f"ran past its walltime ({walltime} s); its container was ended"
            )
        if seen.state is TaskState.FAILED:
            return seen
        return Observation(
            TaskState.LOST,
            f"its container ended without the runner writing {task.job_dir}/exit.json",
        )

    async def cancel(self, task: Task) -> None:
        name = task.native_id or (container_name(task) if task.job_dir else None)
        if not name:
            return
        await self._command(stop_argv(self.binary, str(name), self.grace_s))
        # --rm removes a stopped container; this makes sure it is gone before cancel returns.
        await self._command([self.binary, "rm", "--force", str(name)])
        self.containers.discard(str(name))

    async def _command(self, argv: list[str]) -> tuple[int, str, str]:
        """A runtime command, run by the server (podman and Docker need root here); argv only,
        with a clean environment."""
        env = {"PATH": SYSTEM_PATH + ":/usr/sbin:/sbin", "HOME": str(self.context.home)}
        env.update({k: os.environ[k] for k in ("LANG", "CONTAINERS_CONF") if k in os.environ})
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
            )
        except OSError as exc:
            raise KliqueError(
                f"cannot run {argv[0]}: {exc}; fix: install {self.runtime} on this host"
            ) from exc
        try:
            out, err = await asyncio.wait_for(proc.communicate(), _COMMAND_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            what = " ".join(argv[:2])
            raise CommandTimeout(f"`{what}` took over {_COMMAND_TIMEOUT_S:.0f} s") from None
        words = err.decode(errors="replace").strip()
        return proc.returncode or 0, out.decode(errors="replace"), words
