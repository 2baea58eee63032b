"""`srun` with Pyxis's container flags (Pyxis 0.8+): the step's command runs in an enroot
container made from --container-image.

Follows Pyxis's README (`srun --help` flags) and source: args.c (flag names and defaults),
pyxis_slurmstepd.c (import, an unnamed container removed after the task, the enroot start
configuration whose hooks() writes `exec "$@"` to /etc/rc.local unless --container-entrypoint,
the job's environment given to enroot, so its NVIDIA_* and ENROOT_* settings apply, and the
task's environment: the job's variables, with the image's values taking precedence).
Images are imported and unpacked by the enroot simulator (tests/fakes/_containersim/enroot.py).

Without container flags, and for the step itself, the real srun runs (`KLIQUE_SIM_SRUN`) when
inside a Slurm job: the container part then runs inside a real Slurm step. Otherwise the step
runs here, as a one-task step on this node.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

from _containersim import chrun, enroot, images
from _containersim.images import SimError

STEP_FLAG = "--klique-sim-pyxis-step="
_VALUED = {
    "-n",
    "-N",
    "-c",
    "-p",
    "-t",
    "-J",
    "-o",
    "-e",
    "-w",
    "--ntasks",
    "--nodes",
    "--cpus-per-task",
    "--partition",
    "--time",
    "--job-name",
    "--output",
    "--error",
    "--gres",
    "--gpus",
    "--mem",
    "--export",
    "--chdir",
    "-D",
}


def main(args: list[str]) -> int:
    try:
        if args and args[0].startswith(STEP_FLAG):
            return step(json.loads(args[0][len(STEP_FLAG) :]), args[2:])
        container, srun_args, command = parse(args)
        real = os.environ.get("KLIQUE_SIM_SRUN")
        if not container:
            if not real:
                raise SimError("srun: error: no real srun (KLIQUE_SIM_SRUN) for a plain step")
            os.execv(real, [real, *args])
        if real and os.environ.get("SLURM_JOB_ID"):
            me = os.path.realpath(sys.argv[0])
            os.execv(
                real,
                [
                    real,
                    *srun_args,
                    sys.executable,
                    me,
                    STEP_FLAG + json.dumps(container),
                    "--",
                    *command,
                ],
            )
        return step(container, command)
    except SimError as exc:
        sys.stderr.write(exc.message + "\n")
        return exc.status


def parse(args: list[str]) -> tuple[dict, list[str], list[str]]:
    """(container flags, the other srun options, the command)."""
    container: dict = {"entrypoint": False, "mounts": [], "workdir": None, "image": None}
    others: list[str] = []
    while args and args[0].startswith("-"):
        arg, args = args[0], args[1:]
        if arg == "--":
            break
        flag, eq, value = arg.partition("=")
        if flag.startswith(("--container-", "--no-container-")):
            if (
                flag in ("--container-image", "--container-mounts", "--container-workdir")
                and not eq
            ):
                value, args = args[0], args[1:]
            if flag == "--container-image":
                container["image"] = value
            elif flag == "--container-mounts":
                for item in value.split(","):
                    fields = item.split(":")
                    container["mounts"].append(
                        (fields[0], fields[1] if len(fields) > 1 else fields[0])
                    )
            elif flag == "--container-workdir":
                container["workdir"] = value
            elif flag in ("--container-entrypoint", "--no-container-entrypoint"):
                container["entrypoint"] = flag == "--container-entrypoint"
            elif flag in ("--container-name", "--container-save"):
                raise SimError(f"pyxis: {flag} is not supported by the simulator")
            continue
        others.append(arg)
        if not eq and flag in _VALUED and args:
            others.append(args[0])
            args = args[1:]
    if not args:
        raise SimError("srun: fatal: No command given to execute.")
    return (container if container["image"] else {}), others, args


def step(container: dict, command: list[str]) -> int:
    image = container["image"]
    workdir = tempfile.mkdtemp(prefix="pyxis-")
    try:
        sqsh = image if image.startswith(("/", ".")) else _import(image, workdir)
        rootfs = os.path.join(workdir, "rootfs")
        images.unpack(sqsh, rootfs)
        if not container["entrypoint"]:
            with open(os.path.join(rootfs, "etc", "rc.local"), "w", encoding="utf-8") as f:
                f.write('exec "$@"\n')
        envfile = enroot._environment(rootfs, [])
        inner = dict(os.environ)  # the job's variables, the image's values first
        inner.update(line.split("=", 1) for line in envfile)
        argv = command
        if container["entrypoint"]:
            argv = ["/bin/sh", "/etc/rc", *command]
        cwd = container["workdir"] or "/"
        return chrun.run(rootfs, argv, inner, container["mounts"], cwd, enroot._gpus(envfile))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _import(image: str, workdir: str) -> str:
    sys.stderr.write(f"pyxis: importing docker image: {image}\n")
    output = os.path.join(workdir, "image.sqsh")
    status = enroot.main(["import", "--output", output, f"docker://{image}"])
    if status != 0:
        sys.stderr.write("pyxis: failed to import docker image\n")
        raise SimError(f"slurmstepd: error: pyxis: failed to import docker image {image}", 1)
    sys.stderr.write(f"pyxis: imported docker image: {image}\n")
    return output
