"""What a docker-mode host pool's settings may say of its containers, checked before any of it
reaches podman or Docker: the run_args a site may add, the GPUs' CDI device kind, the image."""

from __future__ import annotations

import re

from inside_job import imageref

# What a site may add to `run`: options that limit a container, each with the values it may
# take; nothing that mounts, adds privileges or devices, or changes the user.
RUN_ARGS: dict[str, re.Pattern[str]] = {
    "ulimit": re.compile(r"[a-z]+=-?[0-9]+(:-?[0-9]+)?"),
    "runtime": re.compile(r"/[A-Za-z0-9_./-]+|[a-z][a-z0-9_-]*"),
    "network": re.compile(r"none|host|bridge|slirp4netns|pasta|private"),
    "pids-limit": re.compile(r"-?[0-9]+"),
    "shm-size": re.compile(r"[0-9]+[bkmgBKMG]?"),
    "memory": re.compile(r"[0-9]+[bkmgBKMG]?"),
    "cpus": re.compile(r"[0-9]+(\.[0-9]+)?"),
}
CDI_KIND = re.compile(r"[a-z0-9.-]+\.[a-z]+/[a-z0-9_.-]+")  # vendor.tld/class (the CDI spec)


def check_run_arg(arg: str) -> str:
    """One of the pool's run_args, as `--OPTION=VALUE` with an allowed option and value."""
    name, eq, value = arg.removeprefix("--").partition("=")
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
