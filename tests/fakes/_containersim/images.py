"""The simulators' registry and image files.

Registry (`$KLIQUE_SIM_REGISTRY`): `<host>/<repository>/<tag or sha256-HEX>/` holding `rootfs/`
(a root file system) and `config.json` (an OCI image config: `{"config": {"Env": [...],
"Entrypoint": [...], "Cmd": [...], "WorkingDir": "..."}}`). Docker Hub is `registry-1.docker.io`
and a one-part repository is `library/<name>`, as enroot's src/docker.sh and Docker resolve it.

Image files (`.sif`, `.sqsh`) are SquashFS archives made with mksquashfs: enroot's `.sqsh` is
one (doc/image-format.md); a real SIF wraps one in a container format that is not reproduced.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tempfile

DOCKER_HUB = "registry-1.docker.io"


class SimError(Exception):
    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def registry_root() -> str:
    return os.environ.get("KLIQUE_SIM_REGISTRY", "/tmp/klique-sim/registry")


def lookup(registry: str, repository: str, tag: str, digest: str) -> str | None:
    """The registry folder of an image, or None when the registry has no such image."""
    host = registry or DOCKER_HUB
    if host == DOCKER_HUB and "/" not in repository:
        repository = f"library/{repository}"
    leaf = "sha256-" + digest.split(":", 1)[1] if digest else (tag or "latest")
    path = os.path.join(registry_root(), host, repository, leaf)
    return path if os.path.isfile(os.path.join(path, "config.json")) else None


def load_config(image_dir: str) -> dict:
    with open(os.path.join(image_dir, "config.json"), encoding="utf-8") as f:
        return json.load(f).get("config", {})


def pack(rootfs: str, output: str) -> None:
    """mksquashfs rootfs into output (written under a temporary name, then renamed)."""
    partial = output + ".partial"
    result = subprocess.run(
        # Uncompressed: quick to make and read in tests; the format is the same.
        ["mksquashfs", rootfs, partial, "-noappend", "-quiet", "-all-root", "-noI", "-noD", "-noF"],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise SimError(f"mksquashfs failed: {result.stderr.strip()}")
    os.replace(partial, output)


def unpack(image: str, dest: str) -> None:
    """unsquashfs image into dest (which must not exist)."""
    if not os.path.isfile(image):
        raise SimError(f"No such file or directory: {image}")
    result = subprocess.run(
        ["unsquashfs", "-no-xattrs", "-quiet", "-d", dest, image],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise SimError(f"Failed to extract {image}: {result.stderr.strip()}")


def staged_copy(image_dir: str) -> str:
    """A writable copy of an image's rootfs, in a temporary folder the caller removes."""
    tmp = tempfile.mkdtemp(prefix="klique-sim-image-")
    rootfs = os.path.join(tmp, "rootfs")
    shutil.copytree(os.path.join(image_dir, "rootfs"), rootfs, symlinks=True)
    return rootfs


def enroot_metadata(rootfs: str, config: dict, uri: str) -> None:
    """What enroot's `docker::configure` (src/docker.sh) writes: /etc/environment from Env, and
    /etc/rc that sources /etc/rc.local, then execs the entrypoint with the command."""
    etc = os.path.join(rootfs, "etc")
    os.makedirs(etc, exist_ok=True)
    with open(os.path.join(etc, "environment"), "w", encoding="utf-8") as f:
        f.writelines(f"{line}\n" for line in config.get("Env") or [])
    entrypoint = " ".join(shlex.quote(a) for a in config.get("Entrypoint") or [])
    cmd = config.get("Cmd") or ([] if config.get("Entrypoint") else ["/bin/sh"])
    workdir = config.get("WorkingDir") or "/"
    rc = (
        f"# enroot-provenance: {uri}\n\n"
        f'mkdir -p "{workdir}" 2> /dev/null\n'
        f'cd "{workdir}" && unset OLDPWD || exit 1\n\n'
        "if [ -s /etc/rc.local ]; then\n    . /etc/rc.local\nfi\n\n"
        "if [ $# -gt 0 ]; then\n"
        f'    exec {entrypoint} "$@"\n'
        "else\n"
        f"    exec {entrypoint} {' '.join(shlex.quote(a) for a in cmd)}\n"
        "fi\n"
    )
    with open(os.path.join(etc, "rc"), "w", encoding="utf-8") as f:
        f.write(rc)
    with open(os.path.join(etc, "rc.local"), "w", encoding="utf-8") as f:
        f.write("# This file is sourced by /etc/rc when the container starts.\n")


def apptainer_metadata(rootfs: str, config: dict) -> None:
    """What `apptainer build` from a Docker source writes (user guide, "Environment and
    Metadata"): /.singularity.d/env/90-environment.sh exporting the image's Env, and a runscript
    that runs the entrypoint and command."""
    env_dir = os.path.join(rootfs, ".singularity.d", "env")
    os.makedirs(env_dir, exist_ok=True)
    lines = ["#!/bin/sh"]
    for item in config.get("Env") or []:
        name, _, value = item.partition("=")
        lines.append(f"export {name}={shlex.quote(value)}")
    with open(os.path.join(env_dir, "90-environment.sh"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    run = [*(config.get("Entrypoint") or []), *(config.get("Cmd") or [])]
    with open(os.path.join(rootfs, ".singularity.d", "runscript"), "w", encoding="utf-8") as f:
        f.write("#!/bin/sh\nexec " + " ".join(shlex.quote(a) for a in run) + ' "$@"\n')
