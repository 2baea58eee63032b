"""What a docker-mode host pool's settings may say of its containers, checked before any of it
reaches podman or Docker: the run_args a site may add, the GPUs' CDI device kind, the image;
and the pure rules of each container's limits, mounts and end: its CPU and memory caps, the
user namespace of rootless podman, SELinux relabelling, and which containers the reaper removes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from broker.domain import Profile
from inside_job import imageref

# What a site may add to `run`: options that limit a container, each with the values it may
# take; nothing that mounts, adds privileges or devices, or changes the user.
RUN_ARGS: dict[str, re.Pattern[str]] = {
    "ulimit": re.compile(r"[a-z]+=-?[0-9]+(:-?[0-9]+)?"),
    "runtime": re.compile(r"/[A-Za-z0-9_./-]+|[a-z][a-z0-9_-]*"),
    "network": re.compile(r"none|host|bridge|slirp4netns|pasta|private"),
    "pids-limit": re.compile(r"-?[0-9]+"),
    "shm-size": re.compile(r"[0-9]+[bkmgBKMG]?"),
}
# Each task's own caps, from its compute resource's profile (`container_limits`): a pool-wide
# value would contradict them.
PER_TASK = {"memory", "memory-swap", "cpus"}
CDI_KIND = re.compile(r"[a-z0-9.-]+\.[a-z]+/[a-z0-9_.-]+")  # vendor.tld/class (the CDI spec)


def check_run_arg(arg: str) -> str:
    """One of the pool's run_args, as `--OPTION=VALUE` with an allowed option and value."""
    name, eq, value = arg.removeprefix("--").partition("=")
    if name in PER_TASK:
        raise ValueError(
            f"run_args: {arg!r} is set per task: each container gets its compute resource's "
            "cpus and memory as --cpus and --memory; fix: remove it, and size the profiles"
        )
    pattern = RUN_ARGS.get(name)
    if not arg.startswith("--") or not eq or pattern is None or not pattern.fullmatch(value):
        allowed = ", ".join(f"--{option}=..." for option in RUN_ARGS)
        raise ValueError(
            f"run_args: {arg!r} is not allowed; fix: use only {allowed} (one `--OPTION=VALUE` "
            "per item); mounts, devices, users and privileges are Klique's to set"
        )
    return arg


def check_image(image: str, where: str) -> str:
    """A registry reference in the runtime's store, without a docker:// scheme; ValueError
    naming `where` for anything else (an option, a path on the host)."""
    try:
        checked = imageref.check(image)
    except imageref.ImageError as exc:
        raise ValueError(f"{where}: {exc}") from exc
    if imageref.is_local(checked):
        raise ValueError(
            f"{where}: image {checked!r} is a path; podman and Docker run images from their "
            "store; fix: give a reference (`podman import` or `podman load` the image first)"
        )
    return checked.removeprefix("docker://")


# -- limits ----------------------------------------------------------------------------------

PODMAN_MIN_MEMORY_MB = 6  # podman and Docker refuse a memory limit under 6 MB


@dataclass(frozen=True)
class Limits:
    """A task's container caps: `--cpus` and `--memory` (with as much swap: none more)."""

    cpus: float
    memory_mb: int


def gpu_share_of_host(profile: Profile, host_gpus: int, one_gpu_mb: int) -> float | None:
    """The part of the host a share of one GPU stands for: the share over the pool's GPUs
    (None: whole GPUs, no GPU, or a memory-sized share on a pool whose GPU size is unknown)."""
    if host_gpus <= 0:
        return None
    if profile.gpu_fraction is not None:
        fraction = profile.gpu_fraction
    elif profile.gpu_memory_mb and one_gpu_mb:
        fraction = min(1.0, profile.gpu_memory_mb / one_gpu_mb)
    else:
        return None
    return fraction / host_gpus


def container_limits(
    profile: Profile, host_cpus: int, host_memory_mb: int, host_gpus: int, one_gpu_mb: int
) -> Limits:
    """A task's caps: its profile's `cpus` and `memory` (every profile has them). A share of a
    GPU is also held to that share of the host's part per GPU: a half of one of 2 GPUs gets at
    most a quarter of the host's CPUs and memory, so the tasks packed onto one GPU never take
    more of the host between them than a task of the whole GPU would."""
    cpus, memory_mb = float(profile.cpus), profile.memory_mb
    share = gpu_share_of_host(profile, host_gpus, one_gpu_mb)
    if share is not None:
        cpus = min(cpus, max(0.01, round(share * host_cpus, 2)))
        memory_mb = min(memory_mb, max(PODMAN_MIN_MEMORY_MB, int(share * host_memory_mb)))
    return Limits(cpus, memory_mb)


def limit_args(limits: Limits | None) -> list[str]:
    """`--cpus`, and `--memory` with `--memory-swap` equal to it: the runtime's default swap
    (twice the memory) would let a task page past its cap instead of meeting it."""
    if limits is None:
        return []
    memory = f"{limits.memory_mb}m"
    return [f"--cpus={limits.cpus:g}", f"--memory={memory}", f"--memory-swap={memory}"]


# -- user namespace and SELinux ----------------------------------------------------------------

SELINUX_ENFORCE = "/sys/fs/selinux/enforce"  # "1" where SELinux enforces (selinuxfs)


def rootless_answer(info: str) -> bool | None:
    """`podman info --format {{.Host.Security.Rootless}}`'s answer (None: not understood)."""
    return {"true": True, "false": False}.get(info.strip().lower())


def userns_args(runtime: str, rootless: bool) -> list[str]:
    """Rootless podman maps the server's account to root inside the container; keep-id maps it
    to its own uid instead, so the files the task writes in its job folder stay the account's.
    Root podman and Docker keep their default (the --user given is the host's uid)."""
    return ["--userns=keep-id"] if runtime == "podman" and rootless else []


def volume(source: str, target: str, *, read_only: bool, relabel: str | None) -> str:
    """One bind mount; `relabel` is SELinux's `z` (shared between containers) or `Z` (private
    to this one), which podman applies to the source before mounting it."""
    options = [o for o in ("ro" if read_only else None, relabel) if o]
    return f"--volume={source}:{target}" + (f":{','.join(options)}" if options else "")


# -- the reaper ----------------------------------------------------------------------------------


@dataclass
class Reaper:
    """Which of a pool's containers to remove: those labelled with the pool and this
    installation whose task Klique no longer follows (ended, or unknown after a restart),
    once they have been seen so for `after_s`. The age counts from the first sighting, so a
    container started a moment ago (its task not yet recorded) is never taken."""

    after_s: float
    first_seen: dict[str, float] = field(default_factory=dict)

    def due(
        self, listed: Mapping[str, int | None], followed: Iterable[int], now: float
    ) -> list[str]:
        """`listed`: container name -> its task label (None: none readable); `followed`: the
        ids of the pool's tasks Klique holds. Forgets what is gone or followed again."""
        known = set(followed)
        orphans = {name for name, task_id in listed.items() if task_id not in known}
        self.first_seen = {n: self.first_seen.get(n, now) for n in orphans}
        return sorted(n for n, seen in self.first_seen.items() if now - seen >= self.after_s)


def task_label(text: str) -> int | None:
    """A container's task label as listed ('' when it has none)."""
    text = text.strip()
    return int(text) if text.isdigit() else None
