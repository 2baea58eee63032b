"""Docker mode of a host pool (`mode: docker`): each task's runner runs inside the task's image,
in a container that podman (or Docker) starts with the uid and gid of the task's mapped account.

The container's argv is built without I/O (broker/pools/docker_argv.py), from validated values: the
checked image reference, numbers, the job folder Klique chose and the pool's checked
`run_args`. The container gets two mounts, the runner zipapp (read-only) and the attempt's
folder, which holds the job folder (both at their own paths, so task.json's paths hold inside).
The server makes the attempt's folder, fresh, in the sticky job root; run as root it is root's
(see `make_mount_folder`), so the account cannot swap the path podman resolves as root for a
link elsewhere: what the account does inside it is resolved inside the container. It also gets
`--security-opt no-new-privileges`, every capability dropped, a name (the attempt's folder's:
the task's tag, attempt and a random part) and labels with the task id, the pool and the
installation, by which a restarted server finds it again and the reaper knows it for its own.

Limits: `--cpus` and `--memory` (`docker_args.container_limits`: the profile's, a GPU share held
to its part of the host), no swap past the memory. Rootless podman adds `--userns=keep-id`;
where SELinux enforces, the mounts are relabelled (`:Z` private for the attempt's folder, `:z`
shared for the runner every container mounts). A container is not started with `--rm`: once
its task has ended the driver reads `State.OOMKilled` (an end at the memory cap reads "out of
memory"), then removes it; the reaper removes those whose task ended while no driver watched.

Podman and Docker agree on every option used here (docs.podman.io podman-run(1), Docker's
`docker run` reference) but two: GPUs (podman names CDI devices, `--device nvidia.com/gpu=N`;
Docker its NVIDIA hook, `--gpus device=N`) and walltime (podman's `--timeout N` kills the
container after N seconds, from podman 4.0; Docker has none, so this driver stops it).
A container sees only the GPUs it was given, numbered from 0, so the runner is told 0..n-1.
"""

from __future__ import annotations

import asyncio
import functools
import grp
import json
import logging
import os
import pwd
import shutil
import stat
import time
from collections.abc import Sequence
from typing import Any

from broker.domain import Pool, Task, TaskState
from broker.errors import KliqueError, NotPermitted, SubmitError, SubmitUnknown
from broker.execution import Observation, Submission
from broker.pools import kube_pod
from broker.pools.base import Context, PoolDriver
from broker.pools.docker_args import (
    SELINUX_ENFORCE,
    Limits,
    Reaper,
    check_image,
    container_limits,
    rootless_answer,
    task_label,
)
from broker.pools.docker_argv import (
    ContainerRun,
    container_name,
    inspect_argv,
    list_argv,
    mount_folder,
    owned_argv,
    parse_owned,
    run_argv,
    stop_argv,
)
from broker.pools.host import SYSTEM_PATH, HostDriver, HostSettings
from broker.pools.kube_settings import installation_id
from broker.pools.settings import settings_as
from inside_job.oom import OOM_REASON

_COMMAND_TIMEOUT_S = 120.0
REAP_EVERY_S = 30.0  # the reaper's sweep: at most this often, and never more than reap_after
OUT_OF_MEMORY = "out of memory"

log = logging.getLogger("klique.pools")

JOB_FOLDER = "job"  # the job folder, inside the attempt's folder that the container mounts


class CommandTimeout(KliqueError):
    """A runtime command that did not answer in time: what it did is unknown."""


def out_of_memory(limits: Limits | None, exit_code: int | None) -> Observation:
    """A task whose container met its memory cap: its state reason says so, and the fix."""
    cap = f" of {limits.memory_mb} MiB" if limits else ""
    return Observation(
        TaskState.FAILED,
        f"{OUT_OF_MEMORY}: the task passed its container's memory cap{cap} (its compute "
        "resource's memory) and the kernel killed it; fix: ask for a compute resource with "
        "more memory, or use less",
        exit_code if exit_code is not None else 137,
    )


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
        self.rootless = bool(settings.rootless)  # asked of podman at check() where unset
        self.relabel = bool(settings.selinux_relabel)  # read from selinuxfs where unset
        self.reaper = Reaper(float(settings.reap_after))
        self._swept_at = 0.0  # when the reaper last listed the pool's containers (monotonic)
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
        else:
            await self._detect_host()
        mode = os.stat(self.context.runner).st_mode
        if not mode & stat.S_IROTH:
            # The tasks' uids read it through its mount; it is no secret (every job folder on
            # the other pools holds a copy).
            os.chmod(self.context.runner, mode | stat.S_IROTH)
        self.problems = problems
        return problems

    @functools.cached_property
    def installation(self) -> str:
        """The installation id in every container's labels: made once in the server's home
        (as a Kubernetes pool's), on first use, so that a driver built to check an estate
        writes nothing."""
        return installation_id(self.context.home, None)

    async def _detect_host(self) -> None:
        """What the pool's settings leave unset: whether podman runs rootless (`podman info`),
        and whether SELinux enforces (selinuxfs)."""
        if self.settings.rootless is None and self.runtime == "podman":
            argv = [self.binary, "info", "--format={{.Host.Security.Rootless}}"]
            try:
                code, out, _ = await self._command(argv)
            except KliqueError as exc:  # podman that does not answer cannot start tasks either
                code, out = 1, str(exc)
            self.rootless = code == 0 and bool(rootless_answer(out))
            if code != 0:
                self.notes.append(
                    f"pool {self.pool.name}: `podman info` did not say whether podman is "
                    "rootless; taken as root podman (set the pool's `rootless` to say)"
                )
        if self.settings.selinux_relabel is None:
            try:
                with open(SELINUX_ENFORCE, encoding="ascii") as f:
                    self.relabel = f.read().strip() == "1"
            except OSError:  # no selinuxfs: SELinux is off
                self.relabel = False

    def limits(self, task: Task) -> Limits:
        """The task's container caps, from its profile and this host's size."""
        profile = self.context.estate.resources[task.resource].profile
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        host_memory_mb = pages // 2**20
        return container_limits(
            profile, os.cpu_count() or 1, host_memory_mb, self.pool.gpus, self.pool.gpu_memory_mb
        )

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
            limits=self.limits(task),
            keep_id=self.rootless,
            relabel=self.relabel,
            installation=self.installation,
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
        news = await super().poll(tasks)
        await self._sweep([t.id for t in tasks])
        return news

    async def _sweep(self, followed: Sequence[int]) -> None:
        """The reaper, on the agent's cycle (at most every REAP_EVERY_S): remove the containers
        of this pool and installation whose task Klique no longer follows, once seen so for
        reap_after (a task that has just started is followed, or too young to be taken)."""
        now = time.monotonic()
        if now - self._swept_at < min(REAP_EVERY_S, self.reaper.after_s):
            return
        self._swept_at = now
        argv = owned_argv(self.runtime, self.binary, self.pool.name, self.installation)
        try:
            code, out, err = await self._command(argv)
        except KliqueError as exc:  # the poll's news stand; the next sweep tries again
            code, out, err = 1, "", str(exc)
        if code != 0:
            log.warning("pool %s: the reaper cannot list containers: %s", self.pool.name, err)
            return
        for name in self.reaper.due(parse_owned(out), followed, now):
            log.info(
                "pool %s: removing container %s: its task has ended or is not Klique's",
                self.pool.name,
                name,
                extra={"pool": self.pool.name},
            )
            await self._command([self.binary, "rm", "--force", name])
            self.containers.discard(name)

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
            seen = await self._ended(task, seen)
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

    async def _ended(self, task: Task, seen: Observation) -> Observation:
        """The container of an ended task: read whether the OOM killer ended it (podman's
        State.OOMKilled, or the runner's word that its task met the cgroup's cap), then
        remove it. A task the driver stopped keeps its own end."""
        name = str(task.native_id or container_name(task))
        code, out, _ = await self._command(inspect_argv(self.binary, name))
        killed, _, exit_code = out.strip().partition(" ")
        await self._command([self.binary, "rm", "--force", name])
        self.containers.discard(name)
        if seen.state is TaskState.COMPLETED or task.id in self._stopped:
            return seen
        said_so = seen.reason.startswith(OOM_REASON)  # the runner read its cgroup
        if (code == 0 and killed == "true") or said_so:
            number = seen.exit_code if seen.exit_code is not None else task_label(exit_code)
            return out_of_memory(self.limits(task), number)
        return seen

    async def cancel(self, task: Task) -> None:
        name = task.native_id or (container_name(task) if task.job_dir else None)
        if not name:
            return
        await self._command(stop_argv(self.binary, str(name), self.grace_s))
        # Gone before cancel returns: nothing is left to read of a cancelled task's container.
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
